//! The CUDA test bed: PyPI's CUDA build of torch (`torch==2.8.0`, cp311 x86-64, an 888 MB
//! wheel, ~4.5 GB installed) in a cached virtual environment (`$MEMSCOPE_BPF_CACHE/cuda`,
//! default `~/.cache/memscope-bpf/cuda`), installed with `--no-deps` (its `nvidia-*`
//! dependencies are several GB of GPU code that cannot run here) beside the few pure-Python
//! packages `import torch` needs. A finished venv holds a `.memscope-ready` marker.
//!
//! NVIDIA's NVTX library is the real one (`nvidia-nvtx-cu12`, no GPU code in it). Instead of
//! NVIDIA's other libraries the venv gets the simulated CUDA runtime and driver built by
//! the fixtures (`make -C tests/fixtures cuda`: device memory is host memory, kernel launches do
//! nothing) where the wheel's DT_RPATH finds them (`site-packages/nvidia/cuda_runtime/lib`), and
//! stubs for cublas, cudnn, nccl, ... (tests/tools/cuda_bed.py). The bed check then makes a
//! tensor on `cuda:0` and reads `torch.cuda.memory_allocated()` back: if torch falls back to
//! "no CUDA" nothing the tests check would mean anything.
//!
//! `MEMSCOPE_CUDA_BED=off` skips it (its tests then say SKIPPED).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::cmd;

pub const TORCH: &str = "2.8.0";
/// NVIDIA's own NVTX library, the release torch 2.8.0 pins (a 36 KB wheel with no GPU code):
/// the real `libnvToolsExt.so.1`, whose lazy first call the tests must see as it is.
const NVTX_WHEEL: &str = "nvidia-nvtx-cu12==12.8.90";
const NVTX_DIST_INFO: &str = "nvidia_nvtx_cu12-12.8.90.dist-info";
/// The environment variable the tests read the venv from.
pub const VENV_ENV: &str = "MEMSCOPE_CUDA_VENV";
const READY_MARKER: &str = ".memscope-ready";
/// What `import torch` needs of torch 2.8.0's requirements (not the `nvidia-*` wheels, not
/// triton, which only compiles kernels for a real GPU).
const TORCH_DEPS: &[&str] = &[
    "filelock",
    "typing-extensions",
    "sympy==1.14.0",
    "mpmath",
    "networkx",
    "jinja2",
    "markupsafe",
    "fsspec",
    // Not needed by `import torch`, but without it torch warns at every start.
    "numpy",
];

pub fn enabled() -> bool {
    std::env::var("MEMSCOPE_CUDA_BED").map_or(true, |v| v != "off")
}

pub fn venv() -> Result<PathBuf> {
    Ok(crate::torch_bed::cache_root()?
        .join("cuda")
        .join(format!("venv-torch-{TORCH}")))
}

pub fn installed() -> bool {
    venv().is_ok_and(|d| d.join(READY_MARKER).is_file())
}

/// Makes the venv when it is not ready, puts the simulated CUDA in it and checks that torch
/// runs on it as a CUDA device.
pub fn prepare(repo: &Path) -> Result<String> {
    let dir = venv()?;
    let made = !dir.join(READY_MARKER).is_file();
    if made {
        println!(
            "[setup] cuda test bed: installing torch=={TORCH} (PyPI's CUDA build, --no-deps: \
             an 888 MB wheel to download once, ~4.5 GB installed) into {}",
            dir.display()
        );
        if dir.exists() {
            // A half-made venv from an interrupted run.
            fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        fs::create_dir_all(dir.parent().unwrap_or(&dir))?;
        run(Command::new("python3").args(["-m", "venv"]).arg(&dir))?;
        run(pip_no_deps(&dir)
            .arg(format!("torch=={TORCH}"))
            .args(TORCH_DEPS))?;
        fs::write(dir.join(READY_MARKER), format!("torch=={TORCH}\n"))?;
    }
    let site = dir.join("lib/python3.11/site-packages");
    if !site.join(NVTX_DIST_INFO).is_dir() {
        // Beds made before NVTX was NVIDIA's own get it here too.
        run(pip_no_deps(&dir).arg(NVTX_WHEEL))?;
    }
    run(Command::new("make")
        .current_dir(repo)
        .args(["-s", "-C", "tests/fixtures", "cuda"]))?;
    run(Command::new("python3")
        .arg(repo.join("tests/tools/cuda_bed.py"))
        .arg(&site)
        .arg(repo.join("tests/fixtures/build/cuda")))?;
    check(&dir)?;
    Ok(format!(
        "torch {TORCH} (CUDA build) on the simulated CUDA in {}{}",
        dir.display(),
        if made { "" } else { " (installed before)" }
    ))
}

/// torch must see one CUDA device and count a tensor made on it.
fn check(dir: &Path) -> Result<()> {
    let out = Command::new(dir.join("bin/python"))
        .args([
            "-c",
            "import torch; x = torch.empty(1000, device='cuda'); y = x + 1; \
             print(torch.cuda.is_available(), torch.cuda.memory_allocated())",
        ])
        .output()
        .context("running the cuda venv's python")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || stdout.trim() != "True 8192" {
        bail!(
            "torch {TORCH} does not run on the simulated CUDA (expected `True 8192`, two \
             4000-byte tensors in 4096-byte blocks):\n{}\n{}",
            stdout.trim(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    Ok(())
}

/// `pip install` into the venv of packages without their dependencies.
fn pip_no_deps(venv: &Path) -> Command {
    let mut c = Command::new(venv.join("bin/pip"));
    c.args([
        "install",
        "-q",
        "--disable-pip-version-check",
        "--no-cache-dir",
        "--no-deps",
    ]);
    c
}

fn run(c: &mut Command) -> Result<()> {
    let status = cmd::interactive(c)?;
    if !status.success() {
        bail!("`{}` failed ({status})", cmd::describe(c));
    }
    Ok(())
}
