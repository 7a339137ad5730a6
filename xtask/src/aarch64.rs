//! `cargo xtask setup --aarch64` and `cargo xtask test-aarch64`: the tracer on arm64, the
//! architecture Ascend hosts (Kunpeng) run on, checked in a qemu VM (TCG; no KVM needed).
//!
//! The host cross-builds the tracer (its BPF object with `bpf_target_arch="aarch64"`: aya-build
//! takes the arch from the cargo target), the C fixtures (`make -C tests/fixtures aarch64`) and a
//! documented subset of the integration tests ([`VM_TESTS`]). Debian's arm64 packages give the
//! rest: a kernel with BTF and uprobes (`linux-image-cloud-arm64`), busybox for the init script,
//! glibc, and binutils for the stack tests' own oracle (`addr2line`, `readelf`, `nm`). All of it
//! goes into one initramfs; the kernel boots it in `qemu-system-aarch64 -M virt`, the init script
//! runs the test binaries as root, and the host reads their results from the serial console.
//!
//! The arm64 packages come from a private apt state under `~/.cache/memscope-bpf/aarch64`
//! (`APT::Architecture=arm64`, its own lists): the machine's apt configuration and dpkg
//! architectures stay as they were.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::cmd;

mod cpio;
mod insn;
mod torch;
use cpio::Cpio;

const TAG: &str = "[aarch64]";
pub const TARGET: &str = "aarch64-unknown-linux-gnu";
/// Debian's cross toolchain prefix (`gcc-aarch64-linux-gnu`), also the linker in .cargo/config.toml.
const CROSS: &str = "aarch64-linux-gnu-";
/// The Debian release whose arm64 packages make the VM (its kernel, 6.12, has multi-uprobe
/// links, which the tracer needs: Linux 6.6+).
const SUITE: &str = "trixie";
const KERNEL_META: &str = "linux-image-cloud-arm64";
/// Packages extracted into the VM's root file system (their dependencies are listed too: the
/// VM has no dpkg, so nothing resolves them there).
const ROOTFS_PACKAGES: &[&str] = &[
    "busybox-static",
    "libc6",
    "libgcc-s1",
    "libstdc++6",
    // The stack tests' oracle: addr2line, readelf and nm of the arm64 binaries.
    "binutils-aarch64-linux-gnu",
    "libbinutils",
    "libctf-nobfd0",
    "libctf0",
    "libjansson4",
    "libsframe1",
    "libzstd1",
    "zlib1g",
];
/// What the kernel must have for the tracer (checked in its config).
const KERNEL_CONFIG: &[&str] = &[
    "CONFIG_BPF_SYSCALL=y",
    "CONFIG_DEBUG_INFO_BTF=y",
    "CONFIG_UPROBES=y",
    "CONFIG_UPROBE_EVENTS=y",
    "CONFIG_BPF_EVENTS=y",
    "CONFIG_BLK_DEV_INITRD=y",
    "CONFIG_SERIAL_AMBA_PL011_CONSOLE=y",
];

/// Which cross-built fixture tree a VM run uses.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Fixtures {
    /// `tests/fixtures/build-aarch64`: plain Armv8 code.
    Plain,
    /// `tests/fixtures/build-aarch64-pac`: every fixture built with
    /// `-mbranch-protection=standard` (return addresses signed with `paciasp`, BTI landing
    /// pads), which the VM's CPU (`-cpu max`) authenticates.
    Pac,
}

impl Fixtures {
    fn dir(self) -> &'static str {
        match self {
            Fixtures::Plain => "build-aarch64",
            Fixtures::Pac => "build-aarch64-pac",
        }
    }
}

/// One run of a test binary inside the VM: its label on the console, the binary, the
/// fixtures it runs against, and its tests.
pub struct VmTest {
    pub label: &'static str,
    pub bin: &'static str,
    pub fixtures: Fixtures,
    pub tests: &'static [&'static str],
    /// Runs on the real torch + torch_npu wheels: the venvs' disk is attached and mounted,
    /// `MEMSCOPE_TORCH_VENVS` names them.
    pub torch: bool,
}

/// The integration tests run inside the VM. Each checks the tracer's output against the
/// workload's own ground-truth log or an independent tool, so a wrong register for an
/// argument, the return value, the stack pointer or the link register fails one of them.
pub const VM_TESTS: &[VmTest] = &[
    VmTest {
        label: "trace",
        bin: "trace",
        fixtures: Fixtures::Plain,
        tests: &[
            // Launch mode: every call of a process tree (threads, devices, a child process),
            // exact counts, sizes, addresses and the leak report against the workload's log.
            "launch_mode_records_every_call_of_the_process_tree",
            // --pid: from attach on, and the blocks allocated before it.
            "attach_by_pid_traces_from_attach_on_and_reports_earlier_blocks",
            // A crashed target: every call up to the crash and its live blocks as leaks.
            "target_crash_loses_nothing_and_reports_live_blocks",
            // Frees left by siglongjmp: entries paired with returns by the stack pointer.
            "probed_calls_left_by_longjmp_leave_no_stale_entry",
        ],
        torch: false,
    },
    VmTest {
        // A probed library written in place loses its probes (the kernel would keep running
        // the old file's copied instructions) and is planned again at its next open: by a
        // launch session (multi-uprobe and perf links) and by the node agent (the next user
        // of the file runs right and is counted from its first call).
        label: "rewritten-library",
        bin: "rewritten_library",
        fixtures: Fixtures::Plain,
        tests: &[
            "a_session_plans_a_library_written_in_place_again",
            "an_agent_drops_its_probes_from_a_library_written_in_place",
        ],
        torch: false,
    },
    VmTest {
        // The node agent on arm64 (Ascend hosts): each workload's live bytes, allocation
        // counts and leak flag in /metrics against its log (the tests that also need
        // `go tool pprof`, Prometheus or a host python stay on x86-64).
        label: "agent-metrics",
        bin: "agent",
        fixtures: Fixtures::Plain,
        tests: &["agent_metrics_match_each_workloads_log_and_flag_only_the_leak"],
        torch: false,
    },
    VmTest {
        // The agent's hold beside a launch session: both hold the job at its open of the
        // HAL, both see all 12 of its allocations.
        label: "agent-hold",
        bin: "agent_hold",
        fixtures: Fixtures::Plain,
        tests: &["a_default_agent_leaves_a_launch_session_whole"],
        torch: false,
    },
    VmTest {
        label: "stacks",
        bin: "stacks",
        fixtures: Fixtures::Plain,
        tests: &[
            // C stacks through code built without frame pointers (CFI from the link register
            // at function entry) and with them, against addr2line and the workload's maps.
            "c_stacks_without_frame_pointers",
            "c_stacks_with_frame_pointers",
        ],
        torch: false,
    },
    VmTest {
        // The same stacks through code whose saved return addresses carry PAC bits.
        label: "stacks-pac",
        bin: "stacks",
        fixtures: Fixtures::Pac,
        tests: &[
            "c_stacks_without_frame_pointers",
            "c_stacks_with_frame_pointers",
        ],
        torch: false,
    },
    VmTest {
        // A C++ exception through Runner::Execute: return probes on its `ret`s, not a
        // uretprobe (signed return addresses too: the PAC fixtures).
        label: "atb-pac",
        bin: "atb",
        fixtures: Fixtures::Pac,
        tests: &["an_exception_thrown_through_runner_execute_reaches_its_catch"],
        torch: false,
    },
    VmTest {
        // PyPI's aarch64 torch + torch_npu of two releases (torch::RELEASES) on the simulated
        // CANN: every tensor's PTA row at its data_ptr() with memory_allocated() and
        // memory_reserved() exact, leaks with their steps, aclnn rows with their workspaces,
        // in launch mode and with --pid.
        label: "real-torch",
        bin: "real_torch",
        fixtures: Fixtures::Plain,
        tests: &["real_torch_npu_launch_mode", "real_torch_npu_attach_mode"],
        torch: true,
    },
    VmTest {
        // Python stacks on the same wheels: every PTA/HAL row's Python stack is the script's
        // own traceback.extract_stack() of that line (--pid, --call-stack=python), and in
        // launch mode the mixed view's C column runs from the report function into Python.
        label: "real-torch-python",
        bin: "real_torch_python",
        fixtures: Fixtures::Plain,
        tests: &[
            "real_torch_python_stacks_in_attach_mode",
            "real_torch_python_stacks_in_launch_mode_mixed",
        ],
        torch: true,
    },
];

fn cache_dir() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(".cache/memscope-bpf/aarch64"))
}

/// What setup leaves for the test: the kernel image and the extracted root file system.
pub struct VmParts {
    kernel: PathBuf,
    sysroot: PathBuf,
    kernel_version: String,
    torch: torch::TorchParts,
}

/// `cargo xtask setup --aarch64`: the cross compilers, qemu, the Rust target and the arm64
/// packages. Idempotent; quick once done.
pub fn setup() -> Result<VmParts> {
    let start = Instant::now();
    let tools = host_tools()?;
    println!("{TAG} host tools: ok ({tools})");
    let target = rust_target()?;
    println!("{TAG} rust target: ok ({target})");
    let parts = arm64_packages()?;
    println!(
        "{TAG} arm64 kernel {} and root file system: ok ({})",
        parts.kernel_version,
        parts.sysroot.display()
    );
    println!(
        "{TAG} CPython 3.11 and the torch venvs ({}): ok ({})",
        parts.torch.venvs.join(", "),
        parts.torch.disk.display()
    );
    println!("{TAG} setup done in {:.1}s", start.elapsed().as_secs_f64());
    Ok(parts)
}

fn have(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(tool).is_file()))
}

fn host_tools() -> Result<String> {
    let tools = [
        (format!("{CROSS}gcc"), "gcc-aarch64-linux-gnu"),
        (format!("{CROSS}g++"), "g++-aarch64-linux-gnu"),
        ("qemu-system-aarch64".to_owned(), "qemu-system-arm"),
    ];
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(tool, _)| !have(tool))
        .map(|(_, pkg)| *pkg)
        .collect();
    if !missing.is_empty() {
        if crate::effective_uid() != Some(0) {
            bail!(
                "missing Debian packages {}: install them (as root: apt-get install {})",
                missing.join(", "),
                missing.join(" ")
            );
        }
        println!("{TAG} installing {}", missing.join(" "));
        cmd::stream(Command::new("apt-get").arg("update"))?;
        cmd::stream(
            Command::new("apt-get")
                .args(["install", "-y", "--no-install-recommends"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    Ok(tools.map(|t| t.0).join(", "))
}

fn rust_target() -> Result<String> {
    let installed = cmd::output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if !installed.lines().any(|l| l.trim() == TARGET) {
        cmd::stream(Command::new("rustup").args(["target", "add", TARGET]))?;
    }
    Ok(TARGET.to_owned())
}

/// A private apt state in `apt_dir` for Debian's arm64 `suite` (the host's own lists and
/// archives untouched), its lists updated; [`apt`] runs a tool on it.
pub(crate) fn private_apt(apt_dir: &Path, suite: &str) -> Result<()> {
    for d in ["lists/partial", "cache/archives/partial"] {
        fs::create_dir_all(apt_dir.join(d))?;
    }
    fs::write(
        apt_dir.join("sources.list"),
        format!(
            "deb [arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
             http://deb.debian.org/debian {suite} main\n"
        ),
    )?;
    println!(
        "{TAG} apt-get update (arm64 {suite}, private lists in {})",
        apt_dir.display()
    );
    cmd::stream(apt("apt-get", apt_dir).arg("update"))
}

/// apt-get/apt-cache with the private arm64 state under `apt_dir`.
pub(crate) fn apt(tool: &str, apt_dir: &Path) -> Command {
    let mut c = Command::new(tool);
    let d = apt_dir.display();
    c.args([
        "-q",
        "-o",
        "APT::Architecture=arm64",
        "-o",
        "APT::Architectures::=arm64",
        "-o",
        &format!("Dir::Etc::SourceList={d}/sources.list"),
        "-o",
        "Dir::Etc::SourceParts=/nonexistent",
        "-o",
        &format!("Dir::State::Lists={d}/lists"),
        "-o",
        &format!("Dir::Cache={d}/cache"),
        "-o",
        "Dir::State::status=/dev/null",
        "-o",
        "APT::Sandbox::User=root",
    ]);
    c
}

fn arm64_packages() -> Result<VmParts> {
    let cache = cache_dir()?;
    let stamp = cache.join("ready");
    let kernel_dir = cache.join("kernel");
    let sysroot = cache.join("sysroot");
    if let Ok(version) = fs::read_to_string(&stamp) {
        let version = version.trim().to_owned();
        let kernel = kernel_dir.join(format!("boot/vmlinuz-{version}"));
        if kernel.is_file() && sysroot.join("usr/bin/busybox").is_file() {
            return Ok(VmParts {
                torch: torch::setup(&cache, &version)?,
                kernel,
                sysroot,
                kernel_version: version,
            });
        }
    }
    let apt_dir = cache.join("apt");
    private_apt(&apt_dir, SUITE)?;
    // The meta package names the current kernel package.
    let depends = cmd::output(apt("apt-cache", &apt_dir).args(["depends", KERNEL_META]))?;
    let kernel_pkg = depends
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: "))
        .filter(|p| p.starts_with("linux-image-"))
        .with_context(|| format!("no kernel package in `apt-cache depends {KERNEL_META}`"))?
        .to_owned();
    let debs = cache.join("debs");
    let _ = fs::remove_dir_all(&debs);
    fs::create_dir_all(&debs)?;
    println!(
        "{TAG} downloading {kernel_pkg} {}",
        ROOTFS_PACKAGES.join(" ")
    );
    cmd::stream(
        apt("apt-get", &apt_dir)
            .current_dir(&debs)
            .arg("download")
            .arg(&kernel_pkg)
            .args(ROOTFS_PACKAGES),
    )?;
    let _ = fs::remove_dir_all(&kernel_dir);
    let _ = fs::remove_dir_all(&sysroot);
    for entry in fs::read_dir(&debs)? {
        let deb = entry?.path();
        let name = deb.file_name().unwrap_or_default().to_string_lossy();
        let into = if name.starts_with("linux-image-") {
            &kernel_dir
        } else {
            &sysroot
        };
        cmd::output(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(into))?;
    }
    let version = kernel_pkg.trim_start_matches("linux-image-").to_owned();
    let config = fs::read_to_string(kernel_dir.join(format!("boot/config-{version}")))
        .with_context(|| format!("the config of {kernel_pkg}"))?;
    let missing: Vec<&str> = KERNEL_CONFIG
        .iter()
        .copied()
        .filter(|opt| !config.lines().any(|l| l == *opt))
        .collect();
    if !missing.is_empty() {
        bail!("{kernel_pkg} lacks {}", missing.join(", "));
    }
    // The modules are not needed (everything the VM uses is built in): 60 MB less to keep.
    let _ = fs::remove_dir_all(kernel_dir.join("lib/modules"));
    let _ = fs::remove_dir_all(kernel_dir.join("usr/lib/modules"));
    fs::write(&stamp, &version)?;
    Ok(VmParts {
        torch: torch::setup(&cache, &version)?,
        kernel: kernel_dir.join(format!("boot/vmlinuz-{version}")),
        sysroot,
        kernel_version: version,
    })
}

/// `cargo xtask test-aarch64`: cross-build, boot the VM, run [`VM_TESTS`] in it.
///
/// With `insn_cost`, the VM also times a tracefs uprobe on each first instruction of
/// `tests/fixtures/bench/uprobe_insns.S` after the tests (the arm64 half of the bench's insn
/// table; printed, never asserted).
pub fn test(
    repo: &Path,
    ready: &crate::setup::Ready,
    insn_cost: bool,
    only: Option<&str>,
) -> Result<u8> {
    let parts = setup()?;
    let start = Instant::now();
    // `--only A,B`: the runs and tests whose label or name contains A or B (a targeted run).
    let picks = |label: &str, test: &str| {
        only.is_none_or(|o| {
            o.split(',')
                .any(|o| !o.is_empty() && (test.contains(o) || label.contains(o)))
        })
    };
    let runs: Vec<(&VmTest, Vec<&str>)> = VM_TESTS
        .iter()
        .map(|r| {
            let picked = r
                .tests
                .iter()
                .copied()
                .filter(|t| picks(r.label, t))
                .collect();
            (r, picked)
        })
        .filter(|(_, tests): &(_, Vec<&str>)| !tests.is_empty())
        .collect();
    if runs.is_empty() {
        bail!("--only {only:?} names no test of the VM subset");
    }

    // The fixtures, cross-built into their own trees: plain, and signed with PAC.
    for target in ["aarch64", "aarch64-pac"] {
        let mut make = Command::new("make");
        make.current_dir(repo)
            .args(["-s", "-C", "tests/fixtures", target]);
        cmd::stream(&mut make)?;
    }

    let with_torch = runs.iter().any(|(r, _)| r.torch);
    if with_torch {
        torch::build_cann(repo, &parts.sysroot, &parts.torch)?;
    }

    // The tracer (its build script builds the BPF object for the aarch64 registers) and the
    // test binaries, release so the VM's emulated CPU runs less code.
    let cargo = |args: &[&str]| {
        let mut c = Command::new("cargo");
        c.current_dir(repo).args(args);
        ready.apply(&mut c);
        c
    };
    let build = [
        "build",
        "--release",
        "--target",
        TARGET,
        "-p",
        "memscope-bpf",
        "--bin",
    ];
    let mut c = cargo(&build);
    c.arg("memscope-bpf");
    println!("{TAG} + {}", cmd::describe(&c));
    cmd::stream(&mut c)?;
    let mut c = cargo(&[
        "test",
        "--release",
        "--target",
        TARGET,
        "-p",
        "memscope-bpf",
        "--no-run",
    ]);
    let mut bins: Vec<&str> = runs.iter().map(|(r, _)| r.bin).collect();
    bins.dedup();
    for bin in &bins {
        c.args(["--test", bin]);
    }
    println!("{TAG} + {}", cmd::describe(&c));
    let out = c
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", cmd::describe(&c)))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("building the test binaries failed:\n{stderr}");
    }
    let mut test_bins = Vec::new();
    for bin in bins {
        // "  Executable tests/trace.rs (target/aarch64-unknown-linux-gnu/release/deps/trace-…)"
        let needle = format!("Executable tests/{bin}.rs (");
        let path = stderr
            .lines()
            .find_map(|l| l.split_once(&needle).map(|(_, p)| p.trim_end_matches(')')))
            .with_context(|| format!("no test binary for tests/{bin}.rs in:\n{stderr}"))?;
        test_bins.push((bin, repo.join(path)));
    }
    let tracer = repo.join(format!("target/{TARGET}/release/memscope-bpf"));
    println!("{TAG} cross-built in {:.0}s", start.elapsed().as_secs_f64());

    let vm_dir = repo.join("target/aarch64-vm");
    fs::create_dir_all(&vm_dir)?;
    let initramfs = vm_dir.join("initramfs.cpio");
    let mut cpio = Cpio::create(&initramfs)?;
    cpio.tree(&parts.sysroot, "")?;
    for d in ["proc", "sys", "dev", "tmp", "run", "vm", "vm/tests"] {
        cpio.dir(d)?;
    }
    for (link, to) in [("lib", "usr/lib"), ("bin", "usr/bin"), ("sbin", "usr/bin")] {
        if !parts.sysroot.join(link).exists() {
            cpio.symlink(link, to)?;
        }
    }
    // The binaries of arm64 binutils under their plain names, as the tests call them.
    for tool in ["addr2line", "readelf", "nm"] {
        cpio.symlink(&format!("usr/bin/{tool}"), &format!("{CROSS}{tool}"))?;
    }
    // The tracer where the test binaries were told it is (CARGO_BIN_EXE_memscope-bpf).
    cpio.file_at(&tracer, &rel(&tracer)?)?;
    for fixtures in [Fixtures::Plain, Fixtures::Pac] {
        cpio.tree(
            &repo.join("tests/fixtures").join(fixtures.dir()),
            &format!("vm/{}", fixtures.dir()),
        )?;
    }
    let mut script = String::from(INIT_HEAD);
    if with_torch {
        torch::into_vm(&mut cpio, &mut script, repo, &parts.torch)?;
    }
    for (bin, path) in &test_bins {
        cpio.file_at(path, &format!("vm/tests/{bin}"))?;
    }
    for (run, tests) in &runs {
        script.push_str(&format!(
            "export MEMSCOPE_FIXTURES_DIR=/vm/{}\nrun {} /vm/tests/{} --exact --test-threads=1 {}\n",
            run.fixtures.dir(),
            run.label,
            run.bin,
            tests.join(" ")
        ));
    }
    if insn_cost {
        script.push_str(&format!(
            "INSN=/vm/{}/bin/insn_cost\n",
            Fixtures::Plain.dir()
        ));
        script.push_str(insn::INSN_COST);
    }
    script.push_str(INIT_TAIL);
    cpio.bytes("init", script.as_bytes(), 0o755)?;
    let size = cpio.finish()?;
    println!(
        "{TAG} initramfs: {} ({:.0} MiB)",
        initramfs.display(),
        size as f64 / (1 << 20) as f64
    );

    let disk = with_torch.then_some(parts.torch.disk.as_path());
    let results = boot(&parts.kernel, &initramfs, disk)?;
    if insn_cost {
        insn::insn_table(&results);
    }
    judge(&results, &runs)
}

pub(crate) fn rel(path: &Path) -> Result<String> {
    let abs = std::path::absolute(path)?;
    Ok(abs
        .to_str()
        .context("non-UTF-8 path")?
        .trim_start_matches('/')
        .to_owned())
}

pub(crate) const MARK: &str = "@@memscope-vm";

const INIT_HEAD: &str = r#"#!/usr/bin/busybox sh
/usr/bin/busybox --install -s /usr/bin
export PATH=/usr/bin HOME=/tmp RUST_BACKTRACE=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t bpf bpf /sys/fs/bpf
# Loopback: the agent's tests talk HTTP to it.
ip link set lo up
echo "@@memscope-vm kernel $(uname -r) $(uname -m) btf=$(test -e /sys/kernel/btf/vmlinux && echo yes || echo no) uid=$(id -u)"
run() {
    name=$1; shift
    echo "@@memscope-vm begin $name"
    "$@"
    echo "@@memscope-vm end $name rc=$?"
}
"#;

const INIT_TAIL: &str = r#"echo "@@memscope-vm done"
poweroff -f
"#;

/// What the VM reported: the serial console's lines.
pub(crate) struct VmRun {
    pub(crate) lines: Vec<String>,
    timed_out: bool,
}

fn boot(kernel: &Path, initramfs: &Path, disk: Option<&Path>) -> Result<VmRun> {
    let timeout = std::env::var("MEMSCOPE_AARCH64_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        // The real-torch runs add ~10 minutes of emulation to the fixtures' tests.
        .unwrap_or(3600u64);
    // `max`: every feature qemu emulates, pointer authentication among them (Armv8.3), so the
    // PAC-built fixtures' return addresses are signed and authenticated; the implementation-
    // defined PAC algorithm is the fast one under TCG (QARMA5 is several times slower).
    // Without SVE/SME, which Kunpeng 920 lacks too: with plain `max` (glibc then picks its
    // SVE string functions) a single launch-mode test ran over 20 minutes on the loaded
    // 2-core host without ending. The plain fixtures run on it as on an Armv8.2 core such
    // as Kunpeng 920's (no PAC instructions in them).
    let mut qemu = Command::new("nice");
    qemu.args(["-n", "10", "qemu-system-aarch64"])
        .args([
            "-M",
            "virt",
            "-cpu",
            "max,sve=off,sme=off,pauth-impdef=on",
            "-smp",
            "2",
            "-m",
            // torch's processes (the traced script, and the tracer's view of it) need more
            // than the fixtures' 2 GiB.
            if disk.is_some() { "4096" } else { "2048" },
        ])
        .args(["-accel", "tcg,thread=multi"])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initramfs);
    if let Some(disk) = disk {
        // Read-only: the venvs are the same at every run.
        qemu.arg("-drive")
            .arg(format!(
                "file={},format=raw,if=none,id=venvs,readonly=on",
                disk.display()
            ))
            .args(["-device", "virtio-blk-pci,drive=venvs"]);
    }
    qemu.args([
        "-append",
        "console=ttyAMA0 rdinit=/init panic=-1 loglevel=4",
        "-display",
        "none",
        "-monitor",
        "none",
        "-serial",
        "stdio",
        "-no-reboot",
        // No network: the tests need none (and the default NIC wants a ROM file).
        "-nic",
        "none",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    println!("{TAG} + {} (timeout {timeout}s)", cmd::describe(&qemu));
    let start = Instant::now();
    let mut child = qemu.spawn().context("starting qemu-system-aarch64")?;
    let pid = child.id();
    let finished = Arc::new(AtomicBool::new(false));
    let timed_out = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let finished = finished.clone();
        let timed_out = timed_out.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(timeout);
            while Instant::now() < deadline {
                if finished.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            timed_out.store(true, Ordering::Relaxed);
            // SAFETY: kill(2) on the qemu we started (still our child: not yet waited for).
            unsafe { kill(pid as i32, 9) };
        })
    };
    let stdout = child.stdout.take().expect("piped");
    let mut lines = Vec::new();
    for line in BufReader::new(stdout).split(b'\n') {
        let line = String::from_utf8_lossy(&line?).trim_end().to_owned();
        println!("[vm {:>4.0}s] {line}", start.elapsed().as_secs_f64());
        lines.push(line);
    }
    let status = child.wait()?;
    finished.store(true, Ordering::Relaxed);
    let _ = watchdog.join();
    println!(
        "{TAG} VM exited ({status}) after {:.0}s",
        start.elapsed().as_secs_f64()
    );
    Ok(VmRun {
        lines,
        timed_out: timed_out.load(Ordering::Relaxed),
    })
}

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

/// Every selected test must have run, as root, and passed.
fn judge(run: &VmRun, runs: &[(&VmTest, Vec<&str>)]) -> Result<u8> {
    let mut problems = Vec::new();
    if run.timed_out {
        problems.push("the VM ran out of time (MEMSCOPE_AARCH64_TIMEOUT)".to_owned());
    }
    match run
        .lines
        .iter()
        .find_map(|l| l.split_once(&format!("{MARK} kernel ")))
    {
        Some((_, what)) => {
            println!("{TAG} VM: {what}");
            if !what.contains("aarch64") || !what.contains("btf=yes") || !what.contains("uid=0") {
                problems.push(format!(
                    "the VM is not an arm64 kernel with BTF run as root: {what}"
                ));
            }
        }
        None => problems.push("the VM's init never ran".to_owned()),
    }
    if !run.lines.iter().any(|l| l == &format!("{MARK} done")) {
        problems.push("the VM's init did not finish".to_owned());
    }
    let (mut passed, mut failed) = (0usize, 0usize);
    for (test_run, tests) in runs {
        let label = test_run.label;
        // This run's lines: between its begin and end markers (a binary may run twice).
        let begin = format!("{MARK} begin {label}");
        let end_prefix = format!("{MARK} end {label} rc=");
        let section: Vec<&String> = run
            .lines
            .iter()
            .skip_while(|l| **l != begin)
            .take_while(|l| !l.starts_with(&end_prefix))
            .collect();
        let end = run.lines.iter().find_map(|l| l.strip_prefix(&end_prefix));
        if end != Some("0") {
            problems.push(format!(
                "{label} (tests/{}.rs) exited with {end:?} in the VM",
                test_run.bin
            ));
        }
        for test in tests {
            if section.iter().any(|l| **l == format!("test {test} ... ok")) {
                passed += 1;
            } else {
                failed += 1;
                problems.push(format!("{label}::{test} did not pass"));
            }
        }
    }
    if run.lines.iter().any(|l| l.contains("SKIPPED")) {
        problems.push("a test was SKIPPED in the VM".to_owned());
    }
    for p in &problems {
        println!("{TAG} FAILED: {p}");
    }
    println!("{passed} passed, {failed} failed");
    Ok(if problems.is_empty() { 0 } else { 1 })
}
