//! Developer task runner for memscope-bpf (`cargo xtask <command>`).
//!
//! The two commands for the README:
//!
//! ```text
//! # Prepare the machine (once; quick when already done), build and run all tests
//! # (as root: the tests load BPF programs, and are skipped loudly otherwise):
//! cargo xtask test
//!
//! # Trace the demo training fixture and show where the results were written:
//! cargo xtask demo
//! ```

mod aarch64;
mod bench;
mod cmd;
mod cuda_bed;
mod demo;
mod disk;
mod fuzz;
mod gpu;
mod mindspore_bed;
mod setup;
mod torch_bed;

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

const USAGE: &str = "\
cargo xtask <command>

Commands:
  setup [--force-bpf-linker] [--bpf-linker-root DIR] [--aarch64]
        Make this machine ready: nightly toolchain + rust-src, bpf-linker built
        against nightly's LLVM, the C fixtures (make -C tests/fixtures), the real
        torch/torch_npu test bed (two releases from PyPI in cached venvs, ~6 GB
        each, downloaded once; MEMSCOPE_TORCH_BED=off skips it) with its simulated
        CANN, the CUDA test bed (PyPI's CUDA torch 2.8.0 without its nvidia-*
        wheels, ~0.9 GB downloaded once, on a simulated libcudart;
        MEMSCOPE_CUDA_BED=off skips it), and checks for kernel BTF and root. Idempotent; quick once done.
        --force-bpf-linker       reinstall bpf-linker even if a working one exists
        --bpf-linker-root DIR    install bpf-linker under DIR (cargo install --root)
        --aarch64                also what test-aarch64 needs (never by default):
                                 Debian's gcc-aarch64-linux-gnu and qemu-system-arm,
                                 the Rust target, and arm64 packages (kernel with BTF,
                                 busybox, glibc, binutils; ~60 MB) in a private apt
                                 state under ~/.cache/memscope-bpf/aarch64, bookworm's
                                 arm64 CPython 3.11 (~8 MB) and the aarch64 torch +
                                 torch_npu wheels of 2.8.0.post2 and 2.5.1 (~230 MB) as
                                 two venvs and their ext4 image (~2.6 GB on disk)
  test [-- ARGS...]
        setup, then `cargo build --all-targets` and `cargo test ARGS...` (the
        workspace's default members; RUST_BACKTRACE=1), then a short fuzz run of the
        ELF/DWARF parsers (MEMSCOPE_FUZZ_SECS, default 30; 0 skips it; installs
        cargo-fuzz on first use). Exits with cargo's status, 1 if the fuzzer crashes.
        e.g. cargo xtask test -- -p memscope-bpf -- --nocapture
  test-aarch64 [--insn-cost] [--only A,B]
        The tracer on arm64 (Ascend hosts are aarch64): cross-builds the tracer, its
        BPF object for the aarch64 registers, the fixtures (build-aarch64/, and
        build-aarch64-pac/ with -mbranch-protection=standard) and a
        subset of the integration tests, boots Debian's arm64 kernel in
        qemu-system-aarch64 (TCG) with them in an initramfs (and the aarch64
        torch/torch_npu venvs on a disk image for the real-torch runs), runs the
        tests there as root and reads the results from the serial console
        (docs/aarch64.md). Runs `setup --aarch64` first. Not part of `test`:
        ~25-40 min of emulation.
        MEMSCOPE_AARCH64_TIMEOUT: seconds the VM may run (default 3600).
        --insn-cost: then also time a uprobe on each first instruction of
        tests/fixtures/bench/uprobe_insns.S in the VM (docs/placement.md).
        --only A,B: only the runs and tests whose label or name contains A or B.
  test-gpu
        The CUDA source on a real NVIDIA GPU (for a person to run there; never part
        of `test`): PyPI's torch 2.8.0 with its nvidia-* wheels (~4 GB once) in
        ~/.cache/memscope-bpf/cuda/venv-torch-2.8.0-gpu, tests/real_cuda.rs on the
        real driver, and a training step's time untraced and traced side by side
        (target/test-gpu/step_time.txt). Not yet run on real hardware.
  fuzz [SECONDS]
        The short fuzz run of the ELF/DWARF/CFI parsers that `test` ends with
        (default 30 s; installs cargo-fuzz on first use).
  demo [--screenshot PNG]
        setup (only what the demo needs: no torch test bed, no test tools), build the
        tracer (release) and trace tests/fixtures/build/bin/demo_train with C stacks
        and --report, writing to target/demo; then list the files this run wrote.
        Needs root.
        --screenshot PNG   also render the run's report.html with headless Chromium
                           (Debian's chromium, installed by setup) into PNG, 1100x1000
                           like the README's picture: e.g. docs/img/report.png
  bench [--quick] [--rounds N] [--loss-seconds S] [--events N] [--only SECTIONS]
        The benchmark suite (root; never part of `test`): uprobe cost per instruction,
        target overhead side by side (untraced, empty BPF programs, memscope-bpf,
        bpftrace, LD_PRELOAD), stack capture cost, probe placement, no-loss under load,
        symbolization/unwinding rates and cold start, user-space throughput. Writes docs/benchmarks.md and docs/benchmarks/{raw.csv,results.json}
        (a run with --only writes *-partial files instead).
        SECTIONS: comma-separated from
        insn,overhead,stacks,placement,loss,symbols,replay.
        --quick: 3 rounds, 10 s loss run, 2 M replayed events.
  help
        This text.
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("[xtask] error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<u8> {
    let Some((command, rest)) = args.split_first() else {
        print!("{USAGE}");
        return Ok(0);
    };
    let repo = repo_root()?;
    match command.as_str() {
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(0)
        }
        "setup" => {
            let opts = setup_options(rest)?;
            setup::run(&repo, &opts)?;
            if opts.aarch64 {
                aarch64::setup()?;
            }
            Ok(0)
        }
        "test-gpu" => gpu::run(&repo),
        "test-aarch64" => {
            let (mut insn_cost, mut only) = (false, None);
            let mut args = rest.iter();
            while let Some(arg) = args.next() {
                match arg.as_str() {
                    "--insn-cost" => insn_cost = true,
                    "--only" => match args.next() {
                        Some(name) => only = Some(name.as_str()),
                        None => bail!("`--only` needs a test name\n\n{USAGE}"),
                    },
                    _ => bail!("unknown option for `test-aarch64`: `{arg}`\n\n{USAGE}"),
                }
            }
            let ready = setup::run(&repo, &setup::Options::default())?;
            aarch64::test(&repo, &ready, insn_cost, only)
        }
        "test" => test(&repo, rest),
        "fuzz" => {
            let secs = rest.first().map(|s| s.parse()).transpose()?.unwrap_or(30);
            fuzz::short_run(&repo, secs).map(|()| 0)
        }
        "bench" => bench::run(&repo, bench::parse(rest)?),
        "demo" => {
            let opts = demo::parse(rest).map_err(|e| anyhow::anyhow!("{e}\n\n{USAGE}"))?;
            demo::run(&repo, &opts)
        }
        other => bail!("unknown command `{other}`\n\n{USAGE}"),
    }
}

fn setup_options(args: &[String]) -> Result<setup::Options> {
    let mut opts = setup::Options::default();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--force-bpf-linker" => opts.force_bpf_linker = true,
            "--aarch64" => opts.aarch64 = true,
            "--bpf-linker-root" => {
                let dir = args.next().context("--bpf-linker-root needs a directory")?;
                opts.bpf_linker_root = Some(absolute(dir)?);
            }
            other => match other.strip_prefix("--bpf-linker-root=") {
                Some(dir) => opts.bpf_linker_root = Some(absolute(dir)?),
                None => bail!("unknown option for `setup`: `{other}`\n\n{USAGE}"),
            },
        }
    }
    Ok(opts)
}

fn absolute(dir: &str) -> Result<PathBuf> {
    std::path::absolute(dir).with_context(|| format!("resolving {dir}"))
}

/// The workspace root: the parent of this crate's manifest directory.
fn repo_root() -> Result<PathBuf> {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest_dir
        .parent()
        .map(PathBuf::from)
        .context("CARGO_MANIFEST_DIR has no parent directory")
}

/// The effective user id, from /proc (no libc needed).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    // Uid: real effective saved filesystem
    line.split_whitespace().nth(2)?.parse().ok()
}

/// A `cargo` command run in the repo root with `RUST_BACKTRACE=1` and setup's environment.
fn cargo(repo: &std::path::Path, ready: &setup::Ready) -> Command {
    let mut c = Command::new("cargo");
    c.current_dir(repo).env("RUST_BACKTRACE", "1");
    ready.apply(&mut c);
    c
}

fn test(repo: &std::path::Path, args: &[String]) -> Result<u8> {
    // `cargo xtask test -- ARGS` arrives as ["--", ARGS...]; accept ARGS without it too.
    let extra = match args.split_first() {
        Some((first, rest)) if first == "--" => rest,
        _ => args,
    };
    disk::preflight(repo)?;
    let ready = setup::run(repo, &setup::Options::default())?;

    // Plain `cargo build`/`cargo test` in the root use the workspace's default members;
    // `--workspace` would also take probe-ebpf, which only builds for the BPF target.
    let mut build = cargo(repo, &ready);
    build.args(["build", "--all-targets"]);
    println!("[test] + {}", cmd::describe(&build));
    let status = cmd::interactive(&mut build)?;
    if !status.success() {
        cmd::report_failure("test", &build, status);
        return Ok(cmd::exit_code(status));
    }

    let tmp = disk::fresh_test_tmp(repo)?;
    let mut test = cargo(repo, &ready);
    test.arg("test").args(extra).env("TMPDIR", &tmp);
    if torch_bed::enabled() {
        let venvs = torch_bed::venvs()?;
        test.env(torch_bed::VENVS_ENV, std::env::join_paths(venvs)?);
    }
    // Installed by setup's torch bed step (the simulated CANN is built for both); when it was
    // skipped, the MindSpore tests say SKIPPED.
    if mindspore_bed::enabled() && torch_bed::enabled() && mindspore_bed::installed() {
        test.env(mindspore_bed::VENV_ENV, mindspore_bed::venv()?);
    }
    if cuda_bed::enabled() && cuda_bed::installed() {
        test.env(cuda_bed::VENV_ENV, cuda_bed::venv()?);
    }
    println!("[test] + {}", cmd::describe(&test));
    let (status, totals) = cmd::cargo_test(&mut test)?;
    if !status.success() {
        cmd::report_failure("test", &test, status);
    }
    if !ready.is_root {
        println!("[test] note: not root, so the tests that load BPF programs were skipped");
    }
    if !status.success() {
        println!(
            "[test] the failed tests' scratch directories are kept in {}",
            tmp.display()
        );
        println!("{} passed, {} failed", totals.passed, totals.failed);
        return Ok(cmd::exit_code(status));
    }
    disk::sweep_test_tmp(&tmp)?;
    // A short fuzz run of the object-file parsers must not find a crash.
    let secs = std::env::var("MEMSCOPE_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    if secs > 0 {
        fuzz::short_run(repo, secs)?;
    }
    // All test binaries together (cargo's own last lines are doc-test runs of 0 tests).
    println!("{} passed, {} failed", totals.passed, totals.failed);
    Ok(0)
}
