//! `cargo xtask test-gpu`: the CUDA source on a real NVIDIA GPU, for a person to run on such a
//! machine (never part of `cargo xtask test`: CI has no GPU).
//!
//! 1. PyPI's `torch==2.8.0` WITH its `nvidia-*` wheels (the real CUDA runtime, ~4 GB once) in
//!    its own venv (`$MEMSCOPE_BPF_CACHE/cuda/venv-torch-2.8.0-gpu`), beside the simulated bed.
//! 2. probe-user/tests/real_cuda.rs against it (`MEMSCOPE_CUDA_VENV`): launch and `--pid`,
//!    every tensor's row at its `data_ptr()`, `memory_allocated()`/`memory_reserved()` after
//!    each step, the live `cudaMalloc` segments against torch's own `memory_snapshot()`, leaks
//!    with their steps, Python stacks, on the real driver.
//! 3. The overhead on a training step: tests/fixtures/python/torch_cuda_step_time.py untraced
//!    and traced, side by side, written to target/test-gpu/step_time.txt.
//!
//! `MEMSCOPE_CUDA_VENV=<venv with a CUDA torch>` uses that venv instead (a GPU machine without
//! network). The runs on real hardware are recorded in docs/cuda-hardware.md.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{cmd, cuda_bed};

fn venv() -> Result<PathBuf> {
    let bed = cuda_bed::venv()?;
    Ok(bed.with_file_name(format!("venv-torch-{}-gpu", cuda_bed::TORCH)))
}

pub fn run(repo: &Path) -> Result<u8> {
    let gpus = Command::new("nvidia-smi")
        .args(["--query-gpu=name,driver_version", "--format=csv,noheader"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|s| !s.is_empty());
    let Some(gpus) = gpus else {
        bail!(
            "no NVIDIA GPU here (`nvidia-smi` failed or lists none): test-gpu needs a machine \
             with a GPU and its driver; the simulated CUDA bed runs in `cargo xtask test`"
        );
    };
    println!("[test-gpu] GPU: {gpus}");
    let ready = crate::setup::run(repo, &crate::setup::Options::default())?;
    // A GPU machine often has its own CUDA torch and no network: MEMSCOPE_CUDA_VENV names it.
    let own = std::env::var_os(cuda_bed::VENV_ENV).map(PathBuf::from);
    let dir = match &own {
        Some(dir) => dir.clone(),
        None => venv()?,
    };
    if own.is_some() && !dir.join("bin/python").is_file() {
        bail!("{}={} has no bin/python", cuda_bed::VENV_ENV, dir.display());
    }
    if own.is_none() && !dir.join(".memscope-ready").is_file() {
        println!(
            "[test-gpu] installing torch=={} with its nvidia-* wheels into {} (~4 GB once)",
            cuda_bed::TORCH,
            dir.display()
        );
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        check(Command::new("python3").args(["-m", "venv"]).arg(&dir))?;
        check(
            Command::new(dir.join("bin/pip"))
                .args(["install", "-q", "--disable-pip-version-check", "numpy"])
                .arg(format!("torch=={}", cuda_bed::TORCH)),
        )?;
        fs::write(dir.join(".memscope-ready"), "torch with nvidia-* wheels\n")?;
    }
    let tmp = crate::disk::fresh_test_tmp(repo)?;
    let mut test = Command::new("cargo");
    test.current_dir(repo)
        .args(["test", "-p", "memscope-bpf", "--test", "real_cuda"])
        .env("MEMSCOPE_CUDA_VENV", &dir)
        .env("TMPDIR", &tmp);
    ready.apply(&mut test);
    println!("[test-gpu] + {}", cmd::describe(&test));
    let status = cmd::interactive(&mut test)?;
    if !status.success() {
        cmd::report_failure("test-gpu", &test, status);
        return Ok(cmd::exit_code(status));
    }

    // The overhead on a training step: the same script untraced, then traced.
    let mut build = Command::new("cargo");
    build
        .current_dir(repo)
        .args(["build", "-p", "memscope-bpf"]);
    ready.apply(&mut build);
    check(&mut build)?;
    let script = repo.join("tests/fixtures/python/torch_cuda_step_time.py");
    let python = dir.join("bin/python");
    let untraced = step_time(Command::new(&python).arg(&script))?;
    let out_dir = tmp.join("step_time");
    let traced = step_time(
        Command::new(repo.join("target/debug/memscope-bpf"))
            .arg("-o")
            .arg(&out_dir)
            .arg("--")
            .arg(&python)
            .arg(&script),
    )?;
    let report = format!(
        "GPU: {gpus}\npython: {}\nuntraced: {untraced}\ntraced:   {traced}\n",
        python.display()
    );
    let results = repo.join("target/test-gpu");
    fs::create_dir_all(&results)?;
    fs::write(results.join("step_time.txt"), &report)?;
    print!("[test-gpu] training step, side by side:\n{report}");
    println!(
        "[test-gpu] written to {}",
        results.join("step_time.txt").display()
    );
    Ok(0)
}

/// The `STEP_TIME ...` line the script printed.
fn step_time(c: &mut Command) -> Result<String> {
    let out = c
        .output()
        .with_context(|| format!("running {}", cmd::describe(c)))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.lines().find(|l| l.starts_with("STEP_TIME ")) {
        Some(line) if out.status.success() => Ok(line["STEP_TIME ".len()..].to_owned()),
        _ => bail!(
            "`{}` failed:\n{text}\n{}",
            cmd::describe(c),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

fn check(c: &mut Command) -> Result<()> {
    let status = cmd::interactive(c)?;
    if !status.success() {
        bail!("`{}` failed ({status})", cmd::describe(c));
    }
    Ok(())
}
