//! The real-framework test bed: the released `torch` and `torch_npu` wheels from PyPI in cached
//! virtual environments, and the simulated CANN they run on (`make -C tests/fixtures cann`).
//!
//! The releases pinned ([`RELEASES`]) cover both `MemoryUsage` layouts (see
//! probe-user/src/trace/torch_npu.rs), the oldest and newest supported release and each way
//! a release was built. PyPI's x86-64 torch is the CUDA build: with its `nvidia-*`
//! dependencies a venv is about 6 GB, so the venvs live outside the repository
//! (`$MEMSCOPE_BPF_CACHE`, default `~/.cache/memscope-bpf/venvs`) and are made once; a
//! finished one holds a `.memscope-ready` marker. The newer entries skip the `nvidia-*`
//! wheels or share another venv's torch ([`TorchFrom`]). torch_npu pins a `+cpu` torch build
//! that PyPI does not serve, so it is installed with `--no-deps` next to PyPI's torch of the
//! same version.
//!
//! From torch 2.10, PyPI's CUDA `libc10_cuda.so` registers allocator-config keys that
//! torch_npu registers too, and `import torch_npu` aborts (`Duplicated key '...'`); on an
//! Ascend host torch is the CPU build and this does not happen. The bed renames those keys in
//! its own copy of `libc10_cuda.so` (CUDA's, never used here), one per failed import, and
//! leaves torch_npu untouched ([`rename_cuda_config_keys`]).
//!
//! The release matrix (every torch_npu release PyPI serves for cp311, x86-64 and aarch64, in
//! `probe-user/tests/data/torch_npu_{x86_64,aarch64}.tsv`) is fetched too, wheels only, no
//! torch: only each wheel's `libtorch_npu.so` and `version.py` are kept (`torch_npu_libs` and
//! `torch_npu_libs_aarch64`, about 3 GB each), for the static test
//! (`probe-user/tests/real_torch_matrix.rs`).
//!
//! `MEMSCOPE_TORCH_BED=off` skips all of it (the tests that need it then say SKIPPED).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::cmd;

/// Where a release's venv gets its torch.
#[derive(Clone, Copy)]
pub enum TorchFrom {
    /// PyPI's torch with all its dependencies (the nvidia-* wheels: ~4 GB).
    PyPi,
    /// PyPI's torch without the nvidia-* wheels (~700 MB); tests/tools/cuda_absent.py stands
    /// in for the CUDA libraries it links, as on an Ascend host where CUDA does not exist.
    PyPiWithoutCuda,
    /// The torch of the venv of this torch_npu release (the same torch version), through a
    /// `.pth` file: only the torch_npu wheel is downloaded.
    VenvOf(&'static str),
}

/// (torch, torch_npu, extra requirements, where torch comes from) of each release in the bed.
/// The first is the tests' default release; a `VenvOf` comes after the venv it names.
pub const RELEASES: [(&str, &str, &[&str], TorchFrom); 5] = [
    // MemoryUsage with component_type (released 2026-01).
    (
        "2.8.0",
        "2.8.0.post2",
        &["numpy", "pyyaml"],
        TorchFrom::PyPi,
    ),
    // The newest: mold-linked, each allocator event logged twice, config keys renamed.
    ("2.14.0", "2.14.0", &["numpy", "pyyaml"], TorchFrom::PyPi),
    // The original MemoryUsage (git 9e105ea, 2025-04).
    ("2.5.1", "2.5.1", &["numpy<2", "pyyaml"], TorchFrom::PyPi),
    // GNU ld, each allocator event logged twice (two copies of each log string).
    (
        "2.8.0",
        "2.8.0.post4",
        &[],
        TorchFrom::VenvOf("2.8.0.post2"),
    ),
    // The oldest release the docs support.
    (
        "2.1.0",
        "2.1.0.post8",
        TORCH_2_1_DEPS,
        TorchFrom::PyPiWithoutCuda,
    ),
];

/// torch 2.1.0's own requirements but the nvidia-* wheels and triton (CUDA only), and
/// torch_npu 2.1's.
const TORCH_2_1_DEPS: &[&str] = &[
    "numpy<2",
    "pyyaml",
    "filelock",
    "typing-extensions",
    "sympy",
    "networkx",
    "jinja2",
    "fsspec",
];

/// The environment variable the tests read the venvs from (`:`-separated).
pub const VENVS_ENV: &str = "MEMSCOPE_TORCH_VENVS";
const READY_MARKER: &str = ".memscope-ready";
/// Written once `import torch_npu` works in a venv (after any key renaming).
const IMPORTS_MARKER: &str = ".memscope-imports";

pub fn enabled() -> bool {
    std::env::var("MEMSCOPE_TORCH_BED").map_or(true, |v| v != "off")
}

/// Where the test beds live: `$MEMSCOPE_BPF_CACHE`, default `~/.cache/memscope-bpf`.
pub fn cache_root() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("MEMSCOPE_BPF_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(".cache/memscope-bpf"))
}

pub fn cache_dir() -> Result<PathBuf> {
    Ok(cache_root()?.join("venvs"))
}

/// The venv directory of one release.
pub fn venv(torch: &str, npu: &str) -> Result<PathBuf> {
    Ok(cache_dir()?.join(format!("torch-{torch}_npu-{npu}")))
}

/// The venvs, in `RELEASES` order, as the tests want them.
pub fn venvs() -> Result<Vec<PathBuf>> {
    RELEASES.iter().map(|(t, n, ..)| venv(t, n)).collect()
}

/// True when every release's venv is installed and ready.
pub fn installed() -> bool {
    venvs().is_ok_and(|dirs| dirs.iter().all(|d| d.join(READY_MARKER).is_file()))
}

/// True when the release matrix's libraries have been fetched (some at least: the fetch
/// itself is idempotent and cheap when they are all there).
pub fn matrix_fetched() -> bool {
    cache_dir().is_ok_and(|venvs| {
        ["torch_npu_libs", "torch_npu_libs_aarch64"]
            .iter()
            .all(|libs| venvs.with_file_name(libs).is_dir())
    })
}

/// The platforms of the release matrix, each with its table of the independent reading.
const MATRIX_PLATFORMS: [&str; 2] = ["x86_64", "aarch64"];

/// Makes every venv that is not ready yet, then the simulated CANN for all of them.
pub fn prepare(repo: &Path) -> Result<String> {
    let mut made = Vec::new();
    let mut sites = Vec::new();
    for (torch, npu, extra, from) in RELEASES {
        let dir = venv(torch, npu)?;
        if !dir.join(READY_MARKER).is_file() {
            let what = match from {
                TorchFrom::PyPi => {
                    "PyPI's CUDA build of torch with its nvidia-* wheels: ~4 GB to download once"
                }
                TorchFrom::PyPiWithoutCuda => {
                    "PyPI's torch without its nvidia-* wheels: ~0.7 GB to download once, 1.7 GB kept"
                }
                TorchFrom::VenvOf(_) => {
                    "torch_npu's wheel only, torch shared with the venv named: ~0.1 GB kept"
                }
            };
            println!(
                "[setup] torch test bed: installing torch=={torch} and torch_npu=={npu} into {} \
                 ({what})",
                dir.display()
            );
            make_venv(repo, &dir, torch, npu, extra, from)?;
            made.push(npu);
        }
        sites.push(site_packages(&dir)?);
    }
    // MindSpore's Ascend plugin asks the simulated CANN for more names than torch_npu does.
    let mut mindspore = None;
    if crate::mindspore_bed::enabled() {
        let (site, made) = crate::mindspore_bed::install()?;
        sites.push(site);
        mindspore = Some(made);
    }
    let mut make = Command::new("make");
    make.current_dir(repo)
        .args(["-s", "-C", "tests/fixtures", "cann"])
        .arg(format!(
            "CANN_SITES={}",
            sites
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        ));
    cmd::output(&mut make).context("building the simulated CANN for torch_npu")?;
    let mut renamed = Vec::new();
    for (torch, npu, ..) in RELEASES {
        let dir = venv(torch, npu)?;
        if !dir.join(IMPORTS_MARKER).is_file() {
            renamed.extend(rename_cuda_config_keys(repo, &dir)?);
            fs::write(dir.join(IMPORTS_MARKER), "import torch, torch_npu: ok\n")?;
        }
    }
    let matrix = fetch_matrix(repo)?;
    let mindspore = match mindspore {
        Some(made) => format!(
            "; {}{}",
            if made { "installed now: " } else { "" },
            crate::mindspore_bed::check(&repo.join("tests/fixtures/build/cann"))?
        ),
        None => "; mindspore bed skipped (MEMSCOPE_MINDSPORE_BED=off)".to_owned(),
    };
    Ok(format!(
        "torch_npu {}; {}{}; {matrix}{mindspore}",
        RELEASES.map(|r| r.1).join(", "),
        if made.is_empty() {
            "venvs already installed".to_owned()
        } else {
            format!("installed {} now", made.join(", "))
        },
        if renamed.is_empty() {
            String::new()
        } else {
            format!(
                "; renamed CUDA's config keys {} in libc10_cuda.so",
                renamed.join(", ")
            )
        }
    ))
}

/// Makes `import torch, torch_npu` work in `venv` on the simulated CANN: while it aborts with
/// `Duplicated key 'K'`, renames `K` in torch's `libc10_cuda.so` (its first byte becomes `_`,
/// wherever the key's text or its first 16 bytes, which the compiler loads as one constant,
/// appear). Returns the keys renamed.
fn rename_cuda_config_keys(repo: &Path, venv: &Path) -> Result<Vec<String>> {
    let cuda = site_packages(venv)?.join("torch/lib/libc10_cuda.so");
    let cann = repo.join("tests/fixtures/build/cann");
    let mut renamed = Vec::new();
    for _ in 0..16 {
        let mut import = Command::new(venv.join("bin/python"));
        import
            .args(["-c", "import torch, torch_npu"])
            .env("ASCEND_HOME_PATH", &cann)
            .env("ASCEND_OPP_PATH", cann.join("opp"))
            .env("LD_LIBRARY_PATH", cann.join("lib64"));
        let out = import.output().context("running the venv's python")?;
        if out.status.success() {
            return Ok(renamed);
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let Some(key) = stderr
            .split("Duplicated key '")
            .nth(1)
            .and_then(|rest| rest.split('\'').next())
            .filter(|k| k.len() > 1)
        else {
            bail!(
                "`import torch_npu` fails in {}:\n{}",
                venv.display(),
                stderr.lines().take(5).collect::<Vec<_>>().join("\n")
            );
        };
        let mut bytes = fs::read(&cuda).with_context(|| format!("reading {}", cuda.display()))?;
        let key = key.as_bytes();
        let mut hits = 0;
        for piece in [key, &key[..key.len().min(16)]] {
            let mut at = 0;
            while let Some(i) = bytes[at..].windows(piece.len()).position(|w| w == piece) {
                bytes[at + i] = b'_';
                at += i + piece.len();
                hits += 1;
            }
        }
        if hits == 0 {
            bail!(
                "`import torch_npu` aborts on key '{}', which {} does not hold",
                String::from_utf8_lossy(key),
                cuda.display()
            );
        }
        fs::write(&cuda, &bytes).with_context(|| format!("writing {}", cuda.display()))?;
        renamed.push(String::from_utf8_lossy(key).into_owned());
    }
    bail!(
        "`import torch_npu` still fails in {} after renaming {renamed:?}",
        venv.display()
    )
}

/// The torch_npu wheels of the release matrix, fetched once (libtorch_npu.so and version.py
/// kept) by tests/tools/torch_npu_wheels.py; says how much came now and how much is kept.
fn fetch_matrix(repo: &Path) -> Result<String> {
    let cache = cache_dir()?
        .parent()
        .context("the venvs' cache directory has no parent")?
        .to_path_buf();
    let mut said = Vec::new();
    for platform in MATRIX_PLATFORMS {
        let table = fs::read_to_string(
            repo.join(format!("probe-user/tests/data/torch_npu_{platform}.tsv")),
        )?;
        let versions: Vec<&str> = table
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| l.split('\t').next())
            .collect();
        let mut fetch = Command::new("python3");
        fetch
            .arg(repo.join("tests/tools/torch_npu_wheels.py"))
            .arg(&cache)
            .arg(platform)
            .args(versions);
        said.push(
            cmd::output(&mut fetch)
                .with_context(|| format!("fetching the torch_npu release matrix ({platform})"))?
                .trim()
                .to_owned(),
        );
    }
    Ok(said.join("; "))
}

fn make_venv(
    repo: &Path,
    dir: &Path,
    torch: &str,
    npu: &str,
    extra: &[&str],
    from: TorchFrom,
) -> Result<()> {
    if dir.exists() {
        // A half-made venv from an interrupted run.
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir_all(dir.parent().unwrap_or(dir))?;
    run(Command::new("python3").args(["-m", "venv"]).arg(dir))?;
    let pip = dir.join("bin/pip");
    let install = || {
        let mut c = Command::new(&pip);
        c.args(["install", "-q", "--disable-pip-version-check"]);
        c
    };
    match from {
        TorchFrom::PyPi => run(install().arg(format!("torch=={torch}")).args(extra))?,
        TorchFrom::PyPiWithoutCuda => {
            run(install().arg("--no-deps").arg(format!("torch=={torch}")))?;
            // pip would list every nvidia-* wheel torch asks for as missing.
            run(install().arg("--no-warn-conflicts").args(extra))?;
        }
        TorchFrom::VenvOf(base_npu) => {
            let base = RELEASES
                .iter()
                .find(|r| r.1 == base_npu && r.0 == torch)
                .with_context(|| format!("no release {base_npu} with torch {torch} in the bed"))?;
            let base_site = site_packages(&venv(base.0, base.1)?)?;
            let own = dir.join(
                base_site
                    .strip_prefix(venv(base.0, base.1)?)
                    .context("the base venv's site-packages")?,
            );
            fs::create_dir_all(&own)?;
            // After the venv's own site-packages on sys.path: its torch_npu comes first.
            fs::write(
                own.join("memscope-shared-torch.pth"),
                format!("{}\n", base_site.display()),
            )?;
            if !extra.is_empty() {
                run(install().args(extra))?;
            }
        }
    }
    run(install().arg("--no-deps").arg(format!("torch-npu=={npu}")))?;
    if let TorchFrom::PyPiWithoutCuda = from {
        let mut absent = Command::new("python3");
        absent
            .arg(repo.join("tests/tools/cuda_absent.py"))
            .arg(site_packages(dir)?);
        println!("[setup] {}", cmd::output(&mut absent)?.trim());
    }
    fs::write(
        dir.join(READY_MARKER),
        format!("torch=={torch} torch_npu=={npu}\n"),
    )?;
    Ok(())
}

fn run(c: &mut Command) -> Result<()> {
    let status = cmd::interactive(c)?;
    if !status.success() {
        bail!("`{}` failed ({status})", cmd::describe(c));
    }
    Ok(())
}

fn site_packages(venv: &Path) -> Result<PathBuf> {
    let lib = venv.join("lib");
    for entry in fs::read_dir(&lib).with_context(|| format!("reading {}", lib.display()))? {
        let site = entry?.path().join("site-packages");
        if site.join("torch_npu").is_dir() {
            return Ok(site);
        }
    }
    bail!("no site-packages with torch_npu under {}", lib.display())
}
