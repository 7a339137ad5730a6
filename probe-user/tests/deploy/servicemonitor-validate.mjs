// Validates each ServiceMonitor of a YAML file against the prometheus-operator CRD's schema
// (npm @kubernetes-models/prometheus-operator); argv: node_modules dir, file.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
const [modules, file] = process.argv.slice(2);
// The packages live outside the repository (`cargo xtask setup` installs them).
const resolve = createRequire(path.join(modules, 'x.js')).resolve;
const load = async (p) => import(pathToFileURL(p).href);
const { loadAll } = await load(resolve('js-yaml'));
const { ServiceMonitor } = await load(
  path.join(modules, '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/index.js'));
let n = 0;
for (const doc of loadAll(fs.readFileSync(file, 'utf8'))) {
  if (doc?.kind !== 'ServiceMonitor') continue;
  new ServiceMonitor(doc).validate();
  n++;
}
console.log(`${n} ServiceMonitor(s) valid`);
