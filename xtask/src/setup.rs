//! `cargo xtask setup`: makes a fresh machine ready to build and test.
//!
//! Idempotent; on a ready machine every step is a quick check.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::cmd;

const TAG: &str = "[setup]";
const BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Default)]
pub struct Options {
    /// Reinstall bpf-linker even if a working one is found.
    pub force_bpf_linker: bool,
    /// Install bpf-linker under this root (`cargo install --root`) instead of `$CARGO_HOME`.
    pub bpf_linker_root: Option<PathBuf>,
    /// Also prepare `cargo xtask test-aarch64` (cross compilers, qemu, arm64 packages).
    pub aarch64: bool,
    /// What the command that runs setup needs.
    pub purpose: Purpose,
}

/// What a command needs prepared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Purpose {
    /// `setup`, `test`, `bench`: everything the tests use.
    #[default]
    Tests,
    /// `demo`: the tracer's build and the C fixtures (the demo workload); Chromium only to
    /// take a screenshot. Not the test tools, nor the torch test bed (~8 GB).
    Demo { screenshot: bool },
}

/// The steps of setup, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Nightly,
    RustSrc,
    BpfLinker,
    HostTools,
    Chromium,
    AgentTools,
    DeployValidators,
    Fixtures,
    TorchBed,
    CudaBed,
    PySpy,
    Btf,
}

/// The steps `purpose` needs.
fn plan(purpose: Purpose) -> Vec<Step> {
    use Step::*;
    let all = [
        Nightly,
        RustSrc,
        BpfLinker,
        HostTools,
        Chromium,
        AgentTools,
        DeployValidators,
        Fixtures,
        TorchBed,
        CudaBed,
        PySpy,
        Btf,
    ];
    let wanted = |s: &Step| match (purpose, s) {
        (Purpose::Tests, _) => true,
        (Purpose::Demo { screenshot }, Chromium) => screenshot,
        (Purpose::Demo { .. }, AgentTools | DeployValidators | TorchBed | CudaBed | PySpy) => false,
        (Purpose::Demo { .. }, _) => true,
    };
    all.into_iter().filter(wanted).collect()
}

/// What later commands need to know after setup.
#[derive(Default)]
pub struct Ready {
    /// A PATH to give child processes, set when the bpf-linker that works is not the
    /// first one on the current PATH (so aya-build finds the right one).
    path: Option<OsString>,
    pub is_root: bool,
}

impl Ready {
    /// Applies the environment that setup found necessary to `cmd`.
    pub fn apply(&self, cmd: &mut Command) {
        if let Some(path) = &self.path {
            cmd.env("PATH", path);
        }
    }
}

pub fn run(repo: &Path, opts: &Options) -> Result<Ready> {
    let start = Instant::now();
    let mut linker_dir = None;
    for s in plan(opts.purpose) {
        match s {
            Step::Nightly => step("nightly toolchain", nightly)?,
            Step::RustSrc => step("rust-src", rust_src)?,
            Step::BpfLinker => step("bpf-linker", || {
                let (detail, dir) = bpf_linker(opts)?;
                linker_dir = Some(dir);
                Ok(detail)
            })?,
            Step::HostTools => step("host tools", host_tools)?,
            Step::Chromium => step("chromium", chromium)?,
            Step::AgentTools => step("agent test tools", agent_tools)?,
            Step::DeployValidators => step("deploy validators", deploy_validators)?,
            Step::Fixtures => step("C fixtures", || fixtures(repo))?,
            Step::TorchBed if crate::torch_bed::enabled() => {
                step("torch test bed", || crate::torch_bed::prepare(repo))?
            }
            Step::TorchBed => println!(
                "{TAG} torch test bed: skipped (MEMSCOPE_TORCH_BED=off); its tests will say SKIPPED"
            ),
            Step::CudaBed if crate::cuda_bed::enabled() => {
                step("cuda test bed", || crate::cuda_bed::prepare(repo))?
            }
            Step::CudaBed => println!(
                "{TAG} cuda test bed: skipped (MEMSCOPE_CUDA_BED=off); its tests will say SKIPPED"
            ),
            Step::PySpy => step("py-spy", py_spy)?,
            Step::Btf => step("kernel BTF", btf)?,
        }
    }
    if let Purpose::Demo { .. } = opts.purpose {
        println!(
            "{TAG} for the demo: the test tools and the torch test bed are left out \
             (`cargo xtask setup` prepares them)"
        );
    }
    let is_root = crate::effective_uid() == Some(0);
    if is_root {
        println!("{TAG} root: ok");
    } else {
        println!(
            "{TAG} root: WARNING: not running as root (uid {}); the tracer's tests load BPF \
             programs and will be SKIPPED (loudly). Run as root for a real test run.",
            crate::effective_uid().map_or_else(|| "unknown".to_owned(), |u| u.to_string())
        );
    }

    let mut ready = Ready {
        path: None,
        is_root,
    };
    if let Some(dir) = linker_dir {
        let first_on_path = which("bpf-linker").and_then(|p| p.parent().map(Path::to_path_buf));
        if first_on_path.as_deref() != Some(dir.as_path()) {
            println!(
                "{TAG} note: putting {} first on PATH for the builds started here; \
                 add it to your shell's PATH as well",
                dir.display()
            );
            let old = std::env::var_os("PATH").unwrap_or_default();
            let dirs = std::iter::once(dir).chain(std::env::split_paths(&old));
            ready.path = Some(std::env::join_paths(dirs).context("building PATH")?);
        }
    }
    println!("{TAG} done in {:.1}s", start.elapsed().as_secs_f64());
    Ok(ready)
}

/// Runs one step and prints its one-line outcome.
fn step(name: &str, f: impl FnOnce() -> Result<String>) -> Result<()> {
    match f() {
        Ok(detail) => {
            println!("{TAG} {name}: ok ({detail})");
            Ok(())
        }
        Err(e) => {
            println!("{TAG} {name}: FAILED");
            Err(e.context(format!("setup step `{name}` failed")))
        }
    }
}

fn rustup() -> Command {
    Command::new("rustup")
}

fn nightly() -> Result<String> {
    // rustup (https://rustup.rs) manages the stable and nightly toolchains.
    let list = cmd::output(rustup().args(["toolchain", "list"]))?;
    // `nightly-<host>` is the undated nightly that `rustup run nightly` uses;
    // `nightly-2025-01-01-<host>` is a dated one and does not count.
    let installed = list.lines().any(|line| {
        let name = line.split_whitespace().next().unwrap_or("");
        name == "nightly"
            || name
                .strip_prefix("nightly-")
                .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()))
    });
    let how = if installed {
        "already installed"
    } else {
        println!("{TAG} nightly toolchain: not installed; installing it (a few minutes) ...");
        cmd::stream(rustup().args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))
        .context(
            "could not install the nightly toolchain; it is needed to build the BPF \
             program (-Z build-std=core --target bpfel-unknown-none)",
        )?;
        "installed now"
    };
    let version = cmd::output(rustup().args(["run", "nightly", "rustc", "--version"]))?;
    Ok(format!("{}, {how}", version.trim()))
}

fn rust_src() -> Result<String> {
    let installed =
        cmd::output(rustup().args(["component", "list", "--toolchain", "nightly", "--installed"]))?;
    if installed
        .lines()
        .any(|l| l.split_whitespace().next() == Some("rust-src"))
    {
        return Ok("already installed".to_owned());
    }
    println!("{TAG} rust-src: not installed; installing it ...");
    cmd::stream(rustup().args(["component", "add", "rust-src", "--toolchain", "nightly"]))
        .context("could not add rust-src to the nightly toolchain (needed for -Z build-std)")?;
    Ok("installed now".to_owned())
}

/// The shared LLVM library that nightly rustc uses.
struct Llvm {
    /// Full path of the library file in the nightly sysroot.
    file: PathBuf,
    /// Its file name, which is also its soname (what bpf-linker will record as NEEDED).
    name: String,
    major: u32,
}

fn nightly_llvm() -> Result<Llvm> {
    let sysroot = cmd::output(rustup().args(["run", "nightly", "rustc", "--print", "sysroot"]))?;
    let lib = Path::new(sysroot.trim()).join("lib");
    let entries = fs::read_dir(&lib).with_context(|| format!("reading {}", lib.display()))?;
    let mut found: Vec<(String, u32)> = Vec::new();
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        // Current layout: libLLVM.so.22.1-rust-1.97.0-nightly (the soname).
        // Older layout: libLLVM-19-rust-1.84.0-nightly.so.
        let version = name.strip_prefix("libLLVM.so.").or_else(|| {
            name.strip_prefix("libLLVM-")
                .filter(|_| name.ends_with(".so"))
        });
        let major = version.and_then(|v| {
            let digits: String = v.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u32>().ok()
        });
        if let Some(major) = major {
            found.push((name, major));
        }
    }
    // Prefer the soname form, the name the dynamic linker looks for.
    found.sort_by_key(|(name, _)| (name.starts_with("libLLVM.so."), name.clone()));
    let Some((name, major)) = found.pop() else {
        bail!(
            "no libLLVM.so.* in {}; the nightly toolchain looks incomplete \
             (try `rustup toolchain uninstall nightly` and run setup again)",
            lib.display()
        );
    };
    Ok(Llvm {
        file: lib.join(&name),
        name,
        major,
    })
}

fn home() -> Result<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .context("HOME is not set")
}

fn cargo_home() -> Result<PathBuf> {
    match std::env::var_os("CARGO_HOME").filter(|h| !h.is_empty()) {
        Some(h) => Ok(PathBuf::from(h)),
        None => Ok(home()?.join(".cargo")),
    }
}

/// `~/.cache/memscope-bpf/llvm`, whose `lib/` holds symlinks to nightly's libLLVM;
/// bpf-linker is built with `LLVM_PREFIX` pointing here and keeps `lib/` as its RUNPATH.
fn ensure_llvm_prefix(llvm: &Llvm) -> Result<PathBuf> {
    let prefix = home()?.join(".cache/memscope-bpf/llvm");
    let lib = prefix.join("lib");
    fs::create_dir_all(&lib).with_context(|| format!("creating {}", lib.display()))?;
    for link_name in ["libLLVM.so", llvm.name.as_str()] {
        let link = lib.join(link_name);
        if fs::read_link(&link).is_ok_and(|target| target == llvm.file) {
            continue;
        }
        if fs::symlink_metadata(&link).is_ok() {
            fs::remove_file(&link).with_context(|| format!("removing {}", link.display()))?;
        }
        std::os::unix::fs::symlink(&llvm.file, &link)
            .with_context(|| format!("symlinking {} -> {}", link.display(), llvm.file.display()))?;
    }
    Ok(prefix)
}

/// The first `name` on PATH.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// `Ok(version)` if the bpf-linker at `path` runs and uses nightly's LLVM, else why not.
fn check_linker(path: &Path, llvm: &Llvm) -> std::result::Result<String, String> {
    let version = cmd::probe(Command::new(path).arg("--version"))
        .ok_or_else(|| format!("`{} --version` failed", path.display()))?;
    // A dynamically linked bpf-linker must load the very libLLVM that nightly rustc
    // uses, or it cannot read rustc's bitcode. (A static one is taken at its word.)
    if let Some(ldd) = cmd::probe(Command::new("ldd").arg(path)) {
        for line in ldd.lines().filter(|l| l.contains("libLLVM")) {
            let needed = line.split_whitespace().next().unwrap_or("");
            if line.contains("not found") {
                return Err(format!("{needed} is not found"));
            }
            if needed != llvm.name {
                return Err(format!(
                    "it is linked against {needed}, but nightly rustc uses {}",
                    llvm.name
                ));
            }
        }
    }
    Ok(version.trim().to_owned())
}

/// Returns the step's detail and the directory holding the working bpf-linker.
fn bpf_linker(opts: &Options) -> Result<(String, PathBuf)> {
    let llvm = nightly_llvm()?;
    let prefix = ensure_llvm_prefix(&llvm)?;
    let root = match &opts.bpf_linker_root {
        Some(root) => root.clone(),
        None => cargo_home()?,
    };
    let installed_bin = root.join("bin").join("bpf-linker");

    if !opts.force_bpf_linker {
        let existing = match &opts.bpf_linker_root {
            Some(_) => Some(installed_bin.clone()).filter(|p| p.is_file()),
            None => {
                which("bpf-linker").or_else(|| Some(installed_bin.clone()).filter(|p| p.is_file()))
            }
        };
        match existing {
            Some(path) => match check_linker(&path, &llvm) {
                Ok(version) => {
                    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
                    return Ok((
                        format!("{version} at {}, already installed", path.display()),
                        dir,
                    ));
                }
                Err(why) => println!(
                    "{TAG} bpf-linker: {} is not usable ({why}); reinstalling",
                    path.display()
                ),
            },
            None => println!("{TAG} bpf-linker: not found; installing it"),
        }
    }

    println!(
        "{TAG} bpf-linker: building it against nightly's {} (LLVM {}); this takes a few minutes ...",
        llvm.name, llvm.major
    );
    let mut install = Command::new("cargo");
    install
        // Outside the repo, so that its .cargo/config.toml does not apply.
        .current_dir(&prefix)
        .env("LLVM_PREFIX", &prefix)
        .args(["install", "bpf-linker", "--locked", "--force"])
        .args(["--no-default-features", "--features"])
        .arg(format!("llvm-{}", llvm.major));
    if opts.bpf_linker_root.is_some() {
        install.arg("--root").arg(&root);
    }
    println!("{TAG} + {}", cmd::describe(&install));
    cmd::stream(&mut install).context("installing bpf-linker failed")?;

    match check_linker(&installed_bin, &llvm) {
        Ok(version) => Ok((
            format!("{version} at {}, installed now", installed_bin.display()),
            root.join("bin"),
        )),
        Err(why) => bail!(
            "bpf-linker was installed at {} but does not work: {why}",
            installed_bin.display()
        ),
    }
}

/// The programs the fixtures and tests run, and the Debian package that has each: checked up
/// front so a bare machine gets one clear message instead of a build or test failure.
const HOST_TOOLS: [(&str, &str, &str); 5] = [
    ("cc", "gcc", "the simulated vendor libraries (C)"),
    (
        "g++",
        "g++",
        "the simulated libatb.so and the C++ stack fixtures",
    ),
    ("make", "make", "tests/fixtures"),
    (
        "objcopy",
        "binutils",
        "the stripped-library fixture (.gnu_debuglink)",
    ),
    (
        "python3",
        "python3",
        "the CPython label test (tests/labels.rs)",
    ),
];

fn host_tools() -> Result<String> {
    let missing: Vec<String> = HOST_TOOLS
        .iter()
        .filter(|(tool, _, _)| which(tool).is_none())
        .map(|(tool, pkg, why)| format!("{tool} (Debian package {pkg}; for {why})"))
        .collect();
    if !missing.is_empty() {
        bail!("missing on PATH: {}", missing.join(", "));
    }
    Ok(HOST_TOOLS.map(|t| t.0).join(", "))
}

/// Headless Chromium renders the HTML report in probe-user/tests/report.rs (and the bench
/// measures its first paint). Debian's package; installed with apt when missing and root.
fn chromium() -> Result<String> {
    if let Some(p) = which("chromium") {
        return Ok(format!("{} already installed", p.display()));
    }
    if crate::effective_uid() != Some(0) {
        // Like the BPF tests, the rendering tests are skipped loudly without it.
        return Ok(
            "WARNING: not on PATH and not root, so not installed (Debian package \
                   chromium: `sudo apt-get install chromium`); the report rendering tests \
                   will be SKIPPED"
                .to_owned(),
        );
    }
    let mut install = Command::new("apt-get");
    install.env("DEBIAN_FRONTEND", "noninteractive").args([
        "install",
        "-y",
        "--no-install-recommends",
        "chromium",
    ]);
    if cmd::output(&mut install).is_err() {
        // A fresh container has no package lists yet.
        cmd::output(Command::new("apt-get").arg("update"))?;
        cmd::output(&mut install)?;
    }
    match which("chromium") {
        Some(p) => Ok(format!("installed {}", p.display())),
        None => bail!("apt-get installed chromium but it is not on PATH"),
    }
}

/// py-spy (PyPI): the independent reader the Python-stack tests compare our frames with.
/// Installed with the pip of the `python3` on PATH, which puts it beside that interpreter.
fn py_spy() -> Result<String> {
    if let Some(v) = cmd::probe(Command::new("py-spy").arg("--version")) {
        return Ok(format!("{} already there", v.trim()));
    }
    let mut pip = Command::new("python3");
    pip.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "py-spy",
    ]);
    cmd::output(&mut pip)?;
    // pyenv reaches new scripts through shims made by `rehash`.
    let _ = cmd::probe(Command::new("pyenv").arg("rehash"));
    let v = cmd::probe(Command::new("py-spy").arg("--version"))
        .context("pip installed py-spy, but it is not on PATH")?;
    Ok(format!("{} installed", v.trim()))
}

/// What the node agent's tests read its endpoints with: a real Prometheus server (scrapes
/// /metrics, answers PromQL) and `go tool pprof` (reads /debug/pprof/heap).
const AGENT_TOOLS: [(&str, &str); 2] = [("prometheus", "prometheus"), ("go", "golang-go")];

fn agent_tools() -> Result<String> {
    let missing: Vec<&str> = AGENT_TOOLS
        .iter()
        .filter(|(tool, _)| which(tool).is_none())
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok("prometheus, go: already installed".to_owned());
    }
    if crate::effective_uid() != Some(0) {
        bail!(
            "missing {}: install them (apt-get install {}) or run setup as root",
            missing.join(", "),
            missing.join(" ")
        );
    }
    println!(
        "{TAG} agent test tools: installing {} ...",
        missing.join(", ")
    );
    cmd::stream(
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .or_else(|_| {
        // A fresh machine may have no package lists yet.
        cmd::stream(Command::new("apt-get").arg("update"))?;
        cmd::stream(
            Command::new("apt-get")
                .args(["install", "-y", "--no-install-recommends"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    })
    .with_context(|| format!("could not install {}", missing.join(" ")))?;
    Ok(format!("installed {} now", missing.join(", ")))
}

/// What checks deploy/kubernetes and the agent's exposition (tests/deploy.rs,
/// tests/agent_fleet.rs), pinned: from PyPI `kubernetes-validate` (the Kubernetes API's
/// schemas) and `prometheus-client` (its OpenMetrics parser), with the pip of the `python3`
/// on PATH; from npm, into [`DEPLOY_VALIDATORS`] under the cache, the prometheus-operator
/// CRD schemas, Grafana's dashboard types and the TypeScript compiler that checks against
/// them (about 60 MB).
const PIP_VALIDATORS: [&str; 2] = ["kubernetes-validate==1.37.0", "prometheus-client==0.26.0"];
const NPM_VALIDATORS: [&str; 4] = [
    "@kubernetes-models/prometheus-operator@6.0.0",
    "@grafana/schema@13.2.3",
    "js-yaml@5.5.0",
    "typescript@5.9.3",
];
const DEPLOY_VALIDATORS: &str = ".cache/memscope-bpf/deploy-validators";

fn deploy_validators() -> Result<String> {
    let have_pip = cmd::probe(Command::new("kubernetes-validate").arg("--version")).is_some()
        && cmd::probe(Command::new("python3").args(["-c", "import prometheus_client"])).is_some();
    if !have_pip {
        cmd::output(
            Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .args(PIP_VALIDATORS),
        )?;
        // pyenv reaches new scripts through shims made by `rehash`.
        let _ = cmd::probe(Command::new("pyenv").arg("rehash"));
        cmd::probe(Command::new("kubernetes-validate").arg("--version"))
            .context("pip installed kubernetes-validate, but it is not on PATH")?;
    }
    if which("npm").is_none() {
        if crate::effective_uid() != Some(0) {
            bail!("npm is missing: apt-get install nodejs npm, or run setup as root");
        }
        let mut install = Command::new("apt-get");
        install
            .args(["install", "-y", "--no-install-recommends", "nodejs", "npm"])
            .env("DEBIAN_FRONTEND", "noninteractive");
        if cmd::output(&mut install).is_err() {
            cmd::output(Command::new("apt-get").arg("update"))?;
            cmd::output(&mut install)?;
        }
    }
    let dir = home()?.join(DEPLOY_VALIDATORS);
    let installed = |spec: &str| {
        let (name, version) = spec.rsplit_once('@').expect("name@version");
        fs::read_to_string(dir.join("node_modules").join(name).join("package.json"))
            .is_ok_and(|p| p.contains(&format!("\"version\": \"{version}\"")))
    };
    if NPM_VALIDATORS.iter().all(|s| installed(s)) {
        return Ok(format!(
            "pip and npm validators already in {}",
            dir.display()
        ));
    }
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    if !dir.join("package.json").exists() {
        fs::write(dir.join("package.json"), "{\"private\": true}\n")?;
    }
    cmd::output(
        Command::new("npm")
            .current_dir(&dir)
            .args(["install", "--no-audit", "--no-fund", "--save-exact"])
            .args(NPM_VALIDATORS),
    )?;
    Ok(format!("installed the npm validators in {}", dir.display()))
}

fn fixtures(repo: &Path) -> Result<String> {
    let dir = repo.join("tests/fixtures");
    let has_makefile = ["GNUmakefile", "makefile", "Makefile"]
        .iter()
        .any(|m| dir.join(m).is_file());
    if !has_makefile {
        bail!("no Makefile in {}", dir.display());
    }
    let mut make = Command::new("make");
    make.current_dir(repo).args(["-C", "tests/fixtures"]);
    let out = cmd::output(&mut make)?;
    let detail = if out.contains("Nothing to be done") || out.contains("is up to date") {
        "up to date"
    } else {
        "done"
    };
    Ok(format!("make -C tests/fixtures: {detail}"))
}

fn btf() -> Result<String> {
    if Path::new(BTF).exists() {
        Ok(BTF.to_owned())
    } else {
        bail!(
            "{BTF} does not exist: this kernel has no BTF type information \
             (it needs CONFIG_DEBUG_INFO_BTF=y), which loading the BPF programs requires"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_asks_only_for_what_it_uses() {
        let demo = plan(Purpose::Demo { screenshot: false });
        for unused in [
            Step::TorchBed,
            Step::CudaBed,
            Step::AgentTools,
            Step::DeployValidators,
            Step::PySpy,
            Step::Chromium,
        ] {
            assert!(!demo.contains(&unused), "{unused:?} in {demo:?}");
        }
        for needed in [Step::BpfLinker, Step::HostTools, Step::Fixtures, Step::Btf] {
            assert!(demo.contains(&needed), "{needed:?} not in {demo:?}");
        }
        let shot = plan(Purpose::Demo { screenshot: true });
        assert!(shot.contains(&Step::Chromium) && !shot.contains(&Step::TorchBed));
        // The tests get every step.
        assert_eq!(plan(Purpose::Tests).len(), 12);
    }
}
