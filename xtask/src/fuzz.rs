//! The short fuzz run CI does on the ELF/DWARF/CFI parsers (`symbols/fuzz`): it must not
//! find a crash. cargo-fuzz is installed on first use; the seed corpus is built from the
//! symbols crate's C/C++ test sources.

use std::{path::Path, process::Command};

use anyhow::{Context, Result, bail};

use crate::cmd;

fn cargo_fuzz_works() -> bool {
    Command::new("cargo")
        .args(["+nightly", "fuzz", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Installs cargo-fuzz if `cargo +nightly fuzz` does not run.
pub fn ensure_cargo_fuzz() -> Result<()> {
    if cargo_fuzz_works() {
        println!("[fuzz] cargo-fuzz: ok (already installed)");
        return Ok(());
    }
    println!("[fuzz] cargo-fuzz: installing (cargo install cargo-fuzz --locked)");
    let mut c = Command::new("cargo");
    c.args(["install", "cargo-fuzz", "--locked"]);
    cmd::stream(&mut c)?;
    if !cargo_fuzz_works() {
        bail!("cargo-fuzz was installed but `cargo +nightly fuzz --version` still fails");
    }
    Ok(())
}

/// Builds the seed corpus and fuzzes `parse_object` for `secs` seconds.
pub fn short_run(repo: &Path, secs: u32) -> Result<()> {
    ensure_cargo_fuzz()?;
    let fuzz = repo.join("symbols/fuzz");
    let corpus = fuzz.join("corpus/parse_object");
    std::fs::create_dir_all(&corpus).context("create the fuzz corpus directory")?;
    let data = repo.join("symbols/tests/data");
    for (compiler, src, out) in [
        ("gcc", "libmid.c", "libmid.so"),
        ("g++", "libcxx.cpp", "libcxx.so"),
    ] {
        let target = corpus.join(out);
        if target.exists() {
            continue;
        }
        let mut c = Command::new(compiler);
        c.args(["-O2", "-g", "-shared", "-fPIC"])
            .arg(data.join(src))
            .arg("-o")
            .arg(&target);
        cmd::output(&mut c)?;
    }
    // Inputs that crashed it once stay in the corpus (also checked by a symbols unit test).
    if let Ok(rd) = std::fs::read_dir(data.join("fuzz-regressions")) {
        for entry in rd.flatten() {
            let _ = std::fs::copy(entry.path(), corpus.join(entry.file_name()));
        }
    }
    let mut run = Command::new("cargo");
    run.current_dir(&fuzz)
        .args(["+nightly", "fuzz", "run", "parse_object"])
        .arg(&corpus)
        .args(["--", &format!("-max_total_time={secs}"), "-max_len=65536"]);
    println!("[fuzz] + {}", cmd::describe(&run));
    let status = cmd::interactive(&mut run)?;
    if !status.success() {
        cmd::report_failure("fuzz", &run, status);
        bail!("the fuzzer found a crash (see symbols/fuzz/artifacts)");
    }
    println!("[fuzz] parse_object: {secs} s, no crash");
    Ok(())
}
