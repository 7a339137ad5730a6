//! Debug-file lookup, libraries deleted after mapping, corrupt files, and a warm-cache timing.

mod common;

use std::{
    fs,
    io::{BufRead, BufReader, Write},
    path::PathBuf,
    process::{Command, Stdio},
    sync::Arc,
    time::Instant,
};

use common::{Variant, addr2line, capture, fixture, vaddr_of};
use memscope_symbols::{
    ElfObject, ObjectInfo, ProcessView, Regs, StackSnapshot, Symbolizer, SymbolizerOptions,
    UnwindOptions, format_stack, unwind,
};

fn mid_call_vaddr(lib: &std::path::Path) -> u64 {
    ElfObject::open(lib)
        .unwrap()
        .function("mid_call")
        .unwrap()
        .address
}

#[test]
fn stripped_library_finds_debug_file_by_debuglink() {
    let fx = fixture(Variant::NoFramePointers);
    let obj = ObjectInfo::open(&fx.libmid, &[]).unwrap();
    assert_eq!(obj.debug_file(), Some(fx.libmid_debug.as_path()));
    assert!(obj.has_dwarf());
    let addr = mid_call_vaddr(&fx.libmid) + 4;
    let frames = obj.symbolize(addr);
    let want = &addr2line(&fx.libmid_debug, &[addr])[0];
    assert_eq!(frames.len(), want.len());
    assert_eq!(frames[0].function.as_deref(), Some("mid_call"));
    assert_eq!(frames[0].line, want[0].line);
    assert!(frames[0].file.as_deref().unwrap().ends_with("libmid.c"));
    // The static function only exists in the debug file's .symtab.
    let debug = fs::read(&fx.libmid_debug).unwrap();
    let debug = object::File::parse(&*debug).unwrap();
    use object::{Object, ObjectSymbol};
    let inner = debug
        .symbols()
        .find(|s| s.name() == Ok("mid_inner"))
        .unwrap()
        .address();
    assert_eq!(obj.symbol(inner), Some(("mid_inner".to_string(), 0)));
}

#[test]
fn stripped_library_finds_debug_file_by_build_id() {
    let fx = fixture(Variant::NoFramePointers);
    let dir = fx.dir.join("buildid-test");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    // The library alone, its debuglink target not next to it.
    let lib = dir.join("libmid.so");
    fs::copy(&fx.libmid, &lib).unwrap();
    let root = dir.join("debugroot");
    let id = ObjectInfo::open(&fx.libmid_debug, &[]).unwrap();
    let hex: String = id
        .build_id()
        .unwrap()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let target = root
        .join(".build-id")
        .join(&hex[..2])
        .join(format!("{}.debug", &hex[2..]));
    fs::create_dir_all(target.parent().unwrap()).unwrap();
    fs::copy(&fx.libmid_debug, &target).unwrap();

    let without = ObjectInfo::open(&lib, &[]).unwrap();
    assert!(!without.has_dwarf());
    let addr = mid_call_vaddr(&lib) + 4;
    // Without debug info: the .dynsym name, no line.
    let f = without.symbolize(addr);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].function.as_deref(), Some("mid_call"));
    assert_eq!(f[0].symbol_offset, Some(4));
    assert_eq!(f[0].line, None);

    let with = ObjectInfo::open(&lib, &[root]).unwrap();
    assert_eq!(with.debug_file(), Some(target.as_path()));
    let f = with.symbolize(addr);
    assert_eq!(
        f.last().unwrap().line,
        addr2line(&fx.libmid_debug, &[addr])[0].last().unwrap().line
    );
    assert!(f.last().unwrap().line.is_some());
}

#[test]
fn deleted_and_replaced_library_is_read_through_map_files() {
    let fx = fixture(Variant::NoFramePointers);
    let dir = fx.dir.join("deleted-test");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join(".debug")).unwrap();
    for (from, to) in [
        (&fx.exe, "stackdump"),
        (&fx.libmid, "libmid.so"),
        (&fx.libcxx, "libcxx.so"),
        (&fx.libmid_debug, ".debug/libmid.debug"),
    ] {
        fs::copy(from, dir.join(to)).unwrap();
    }
    let mut child = Command::new(dir.join("stackdump"))
        .arg("wait")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = u64::from_str_radix(line.trim().strip_prefix("ready ").unwrap(), 16).unwrap();
    // Replace the library on disk (rename over it, as package managers do).
    let lib = dir.join("libmid.so");
    let tmp = dir.join("libmid.so.new");
    fs::copy(&fx.libcxx, &tmp).unwrap();
    fs::rename(&tmp, &lib).unwrap();

    let view = ProcessView::from_pid(child.id()).unwrap();
    let loc = view.lookup(addr).unwrap();
    let module = loc.module().unwrap().clone();
    assert!(module.deleted, "maps should say (deleted)");
    let sym = Symbolizer::new();
    let frames = sym.symbolize(&view, addr, false);
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(b"");
    drop(stdin);
    let _ = child.wait();

    assert_eq!(
        frames.last().unwrap().function.as_deref(),
        Some("mid_call"),
        "{frames:?}"
    );
    assert!(
        frames
            .last()
            .unwrap()
            .file
            .as_deref()
            .unwrap_or("")
            .ends_with("libmid.c")
    );
    assert_eq!(frames.last().unwrap().module.as_deref(), Some("libmid.so"));
}

#[test]
fn corrupt_and_truncated_objects_fall_back_to_module_offset() {
    let fx = fixture(Variant::NoFramePointers);
    let dir = fx.dir.join("corrupt-test");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let data = fs::read(&fx.libcxx).unwrap();
    let garbage = dir.join("libgarbage.so");
    fs::write(&garbage, b"\x7fELF\x02\x01\x01 definitely not an object").unwrap();
    let truncated = dir.join("libtrunc.so");
    fs::write(&truncated, &data[..data.len() / 3]).unwrap();
    let mut flipped_bytes = data.clone();
    // Scribble over the section headers and part of the DWARF.
    let n = flipped_bytes.len();
    for (i, b) in flipped_bytes[n / 2..].iter_mut().enumerate() {
        *b ^= (i as u8).wrapping_mul(31) | 1;
    }
    let flipped = dir.join("libflipped.so");
    fs::write(&flipped, &flipped_bytes).unwrap();
    let missing = dir.join("libmissing.so");
    let maps = format!(
        "\
7f0000000000-7f0000010000 r-xp 00000000 00:00 0 {}
7f0000010000-7f0000020000 r-xp 00000000 00:00 0 {}
7f0000020000-7f0000030000 r-xp 00000000 00:00 0 {}
7f0000030000-7f0000040000 r-xp 00001000 00:00 0 {}
",
        garbage.display(),
        truncated.display(),
        flipped.display(),
        missing.display()
    );
    let view = ProcessView::from_maps_text(&maps);
    let sym = Symbolizer::new();
    for base in [
        0x7f00_0000_0000u64,
        0x7f00_0001_0000,
        0x7f00_0002_0000,
        0x7f00_0003_0000,
    ] {
        for off in [0u64, 0x40, 0x1234, 0xfff8] {
            let frames = sym.symbolize(&view, base + off, true);
            assert!(!frames.is_empty());
            let text = format_stack(&frames, false);
            assert!(text.starts_with(&format!("0x{:016x} ", base + off)));
        }
    }
    let frames = sym.symbolize(&view, 0x7f00_0000_1234, false);
    assert_eq!(
        format_stack(&frames, false),
        "0x00007f0000001234 libgarbage.so+0x1234"
    );
    let frames = sym.symbolize(&view, 0x7f00_0003_0010, false);
    assert_eq!(
        format_stack(&frames, false),
        "0x00007f0000030010 libmissing.so+0x1010"
    );
    // Unwinding through garbage stops cleanly.
    let stack = vec![0xabu8; 4096];
    let u = unwind(
        &Regs {
            pc: 0x7f00_0002_0100,
            sp: 0x1000,
            fp: 0x1010,
            lr: None,
        },
        &StackSnapshot {
            base: 0x1000,
            data: &stack,
        },
        &view,
        &sym,
        &UnwindOptions::default(),
    );
    assert!(u.truncated());
    // An address in no mapping.
    assert_eq!(
        format_stack(&sym.symbolize(&view, 0x10, false), false),
        "0x0000000000000010 [unknown]"
    );
    // Every truncation of a real library parses or fails without panicking.
    for cut in (0..data.len()).step_by(data.len() / 64 + 1) {
        if let Ok(obj) = ObjectInfo::from_bytes(Arc::<[u8]>::from(&data[..cut])) {
            let _ = obj.fde_count();
            for a in [0x1000u64, 0x1100, 0x1200] {
                let _ = obj.symbolize(a);
            }
        }
    }
}

/// Prints warm symbolization throughput and cold parse times (run with `--nocapture`).
#[test]
fn warm_cache_throughput() {
    let fx = fixture(Variant::NoFramePointers);
    let c = capture(fx, "bench", 100);
    let view = ProcessView::from_maps_text(&c.maps);
    let sym = Symbolizer::with_options(SymbolizerOptions::default());
    let t = Instant::now();
    let u = unwind(
        &Regs {
            pc: c.pc,
            sp: c.sp,
            fp: c.fp,
            lr: None,
        },
        &StackSnapshot {
            base: c.sp,
            data: &c.stack,
        },
        &view,
        &sym,
        &UnwindOptions::default(),
    );
    let frames = sym.symbolize_stack(&view, &u.pcs);
    let cold = t.elapsed();
    assert!(frames.len() > 100);

    let rounds = 200;
    let t = Instant::now();
    for _ in 0..rounds {
        let u = unwind(
            &Regs {
                pc: c.pc,
                sp: c.sp,
                fp: c.fp,
                lr: None,
            },
            &StackSnapshot {
                base: c.sp,
                data: &c.stack,
            },
            &view,
            &sym,
            &UnwindOptions::default(),
        );
        std::hint::black_box(u);
    }
    let unwind_per = t.elapsed() / rounds;
    let t = Instant::now();
    let mut n = 0usize;
    for _ in 0..rounds {
        for (i, &pc) in u.pcs.iter().enumerate() {
            n += sym.symbolize(&view, pc, i > 0).len();
        }
    }
    let dt = t.elapsed();
    let per_sec = (rounds as usize * u.pcs.len()) as f64 / dt.as_secs_f64();
    eprintln!(
        "cold unwind+symbolize of {} pcs: {cold:?}; warm unwind: {unwind_per:?}/stack; \
         warm symbolize: {per_sec:.0} addresses/s ({n} frames)",
        u.pcs.len()
    );

    // Cold parse of the largest shared library in the process (libc with its debug file when
    // installed).
    let libc: PathBuf = view
        .mappings()
        .iter()
        .filter_map(|m| m.module.as_ref())
        .map(|m| m.path.clone())
        .find(|p| p.to_string_lossy().contains("libc.so"))
        .unwrap();
    let t = Instant::now();
    let obj = ObjectInfo::open(&libc, &[PathBuf::from("/usr/lib/debug")]).unwrap();
    let parse = t.elapsed();
    let t = Instant::now();
    let fdes = obj.fde_count();
    let cfi = t.elapsed();
    let malloc = ElfObject::open(&libc)
        .unwrap()
        .function("malloc")
        .unwrap()
        .address;
    let t = Instant::now();
    let f = obj.symbolize(malloc + 16);
    let first = t.elapsed();
    eprintln!(
        "{}: parse {parse:?} ({} symbols, debug file {:?}), CFI index {cfi:?} ({fdes} FDEs), \
         first DWARF lookup {first:?} -> {:?}",
        libc.display(),
        obj.symbol_count(),
        obj.debug_file(),
        f.last().and_then(|f| f.function.clone())
    );
    let _ = vaddr_of;
}
