//! Symbolization and unwinding throughput of `memscope_symbols`, for `cargo xtask bench`.
//!
//! ```text
//! symbolize_bench symbolize --self [--seconds S]     addresses of every function in this process
//! symbolize_bench symbolize FILE... [--seconds S]    addresses of every function in FILEs
//! symbolize_bench unwind [--seconds S]               CFI unwinding of a captured stack of ours
//! symbolize_bench cold FILE                          first symbolization in FILE, fresh cache
//! ```
//!
//! Each prints one `RESULT key=value ...` line on stdout. Warm rates are measured after one
//! full warm-up pass (every object parsed, DWARF loaded, CFI indexed), single-threaded.
//! FILEs are mapped into a synthetic process view (their PT_LOAD segments at distinct bases);
//! nothing is loaded into this process.

use std::{
    fs::File,
    hint::black_box,
    io::Read,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use std::os::unix::fs::MetadataExt;

use memscope_symbols::{
    ElfObject, ProcessView, Regs, StackSnapshot, Symbolizer, UnwindOptions, unwind,
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut seconds = 1.0f64;
    let mut self_view = false;
    let mut files = Vec::new();
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => seconds = it.next().and_then(|s| s.parse().ok()).expect("--seconds S"),
            "--self" => self_view = true,
            f => files.push(PathBuf::from(f)),
        }
    }
    let budget = Duration::from_secs_f64(seconds);
    match args.first().map(String::as_str) {
        Some("symbolize") => symbolize(self_view, &files, budget),
        Some("unwind") => unwind_bench(budget),
        Some("cold") => cold(files.first().expect("cold FILE")),
        _ => {
            eprintln!("usage: symbolize_bench symbolize (--self | FILE...) | unwind | cold FILE");
            std::process::exit(2);
        }
    }
}

/// One PT_LOAD program header.
struct Load {
    flags: u32,
    offset: u64,
    vaddr: u64,
    filesz: u64,
}

/// The PT_LOAD segments of a 64-bit little-endian ELF file (headers only; nothing else read).
fn loads(path: &Path) -> Vec<Load> {
    let mut f = File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut head = vec![0u8; 64];
    f.read_exact(&mut head).expect("ELF header");
    assert!(
        head.starts_with(b"\x7fELF\x02\x01"),
        "{}: not a 64-bit LE ELF",
        path.display()
    );
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (
        u64_at(&head, 0x20),
        u16_at(&head, 0x36),
        u16_at(&head, 0x38),
    );
    let mut ph = vec![0u8; phentsize * phnum];
    use std::os::unix::fs::FileExt;
    f.read_exact_at(&mut ph, phoff).expect("program headers");
    ph.chunks(phentsize)
        .filter(|p| u32_at(p, 0) == 1)
        .map(|p| Load {
            flags: u32_at(p, 4),
            offset: u64_at(p, 8),
            vaddr: u64_at(p, 16),
            filesz: u64_at(p, 32),
        })
        .collect()
}

/// Maps text placing each file's PT_LOAD segments at its own base (1 TiB apart); returns
/// the text and the bases.
fn synthetic_maps(files: &[PathBuf]) -> (String, Vec<u64>) {
    let mut text = String::new();
    let mut bases = Vec::new();
    for (i, path) in files.iter().enumerate() {
        let base = 0x1000_0000_0000u64 * (i as u64 + 1);
        bases.push(base);
        let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
        let inode = std::fs::metadata(&path).map(|m| m.ino()).unwrap_or(0);
        for l in loads(&path) {
            let start = base + (l.vaddr & !0xfff);
            let end = (base + l.vaddr + l.filesz.max(1) + 0xfff) & !0xfff;
            let x = if l.flags & 1 != 0 { 'x' } else { '-' };
            text.push_str(&format!(
                "{start:x}-{end:x} r-{x}p {:08x} 00:00 {inode} {}\n",
                l.offset & !0xfff,
                path.display()
            ));
        }
    }
    (text, bases)
}

/// A deterministic shuffle (xorshift), so lookups do not walk the address space in order.
fn shuffle(v: &mut [u64]) {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..v.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.swap(i, (s % (i as u64 + 1)) as usize);
    }
}

/// The middle of every sized function symbol of each executable mapping's file.
fn function_addresses(view: &ProcessView) -> Vec<u64> {
    let mut addrs = Vec::new();
    let mut seen: Vec<PathBuf> = Vec::new();
    for m in view.mappings().iter().filter(|m| m.executable) {
        let Some(module) = &m.module else { continue };
        let Ok(elf) = ElfObject::open(&module.path) else {
            continue;
        };
        if !seen.contains(&module.path) {
            seen.push(module.path.clone());
        }
        let len = m.end - m.start;
        for f in elf.functions.values().filter(|f| f.size > 0) {
            if f.file_offset >= m.offset && f.file_offset - m.offset < len {
                addrs.push(m.start + (f.file_offset - m.offset) + f.size / 2);
            }
        }
    }
    addrs.sort_unstable();
    addrs.dedup();
    shuffle(&mut addrs);
    addrs
}

fn symbolize(self_view: bool, files: &[PathBuf], budget: Duration) {
    let view = if self_view {
        ProcessView::from_pid(std::process::id()).expect("own maps")
    } else {
        ProcessView::from_maps_text(&synthetic_maps(files).0)
    };
    let modules = view
        .mappings()
        .iter()
        .filter(|m| m.executable && m.module.is_some())
        .count();
    let addrs = function_addresses(&view);
    assert!(!addrs.is_empty(), "no function addresses found");
    let sym = Symbolizer::new();
    let t = Instant::now();
    let mut frames = 0usize;
    let mut named = 0usize;
    let mut with_line = 0usize;
    for &a in &addrs {
        let f = sym.symbolize(&view, a, false);
        frames += f.len();
        named += f.iter().any(|f| f.function.is_some()) as usize;
        with_line += f.iter().any(|f| f.line.is_some()) as usize;
    }
    let warmup = t.elapsed();
    let t = Instant::now();
    let mut done = 0u64;
    let mut warm_frames = 0u64;
    'outer: loop {
        for chunk in addrs.chunks(1024) {
            for &a in chunk {
                warm_frames += black_box(sym.symbolize(&view, a, false)).len() as u64;
            }
            done += chunk.len() as u64;
            if t.elapsed() >= budget {
                break 'outer;
            }
        }
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "RESULT addresses={} modules={modules} objects={} named={named} with_line={with_line} \
         frames_per_address={:.3} warmup_ms={:.1} symbolized={done} addr_per_s={:.0} frames_per_s={:.0}",
        addrs.len(),
        sym.stats().objects_parsed,
        frames as f64 / addrs.len() as f64,
        warmup.as_secs_f64() * 1e3,
        done as f64 / secs,
        warm_frames as f64 / secs,
    );
}

/// Registers and up to 8 KiB of stack (like BPF's copy), taken some frames deep.
struct Captured {
    regs: Regs,
    stack: Vec<u8>,
}

#[inline(never)]
fn capture_at(depth: u32) -> Captured {
    if black_box(depth) > 0 {
        let mut c = capture_at(depth - 1);
        black_box(&mut c);
        return c;
    }
    let (pc, sp, fp): (u64, u64, u64);
    // SAFETY: reads three registers; no memory is touched.
    unsafe {
        std::arch::asm!(
            "lea {pc}, [rip]",
            "mov {sp}, rsp",
            "mov {fp}, rbp",
            pc = out(reg) pc,
            sp = out(reg) sp,
            fp = out(reg) fp,
            options(nomem, nostack, preserves_flags),
        );
    }
    // The copy stops at the end of the stack mapping, as BPF's bounded read does.
    let top = memscope_symbols::read_maps(std::process::id())
        .ok()
        .and_then(|m| {
            m.iter()
                .find(|e| e.start <= sp && sp < e.end)
                .map(|e| e.end)
        })
        .unwrap_or(sp);
    let len = (top - sp).min(8192) as usize;
    let mut stack = vec![0u8; len];
    // SAFETY: [sp, sp + len) lies in our own mapped stack, above the live stack pointer.
    unsafe { std::ptr::copy_nonoverlapping(sp as *const u8, stack.as_mut_ptr(), len) };
    Captured {
        regs: Regs {
            pc,
            sp,
            fp,
            lr: None,
        },
        stack,
    }
}

fn unwind_bench(budget: Duration) {
    let c = capture_at(16);
    let view = ProcessView::from_pid(std::process::id()).expect("own maps");
    let sym = Symbolizer::new();
    let snapshot = StackSnapshot {
        base: c.regs.sp,
        data: &c.stack,
    };
    let opts = UnwindOptions {
        max_depth: 64,
        ..Default::default()
    };
    let first = unwind(&c.regs, &snapshot, &view, &sym, &opts);
    let depth = first.pcs.len();
    let frames = sym.symbolize_stack(&view, &first.pcs);
    let last = frames
        .last()
        .and_then(|f| f.function.clone())
        .unwrap_or_default();
    let measure = |symbolize: bool| {
        let t = Instant::now();
        let mut n = 0u64;
        while t.elapsed() < budget {
            for _ in 0..256 {
                let u = unwind(&c.regs, &snapshot, &view, &sym, &opts);
                if symbolize {
                    black_box(sym.symbolize_stack(&view, &u.pcs));
                } else {
                    black_box(&u);
                }
            }
            n += 256;
        }
        n as f64 / t.elapsed().as_secs_f64()
    };
    let unwind_rate = measure(false);
    let full_rate = measure(true);
    // What the tracer's stack worker does: unwind, then the text of a stack already seen
    // (same pcs) is taken from a table; a new one is symbolized (each address once per view)
    // and formatted once.
    let mut texts: std::collections::HashMap<Vec<u64>, std::sync::Arc<str>> = Default::default();
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed() < budget {
        for _ in 0..256 {
            let u = unwind(&c.regs, &snapshot, &view, &sym, &opts);
            let text = match texts.get(&u.pcs) {
                Some(t) => t.clone(),
                None => {
                    let frames: Vec<_> = u
                        .pcs
                        .iter()
                        .enumerate()
                        .flat_map(|(i, &pc)| sym.symbolize_shared(&view, pc, i > 0).to_vec())
                        .collect();
                    let t: std::sync::Arc<str> =
                        memscope_symbols::format_stack(&frames, u.truncated()).into();
                    texts.insert(u.pcs.clone(), t.clone());
                    t
                }
            };
            black_box(text);
        }
        n += 256;
    }
    let dedup_rate = n as f64 / t.elapsed().as_secs_f64();
    println!(
        "RESULT depth={depth} stack_bytes={} stop={:?} outermost={} unwind_stacks_per_s={unwind_rate:.0} \
         unwind_frames_per_s={:.0} resolve_stacks_per_s={full_rate:.0} \
         dedup_stacks_per_s={dedup_rate:.0}",
        c.stack.len(),
        first.stop,
        last.replace(' ', "_"),
        unwind_rate * depth as f64,
    );
}

fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn cold(file: &Path) {
    let size = std::fs::metadata(file).expect("file").len();
    let (text, bases) = synthetic_maps(&[file.to_path_buf()]);
    let exec = loads(file)
        .into_iter()
        .find(|l| l.flags & 1 != 0)
        .expect("an executable segment");
    // An address in the middle of the code, and another a quarter in (for a warm lookup).
    let addr = bases[0] + exec.vaddr + exec.filesz / 2;
    let addr2 = bases[0] + exec.vaddr + exec.filesz / 4;
    let rss0 = vm_hwm_kib();
    let t0 = Instant::now();
    let view = ProcessView::from_maps_text(&text);
    let sym = Symbolizer::new();
    let module = view
        .lookup(addr)
        .and_then(|m| m.module().cloned())
        .expect("mapped");
    let obj = sym.object(&module).expect("parse");
    let t_parse = t0.elapsed();
    let frames = sym.symbolize(&view, addr, false);
    let t_first = t0.elapsed();
    let fdes = obj.fde_count();
    let t_total = t0.elapsed();
    let t1 = Instant::now();
    let again = sym.symbolize(&view, addr2, false);
    let t_second = t1.elapsed();
    black_box(again);
    let name = frames
        .last()
        .and_then(|f| f.function.clone())
        .unwrap_or_else(|| "?".into());
    let name: String = name.chars().take(60).collect();
    println!(
        "RESULT size={size} symbols={} has_dwarf={} fdes={fdes} parse_ms={:.1} \
         first_symbolize_ms={:.1} cfi_index_ms={:.1} total_ms={:.1} second_symbolize_us={:.1} \
         frames={} peak_rss_kib={} rss_added_kib={} function={}",
        obj.symbol_count(),
        obj.has_dwarf(),
        t_parse.as_secs_f64() * 1e3,
        (t_first - t_parse).as_secs_f64() * 1e3,
        (t_total - t_first).as_secs_f64() * 1e3,
        t_total.as_secs_f64() * 1e3,
        t_second.as_secs_f64() * 1e6,
        frames.len(),
        vm_hwm_kib(),
        vm_hwm_kib().saturating_sub(rss0),
        name.replace(' ', "_"),
    );
}
