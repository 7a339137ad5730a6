//! The Kubernetes deployment (deploy/kubernetes, issue 28) checked by the tools of the
//! projects whose formats it uses, each also shown a broken copy it must refuse (so a check
//! that passes anything fails here):
//!
//! * the DaemonSet, Namespace and Service against the Kubernetes API's schemas (PyPI
//!   `kubernetes-validate --strict`: unknown fields are errors);
//! * the ServiceMonitor against the prometheus-operator CRD's schema (npm
//!   `@kubernetes-models/prometheus-operator`);
//! * the plain scrape job with `promtool check config` (Debian `prometheus`);
//! * the Grafana dashboard against Grafana's own dashboard types (npm `@grafana/schema`,
//!   compiled by `tsc --strict`), and every panel's PromQL with `promtool check rules`.
//!
//! That the dashboard's metrics and labels are ones the agent really exports is checked
//! against a live agent's `/metrics` in tests/agent_fleet.rs. No root needed.

mod common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use common::{dashboard::dashboard_queries, repo_root};

fn deploy() -> PathBuf {
    repo_root().join("deploy/kubernetes")
}

/// Where `cargo xtask setup` installs the npm validators (or `$MEMSCOPE_DEPLOY_VALIDATORS`).
fn node_modules() -> PathBuf {
    let dir = std::env::var_os("MEMSCOPE_DEPLOY_VALIDATORS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/memscope-bpf/deploy-validators")
        })
        .join("node_modules");
    assert!(
        dir.join("@grafana/schema").is_dir()
            && dir.join("@kubernetes-models/prometheus-operator").is_dir(),
        "the npm validators are not in {} (`cargo xtask setup` installs them)",
        dir.display()
    );
    dir
}

fn run(cmd: &mut Command, what: &str) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("run {what} (`cargo xtask setup` installs it): {e}"))
}

fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn scratch_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// `file` with `from` replaced by `to` (which must be there), as a file in `dir`.
fn broken_copy(file: &Path, dir: &Path, from: &str, to: &str) -> PathBuf {
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.contains(from), "{from:?} not in {}", file.display());
    let name = file.file_name().unwrap().to_str().unwrap();
    scratch_file(dir, &format!("broken-{name}"), &text.replacen(from, to, 1))
}

fn kubernetes_validate(files: &[&Path]) -> Output {
    run(
        Command::new("kubernetes-validate")
            .arg("--strict")
            .args(files),
        "kubernetes-validate (PyPI kubernetes-validate)",
    )
}

#[test]
fn the_daemonset_and_service_pass_the_kubernetes_api_schemas() {
    let dir = common::scratch("deploy-k8s");
    let daemonset = deploy().join("daemonset.yaml");
    let monitor = deploy().join("servicemonitor.yaml");
    let out = kubernetes_validate(&[&daemonset, &monitor]);
    let text = said(&out);
    assert!(out.status.success(), "kubernetes-validate: {text}");
    for resource in [
        "namespace/memscope-bpf",
        "daemonset/memscope-bpf-agent",
        "service/memscope-bpf-agent",
    ] {
        assert!(
            text.contains(&format!("passed for resource {resource}")),
            "{resource} not validated:\n{text}"
        );
    }
    assert!(!text.contains("ERROR"), "{text}");
    // A misspelt field (Kubernetes would drop it silently: the pod would see the node's
    // processes by no pid) is refused.
    let broken = broken_copy(&daemonset, &dir, "hostPID: true", "hostPid: true");
    let out = kubernetes_validate(&[&broken]);
    assert!(
        !out.status.success(),
        "kubernetes-validate took hostPid:\n{}",
        said(&out)
    );
}

/// What the DaemonSet must give the agent, read from the manifest as data (PyYAML, which
/// kubernetes-validate brings): host PID namespace, privileges, and the host's tracefs,
/// debugfs and BTF.
#[test]
fn the_daemonset_gives_the_agent_host_pids_privileges_and_kernel_mounts() {
    let out = run(
        Command::new("python3")
            .arg("-c")
            .arg(
                "import json, sys, yaml\n\
                 print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
            )
            .arg(deploy().join("daemonset.yaml")),
        "python3 with PyYAML",
    );
    assert!(out.status.success(), "{}", said(&out));
    let docs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ds = docs
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    let agent = &pod["containers"][0];
    assert_eq!(agent["securityContext"]["privileged"], true);
    assert_eq!(agent["args"][0], "agent");
    assert!(
        agent["args"].as_array().unwrap().iter().any(|a| a
            .as_str()
            .is_some_and(|a| a.starts_with("--listen=0.0.0.0:"))),
        "Prometheus reaches the pod by its IP"
    );
    let host_path = |mount: &str| -> String {
        let m = agent["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == mount)
            .unwrap_or_else(|| panic!("no mount at {mount}"));
        let v = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap();
        v["hostPath"]["path"].as_str().unwrap_or("").to_string()
    };
    // bpffs: the registry of holds shared with the node's other tracers (docs/agent.md).
    for m in [
        "/sys/kernel/tracing",
        "/sys/kernel/debug",
        "/sys/kernel/btf",
        "/sys/fs/bpf",
    ] {
        assert_eq!(host_path(m), m, "the host's {m}");
    }
    assert!(
        !agent["args"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--no-hold"),
        "the agent holds new jobs at their vendor library's open (its default)"
    );
    let annotations = &ds["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(
        annotations["prometheus.io/port"],
        agent["ports"][0]["containerPort"].to_string()
    );
}

#[test]
fn the_service_monitor_passes_the_prometheus_operator_crd_schema() {
    let dir = common::scratch("deploy-servicemonitor");
    let modules = node_modules();
    let script = repo_root().join("probe-user/tests/deploy/servicemonitor-validate.mjs");
    let check = |file: &Path| {
        run(
            Command::new("node").arg(&script).arg(&modules).arg(file),
            "node (Debian nodejs)",
        )
    };
    let monitor = deploy().join("servicemonitor.yaml");
    let out = check(&monitor);
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "1 ServiceMonitor(s) valid"
    );
    let broken = broken_copy(&monitor, &dir, "honorLabels: true", "honorLabels: \"yes\"");
    let out = check(&broken);
    assert!(
        !out.status.success() && said(&out).contains("honorLabels"),
        "a string honorLabels passed:\n{}",
        said(&out)
    );
}

/// Debian's promtool is built without Kubernetes service discovery, so the job is checked
/// with its `kubernetes_sd_configs` block in static form; the relabelling, which is what can
/// go wrong, is checked as written.
#[test]
fn the_scrape_job_passes_promtool_check_config() {
    let dir = common::scratch("deploy-scrape");
    let text = std::fs::read_to_string(deploy().join("prometheus-scrape.yml")).unwrap();
    let sd = "    kubernetes_sd_configs:\n      - role: pod\n        namespaces:\n          names: [memscope-bpf]\n";
    assert!(text.contains(sd), "the pod discovery block changed");
    let statics = "    static_configs:\n      - targets: [\"127.0.0.1:9464\"]\n";
    let check = |text: &str, name: &str| {
        let f = scratch_file(&dir, name, text);
        run(
            Command::new("promtool").args(["check", "config"]).arg(f),
            "promtool (Debian prometheus)",
        )
    };
    let out = check(&text.replace(sd, statics), "prometheus.yml");
    assert!(out.status.success(), "{}", said(&out));
    let broken = text
        .replace(sd, statics)
        .replace("([^:]+)(?::", "([^:]+(?::");
    let out = check(&broken, "broken.yml");
    assert!(!out.status.success(), "a bad regex passed:\n{}", said(&out));
}

fn tsc_check(modules: &Path, dir: &Path, dashboard_json: &str) -> Output {
    let ts = format!(
        "import type {{ Dashboard }} from '@grafana/schema';\n\
         export const dashboard: Dashboard = {dashboard_json};\n"
    );
    scratch_file(dir, "dashboard.ts", &ts);
    let types = modules.join("@grafana/schema/dist/types/index.d.ts");
    let config = serde_json::json!({
        "compilerOptions": {
            "strict": true, "noEmit": true, "skipLibCheck": true,
            "module": "nodenext", "moduleResolution": "nodenext", "target": "es2022",
            "typeRoots": [], "baseUrl": ".",
            "paths": { "@grafana/schema": [types] }
        },
        "files": ["dashboard.ts"]
    });
    scratch_file(dir, "tsconfig.json", &config.to_string());
    run(
        Command::new("node")
            .arg(modules.join("typescript/bin/tsc"))
            .arg("-p")
            .arg(dir.join("tsconfig.json")),
        "tsc (npm typescript)",
    )
}

#[test]
fn the_dashboard_passes_grafanas_schema_and_its_queries_parse() {
    let dir = common::scratch("deploy-dashboard");
    let modules = node_modules();
    let json = std::fs::read_to_string(deploy().join("grafana-dashboard.json")).unwrap();
    let out = tsc_check(&modules, &dir, &json);
    assert!(
        out.status.success(),
        "the dashboard is no Grafana Dashboard:\n{}",
        said(&out)
    );
    // A field Grafana does not know, and a grid height as text, are refused.
    for (from, to, error) in [
        (
            "\"h\": 8,",
            "\"h\": 8, \"heigth\": 8,",
            "'\"heigth\"' does not exist",
        ),
        (
            "\"h\": 8,",
            "\"h\": \"8\",",
            "not assignable to type 'number'",
        ),
    ] {
        let out = tsc_check(&modules, &dir, &json.replacen(from, to, 1));
        let text = said(&out);
        assert!(
            !out.status.success() && text.contains(error),
            "{to}: {text}"
        );
    }

    // Each query as a recording rule: promtool parses its PromQL.
    let queries = dashboard_queries();
    assert!(queries.len() >= 10, "{queries:?}");
    let mut rules = String::from("groups:\n  - name: memscope-dashboard\n    rules:\n");
    for (i, (_, q)) in queries.iter().enumerate() {
        rules.push_str(&format!(
            "      - record: memscope_dashboard:query{i}\n        expr: {}\n",
            serde_json::to_string(q).unwrap()
        ));
    }
    let check = |text: &str| {
        let f = scratch_file(&dir, "rules.yml", text);
        run(
            Command::new("promtool").args(["check", "rules"]).arg(f),
            "promtool (Debian prometheus)",
        )
    };
    let out = check(&rules);
    assert!(out.status.success(), "{}\n{rules}", said(&out));
    assert!(
        said(&out).contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{}",
        said(&out)
    );
    let out = check(&rules.replacen("sum by (", "sum by ((", 1));
    assert!(!out.status.success(), "bad PromQL passed");
}
