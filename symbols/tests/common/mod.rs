//! Builds the C/C++ fixtures of `tests/data/` with gcc/g++ and runs binutils `addr2line` as
//! the reference symbolizer.
#![allow(dead_code)]

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use object::{Object, ObjectSegment};

pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("cannot run {cmd:?} (are gcc, g++ and binutils installed?): {e}")
    });
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// How a fixture set is compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// `-O2 -g -fno-omit-frame-pointer`
    FramePointers,
    /// `-O2 -g -fomit-frame-pointer`
    NoFramePointers,
    /// `-O2 -g -fomit-frame-pointer -fno-asynchronous-unwind-tables`: CFI only in
    /// `.debug_frame` (in the separate debug file for the stripped library).
    DebugFrameOnly,
}

impl Variant {
    pub const ALL: [Variant; 3] = [
        Variant::FramePointers,
        Variant::NoFramePointers,
        Variant::DebugFrameOnly,
    ];

    fn flags(self) -> &'static [&'static str] {
        match self {
            Variant::FramePointers => &["-O2", "-g", "-fno-omit-frame-pointer"],
            Variant::NoFramePointers => &["-O2", "-g", "-fomit-frame-pointer"],
            Variant::DebugFrameOnly => &[
                "-O2",
                "-g",
                "-fomit-frame-pointer",
                "-fno-asynchronous-unwind-tables",
                "-fno-unwind-tables",
            ],
        }
    }

    fn dir_name(self) -> &'static str {
        match self {
            Variant::FramePointers => "fp",
            Variant::NoFramePointers => "nofp",
            Variant::DebugFrameOnly => "debugframe",
        }
    }
}

/// A built fixture set: `stackdump` (PIE) linked against `libcxx.so` (C++ templates) and
/// `libmid.so` (stripped, debug info in `.debug/libmid.debug`, found via `.gnu_debuglink`).
pub struct Fixture {
    pub dir: PathBuf,
    pub exe: PathBuf,
    pub libmid: PathBuf,
    pub libmid_debug: PathBuf,
    pub libcxx: PathBuf,
}

pub fn fixture(variant: Variant) -> &'static Fixture {
    static BUILT: OnceLock<HashMap<Variant, Fixture>> = OnceLock::new();
    &BUILT.get_or_init(|| Variant::ALL.into_iter().map(|v| (v, build(v))).collect())[&variant]
}

fn build(variant: Variant) -> Fixture {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("symbols-fixtures")
        .join(format!("{}-{}", variant.dir_name(), std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join(".debug")).unwrap();
    let src = data_dir();
    let flags = variant.flags();
    let libmid = dir.join("libmid.so");
    let libmid_debug = dir.join(".debug/libmid.debug");
    let libcxx = dir.join("libcxx.so");
    let exe = dir.join("stackdump");
    run(Command::new("gcc")
        .args(flags)
        .args(["-fPIC", "-shared", "-Wl,--build-id"])
        .arg(src.join("libmid.c"))
        .arg("-o")
        .arg(&libmid));
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&libmid)
        .arg(&libmid_debug));
    run(Command::new("strip").arg("--strip-all").arg(&libmid));
    // The debuglink holds the base name; objcopy reads the file for its CRC.
    run(Command::new("objcopy")
        .arg(format!("--add-gnu-debuglink={}", libmid_debug.display()))
        .arg(&libmid));
    run(Command::new("g++")
        .args(flags)
        .args(["-fPIC", "-shared", "-fno-exceptions", "-Wl,--build-id"])
        .arg(src.join("libcxx.cpp"))
        .arg("-o")
        .arg(&libcxx));
    run(Command::new("gcc")
        .args(flags)
        .args(["-fPIE", "-pie", "-Wl,--build-id"])
        .arg(src.join("stackdump.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&dir)
        .args(["-lmid", "-lcxx", "-Wl,-rpath,$ORIGIN"]));
    Fixture {
        dir,
        exe,
        libmid,
        libmid_debug,
        libcxx,
    }
}

/// One captured stack: registers, stack bytes from sp, and the maps text at capture time.
pub struct Capture {
    pub pc: u64,
    pub sp: u64,
    pub fp: u64,
    pub stack: Vec<u8>,
    pub maps: String,
}

/// Runs `stackdump` to capture its stack at `depth` recursion levels.
pub fn capture(fx: &Fixture, name: &str, depth: u32) -> Capture {
    let out = fx.dir.join(name);
    run(Command::new(&fx.exe).arg(&out).arg(depth.to_string()));
    let regs = fs::read_to_string(out.with_extension("regs")).unwrap();
    let (first, maps) = regs.split_once('\n').unwrap();
    let nums: Vec<u64> = first
        .split_whitespace()
        .map(|s| u64::from_str_radix(s, 16).unwrap())
        .collect();
    let stack = fs::read(out.with_extension("stack")).unwrap();
    Capture {
        pc: nums[0],
        sp: nums[1],
        fp: nums[2],
        stack,
        maps: maps.to_string(),
    }
}

/// ELF virtual address of a file offset, from the PT_LOAD segments (independent of the
/// crate under test).
pub fn vaddr_of(path: &Path, offset: u64) -> u64 {
    let data = fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    for seg in file.segments() {
        let (off, size) = seg.file_range();
        if offset >= off && offset < off + size {
            return offset - off + seg.address();
        }
    }
    panic!("offset {offset:#x} not in a segment of {}", path.display());
}

/// One `addr2line` frame: function and `file:line`, `None` for `??`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefFrame {
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
}

/// Runs `addr2line -a -f -i -C -e file addrs...`; one list of frames per address, innermost
/// inlined frame first.
pub fn addr2line(file: &Path, addrs: &[u64]) -> Vec<Vec<RefFrame>> {
    let out = Command::new("addr2line")
        .args(["-a", "-f", "-i", "-C", "-e"])
        .arg(file)
        .args(addrs.iter().map(|a| format!("{a:#x}")))
        .output()
        .expect("addr2line (binutils) must be installed");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut groups: Vec<Vec<RefFrame>> = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.starts_with("0x") && !line.contains(':') {
            groups.push(Vec::new());
            continue;
        }
        let function = line.trim().to_string();
        let loc = lines.next().unwrap_or("??:0");
        let loc = loc.split(" (discriminator").next().unwrap();
        let (file, line_no) = loc.rsplit_once(':').unwrap_or((loc, "?"));
        groups.last_mut().unwrap().push(RefFrame {
            function: (function != "??").then_some(function),
            file: (file != "??").then(|| file.to_string()),
            line: line_no.parse().ok().filter(|l| *l != 0),
        });
    }
    groups
}
