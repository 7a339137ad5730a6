//! The real torch + torch_npu wheels in the arm64 VM (issue 26, item 4): PyPI's aarch64 wheels
//! of two torch_npu releases, the CPython 3.11 they install on (Debian bookworm's arm64
//! packages: trixie's 3.13 has no torch_npu wheel) and the simulated CANN cross-built for them.
//!
//! The wheels (~1.4 GB installed) are too big for the initramfs: each release is a venv on an
//! ext4 disk image (`mke2fs -d`, no root mount), which the VM mounts read-only at
//! [`VENVS_IN_VM`] through virtio-blk (a module in Debian's cloud kernel, loaded by the init
//! script). CPython itself (~30 MB) goes into the initramfs at `/usr`, where a venv's
//! `pyvenv.cfg` finds it. Everything is precompiled to bytecode on the host (whose
//! `python3` must be 3.11, as the VM's: the same bytecode), so the emulated CPU does not
//! compile torch's sources at every import.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::cpio::Cpio;
use super::{Fixtures, MARK, TAG, apt, private_apt, rel};
use crate::cmd;

/// (torch, torch_npu, numpy requirement): the releases of the x86-64 bed's two layouts
/// (`MemoryUsage` with `component_type`, and the original one), as PyPI serves them for
/// aarch64 cp311.
pub const RELEASES: [(&str, &str, &str); 2] = [
    ("2.8.0", "2.8.0.post2", "numpy"),
    ("2.5.1", "2.5.1", "numpy<2"),
];
/// torch's own requirements (pip cannot resolve them for another architecture: it evaluates
/// the wheel's `platform_machine` markers on the host, and asks for the x86-64 nvidia wheels),
/// and torch_npu's.
const DEPS: &[&str] = &[
    "pyyaml",
    "filelock",
    "typing-extensions",
    "sympy",
    "networkx",
    "jinja2",
    "fsspec",
];
/// Debian bookworm's arm64 CPython 3.11 and the libraries its interpreter and extension
/// modules link (the VM has no dpkg: dependencies are listed, not resolved).
const PYTHON_SUITE: &str = "bookworm";
const PYTHON_PACKAGES: &[&str] = &[
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
    "libexpat1",
    "libssl3",
    "libbz2-1.0",
    "libcrypt1",
    "libffi8",
    "liblzma5",
    "libsqlite3-0",
    "libuuid1",
    "libtirpc3",
    "libnsl2",
    "libgssapi-krb5-2",
    "libkrb5-3",
    "libk5crypto3",
    "libkrb5support0",
    "libcom-err2",
    "libkeyutils1",
];
const PLATFORMS: &[&str] = &[
    "manylinux_2_28_aarch64",
    "manylinux_2_17_aarch64",
    "manylinux2014_aarch64",
];
/// Where the VM mounts the venvs' disk.
pub const VENVS_IN_VM: &str = "/vm/venvs";
/// The VM's CPython, whose path the venvs' `pyvenv.cfg` and `bin/python` name.
const PYTHON_IN_VM: &str = "/usr/bin/python3.11";
/// How many times the host's time the real-torch tests' waits get in the VM (`import torch`
/// takes 45-100 s under TCG: see docs/aarch64.md).
const PATIENCE: u32 = 10;
/// Bumped when what the disk holds changes, so setup remakes it.
const DISK_VERSION: &str = "1";

/// What setup leaves for the VM's real-torch run.
pub struct TorchParts {
    /// CPython's root file system (`usr/...`), for the initramfs.
    pub python_root: PathBuf,
    /// The venvs' ext4 image.
    pub disk: PathBuf,
    /// virtio-blk, uncompressed, from the VM kernel's package.
    pub virtio_blk: PathBuf,
    /// Each release's venv directory name (`torch-2.8.0_npu-2.8.0.post2`).
    pub venvs: Vec<String>,
    /// Each venv's site-packages on the host (the CANN stubs are generated from them).
    pub sites: Vec<PathBuf>,
}

pub fn venv_name(torch: &str, npu: &str) -> String {
    format!("torch-{torch}_npu-{npu}")
}

/// Idempotent: each step leaves a marker and is skipped when its marker is there.
pub fn setup(cache: &Path, kernel_version: &str) -> Result<TorchParts> {
    let python_root = python(cache)?;
    let venvs_dir = cache.join("venvs");
    let wheels = cache.join("wheels");
    let mut venvs = Vec::new();
    let mut sites = Vec::new();
    for (torch, npu, numpy) in RELEASES {
        let name = venv_name(torch, npu);
        let dir = venvs_dir.join(&name);
        venv(&dir, &wheels, torch, npu, numpy)?;
        sites.push(dir.join("lib/python3.11/site-packages"));
        venvs.push(name);
    }
    let disk = disk(cache, &venvs_dir, &venvs)?;
    let virtio_blk = virtio_blk(cache, kernel_version)?;
    Ok(TorchParts {
        python_root,
        disk,
        virtio_blk,
        venvs,
        sites,
    })
}

/// Debian bookworm's arm64 python3.11, unpacked, its `/lib` merged into `/usr/lib` as in the
/// VM's (trixie's) layout, the standard library precompiled.
fn python(cache: &Path) -> Result<PathBuf> {
    let root = cache.join("python-root");
    let marker = root.join(".memscope-ready");
    if marker.is_file() {
        return Ok(root);
    }
    let host = cmd::output(Command::new("python3").arg("--version"))?;
    if !host.trim().starts_with("Python 3.11.") {
        bail!(
            "the host's python3 is {}, the VM's CPython is 3.11: its bytecode and pip's \
             cp311 wheel choice need a python3.11 here",
            host.trim()
        );
    }
    let apt_dir = cache.join("apt-bookworm");
    private_apt(&apt_dir, PYTHON_SUITE)?;
    let debs = cache.join("python-debs");
    let _ = fs::remove_dir_all(&debs);
    fs::create_dir_all(&debs)?;
    cmd::stream(
        apt("apt-get", &apt_dir)
            .current_dir(&debs)
            .arg("download")
            .args(PYTHON_PACKAGES),
    )?;
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(&root)?;
    for entry in fs::read_dir(&debs)? {
        cmd::output(
            Command::new("dpkg-deb")
                .arg("-x")
                .arg(entry?.path())
                .arg(&root),
        )?;
    }
    // bookworm's packages put some libraries in /lib; the VM's /lib is a link to /usr/lib.
    if root.join("lib").is_dir() {
        cmd::output(
            Command::new("cp")
                .args(["-a", "--"])
                .arg(root.join("lib/."))
                .arg(root.join("usr/lib")),
        )?;
        fs::remove_dir_all(root.join("lib"))?;
    }
    let _ = fs::remove_dir_all(root.join("usr/share"));
    compile(&root.join("usr/lib/python3.11"), "/usr/lib/python3.11")?;
    fs::write(&marker, "")?;
    Ok(root)
}

/// Bytecode for every source under `dir` (seen in the VM at `as_in_vm`), checked by hash of
/// nothing (`unchecked-hash`): the archive and the disk image keep no reliable mtimes.
fn compile(dir: &Path, as_in_vm: &str) -> Result<()> {
    println!("{TAG} precompiling {}", dir.display());
    // compileall exits 1 when some file does not compile (a few templates and tests of the
    // wheels are not Python 3.11); the rest is compiled all the same.
    let _ = cmd::output(
        Command::new("python3")
            .args([
                "-m",
                "compileall",
                "-q",
                "-j0",
                "--invalidation-mode",
                "unchecked-hash",
                "-s",
            ])
            .arg(dir)
            .args(["-p", as_in_vm])
            .arg(dir),
    );
    Ok(())
}

/// One release's venv: the aarch64 wheels (torch_npu without its dependencies: it pins a
/// `+cpu` torch that PyPI does not serve), a `pyvenv.cfg` naming the VM's CPython.
fn venv(dir: &Path, wheels: &Path, torch: &str, npu: &str, numpy: &str) -> Result<()> {
    let marker = dir.join(".memscope-ready");
    if marker.is_file() {
        return Ok(());
    }
    fs::create_dir_all(wheels)?;
    let _ = fs::remove_dir_all(dir);
    let site = dir.join("lib/python3.11/site-packages");
    fs::create_dir_all(&site)?;
    let pip = |args: &[&str]| {
        let mut c = Command::new("python3");
        c.args(["-m", "pip"])
            .args(args)
            .args(["-q", "--disable-pip-version-check", "--only-binary=:all:"])
            .args(["--python-version", "3.11", "--implementation", "cp"]);
        for p in PLATFORMS {
            c.args(["--platform", p]);
        }
        c
    };
    println!(
        "{TAG} torch {torch} + torch_npu {npu} (aarch64 wheels) into {}",
        dir.display()
    );
    cmd::stream(
        pip(&["download", "--no-deps"])
            .arg("-d")
            .arg(wheels)
            .arg(format!("torch=={torch}"))
            .arg(format!("torch_npu=={npu}")),
    )?;
    let wheel = |prefix: &str| -> Result<PathBuf> {
        fs::read_dir(wheels)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".whl"))
            })
            .with_context(|| format!("no {prefix}*.whl in {}", wheels.display()))
    };
    cmd::stream(
        pip(&["install", "--no-deps", "--no-compile"])
            .arg("--target")
            .arg(&site)
            .arg(wheel(&format!("torch-{torch}-"))?)
            .arg(wheel(&format!("torch_npu-{npu}-"))?),
    )?;
    cmd::stream(
        pip(&["install", "--no-compile"])
            .arg("--target")
            .arg(&site)
            .arg(numpy)
            .args(DEPS),
    )?;
    // What the VM never reads: C++ headers and static libraries (a third of torch).
    let _ = fs::remove_dir_all(site.join("torch/include"));
    let _ = fs::remove_dir_all(site.join("torch_npu/include"));
    compile(
        &site,
        &format!(
            "{VENVS_IN_VM}/{}/lib/python3.11/site-packages",
            file_name(dir)?
        ),
    )?;
    fs::create_dir_all(dir.join("bin"))?;
    for name in ["python", "python3"] {
        let link = dir.join("bin").join(name);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(PYTHON_IN_VM, &link)?;
    }
    fs::write(
        dir.join("pyvenv.cfg"),
        "home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11\n",
    )?;
    fs::write(&marker, "")?;
    Ok(())
}

fn file_name(p: &Path) -> Result<&str> {
    p.file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} has no UTF-8 file name", p.display()))
}

/// The venvs as an ext4 image (`mke2fs -d`: no mount, no root needed), remade when a venv
/// or [`DISK_VERSION`] changed.
fn disk(cache: &Path, venvs_dir: &Path, venvs: &[String]) -> Result<PathBuf> {
    let image = cache.join("venvs.ext4");
    let stamp = cache.join("venvs.ext4.ready");
    let want = format!("{DISK_VERSION} {}", venvs.join(" "));
    if image.is_file() && fs::read_to_string(&stamp).is_ok_and(|s| s == want) {
        return Ok(image);
    }
    // Only the listed venvs: a staging directory of hard links would do too, but the venvs
    // directory holds exactly these.
    let size = cmd::output(Command::new("du").args(["-sm"]).arg(venvs_dir))?;
    let mib: u64 = size
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .context("du -sm")?;
    let _ = fs::remove_file(&image);
    println!(
        "{TAG} venvs disk image {} ({mib} MiB of venvs)",
        image.display()
    );
    cmd::output(
        Command::new("mke2fs")
            .args(["-q", "-t", "ext4", "-L", "memscope-venvs", "-d"])
            .arg(venvs_dir)
            .arg(&image)
            .arg(format!("{}M", mib + mib / 4 + 64)),
    )?;
    fs::write(&stamp, want)?;
    Ok(image)
}

/// `virtio_blk.ko` from the kernel's package (the cloud kernel builds it as a module; setup
/// drops the modules tree).
fn virtio_blk(cache: &Path, version: &str) -> Result<PathBuf> {
    let module = cache.join("kernel/virtio_blk.ko");
    if module.is_file() {
        return Ok(module);
    }
    let deb = fs::read_dir(cache.join("debs"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("linux-image-{version}_")))
        })
        .context("the kernel's .deb is not in the aarch64 cache (rerun setup --aarch64)")?;
    let tmp = cache.join("kernel/modules.tmp");
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;
    let member = format!("./usr/lib/modules/{version}/kernel/drivers/block/virtio_blk.ko.xz");
    cmd::output(Command::new("sh").arg("-c").arg(format!(
        "dpkg-deb --fsys-tarfile '{}' | tar -x -C '{}' '{member}'",
        deb.display(),
        tmp.display()
    )))?;
    let xz = tmp.join(&member);
    cmd::output(Command::new("xz").args(["-d", "-k"]).arg(&xz))?;
    fs::rename(xz.with_extension(""), &module)?;
    fs::remove_dir_all(&tmp)?;
    Ok(module)
}

/// The simulated CANN for the venvs' torch_npu, cross-built into `build-aarch64/cann`.
pub fn build_cann(repo: &Path, sysroot: &Path, parts: &TorchParts) -> Result<PathBuf> {
    let sites: Vec<String> = parts
        .sites
        .iter()
        .map(|s| s.display().to_string())
        .collect();
    cmd::stream(
        Command::new("make")
            .current_dir(repo)
            .args(["-s", "-C", "tests/fixtures", "aarch64-cann"])
            .arg(format!("CANN_SITES={}", sites.join(" ")))
            .arg(format!("AARCH64_SYSROOT={}", sysroot.display()))
            .arg(format!(
                "AARCH64_PYTHON={}",
                parts.python_root.join("usr/bin/python3.11").display()
            )),
    )?;
    Ok(repo.join("tests/fixtures/build-aarch64/cann"))
}

/// What the runs on the wheels need in the VM: CPython, the scripts, the venvs' disk mounted,
/// and the tests' environment.
pub fn into_vm(
    cpio: &mut Cpio,
    script: &mut String,
    repo: &Path,
    parts: &TorchParts,
) -> Result<()> {
    // CPython at /usr (the venvs' pyvenv.cfg names /usr/bin), the training script where
    // the test binary looks for it (and the step markers it imports from python/), and
    // the driver of the venvs' disk.
    cpio.tree(&parts.python_root, "")?;
    for dir in ["tests/fixtures/python", "python"] {
        let dir = repo.join(dir);
        cpio.tree(&dir, &rel(&dir)?)?;
    }
    cpio.file_at(&parts.virtio_blk, "vm/virtio_blk.ko")?;
    // Python's getpass.getuser() (torch's cache directory) looks root up.
    cpio.bytes("etc/passwd", b"root:x:0:0:root:/tmp:/bin/sh\n", 0o644)?;
    cpio.bytes("etc/group", b"root:x:0:\n", 0o644)?;
    let venvs: Vec<String> = parts
        .venvs
        .iter()
        .map(|v| format!("{}/{v}", VENVS_IN_VM))
        .collect();
    script.push_str(&format!(
        "insmod /vm/virtio_blk.ko\nmkdir -p {dir}\nmount -t ext4 -o ro /dev/vda {dir}\n\
         export MEMSCOPE_TORCH_VENVS={}\nexport MEMSCOPE_TEST_PATIENCE={PATIENCE}\n",
        venvs.join(":"),
        dir = VENVS_IN_VM
    ));
    // How long the emulated CPU takes to import the framework (printed, never asserted:
    // it sizes the tests' waits).
    let cann = format!("/vm/{}/cann", Fixtures::Plain.dir());
    for v in &venvs {
        script.push_str(&format!(
            "t0=$(date +%s); ASCEND_HOME_PATH={cann} ASCEND_OPP_PATH={cann}/opp \
             LD_LIBRARY_PATH={cann}/lib64 {v}/bin/python -c 'import torch, torch_npu' \
             >/dev/null 2>/tmp/import.err; rc=$?; \
             echo \"{MARK} import {v} rc=$rc $(( $(date +%s) - t0 ))s\"; \
             [ $rc = 0 ] || tail -20 /tmp/import.err\n"
        ));
    }
    Ok(())
}
