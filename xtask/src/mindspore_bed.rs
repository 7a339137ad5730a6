//! The MindSpore test bed: the released `mindspore` wheel from PyPI (pinned, cp311 x86-64,
//! 804 MB to download, ~2.8 GB installed) in a cached virtual environment
//! (`$MEMSCOPE_BPF_CACHE/mindspore`, default `~/.cache/memscope-bpf/mindspore`), made once; a
//! finished one holds a `.memscope-ready` marker. MindSpore 2.10 is built against NumPy 1.x
//! (with NumPy 2 its tensor conversions fail), so `numpy<2` is pinned beside it.
//!
//! Its Ascend plugin (`lib/plugin/libmindspore_ascend.so.2`) runs on the simulated CANN, which
//! `torch_bed::prepare` builds with this venv's site-packages among the ones it generates stub
//! names from (tests/fixtures/cann/gen_stubs.py). The bed check imports MindSpore there and
//! fails unless its device target is Ascend: if the plugin does not load, MindSpore falls back
//! to the CPU without a word and no test of it would mean anything.
//!
//! `MEMSCOPE_MINDSPORE_BED=off` skips it (its tests then say SKIPPED).

use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};

use crate::cmd;

pub const MINDSPORE: &str = "2.10.0";
/// The environment variable the tests read the venv from.
pub const VENV_ENV: &str = "MEMSCOPE_MINDSPORE_VENV";
const READY_MARKER: &str = ".memscope-ready";
const DEVICE_MARKER: &str = ".memscope-ascend";

pub fn enabled() -> bool {
    std::env::var("MEMSCOPE_MINDSPORE_BED").map_or(true, |v| v != "off")
}

pub fn venv() -> Result<PathBuf> {
    Ok(crate::torch_bed::cache_root()?
        .join("mindspore")
        .join(format!("venv-{MINDSPORE}")))
}

pub fn installed() -> bool {
    venv().is_ok_and(|d| d.join(READY_MARKER).is_file())
}

/// Makes the venv when it is not ready; returns its site-packages (for the simulated CANN).
pub fn install() -> Result<(PathBuf, bool)> {
    let dir = venv()?;
    let made = !dir.join(READY_MARKER).is_file();
    if made {
        println!(
            "[setup] mindspore test bed: installing mindspore=={MINDSPORE} into {} \
             (an 804 MB wheel to download once, ~2.8 GB installed)",
            dir.display()
        );
        if dir.exists() {
            // A half-made venv from an interrupted run.
            fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        fs::create_dir_all(dir.parent().unwrap_or(&dir))?;
        run(Command::new("python3").args(["-m", "venv"]).arg(&dir))?;
        run(Command::new(dir.join("bin/pip"))
            .args([
                "install",
                "-q",
                "--disable-pip-version-check",
                "--no-cache-dir",
            ])
            .arg(format!("mindspore=={MINDSPORE}"))
            .arg("numpy<2"))?;
        fs::write(dir.join(READY_MARKER), format!("mindspore=={MINDSPORE}\n"))?;
    }
    Ok((dir.join("lib/python3.11/site-packages"), made))
}

/// After the simulated CANN is built: MindSpore must run on it as an Ascend device.
pub fn check(cann: &std::path::Path) -> Result<String> {
    let dir = venv()?;
    if dir.join(DEVICE_MARKER).is_file() {
        return Ok(format!("mindspore {MINDSPORE} on Ascend (checked before)"));
    }
    let mut probe = Command::new(dir.join("bin/python"));
    probe
        .args([
            "-c",
            "import mindspore as ms; ms.set_device('Ascend'); \
             x = ms.ops.ones((4,), ms.float32); (x + x).asnumpy(); \
             print(ms.get_context('device_target'))",
        ])
        .env("ASCEND_HOME_PATH", cann)
        .env("ASCEND_OPP_PATH", cann.join("opp"))
        .env("LD_LIBRARY_PATH", cann.join("lib64"));
    let out = probe
        .output()
        .context("running the mindspore venv's python")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || stdout.trim().lines().last() != Some("Ascend") {
        bail!(
            "mindspore {MINDSPORE} does not run on the simulated CANN as an Ascend device \
             (its Ascend plugin did not load, or fell back to the CPU):\n{}\n{}",
            stdout.trim(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .filter(|l| !l.contains("[WARNING]"))
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    fs::write(dir.join(DEVICE_MARKER), "device_target: Ascend\n")?;
    Ok(format!(
        "mindspore {MINDSPORE} runs on Ascend (its plugin loaded)"
    ))
}

fn run(c: &mut Command) -> Result<()> {
    let status = cmd::interactive(c)?;
    if !status.success() {
        bail!("`{}` failed ({status})", cmd::describe(c));
    }
    Ok(())
}
