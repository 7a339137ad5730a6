//! Attach and detach cost of many probes in one library (run by `cargo xtask bench`, harm
//! section): loads the tracer's BPF programs, puts the entry and return programs on the
//! first `--count` exported functions of `--lib` (in their file order), then drops
//! everything, and prints one line:
//!
//! `RESULT count=N links=multi|perf attach_ms=A detach_ms=D rest_ms=R`
//!
//! (`detach_ms`: removing the uprobes; `rest_ms`: unloading everything else.)
//!
//! `--pid P` scopes the probes to process P (which should map the library, so the
//! breakpoints are really written), as the tracer does; without it they are system-wide.
//! `MEMSCOPE_BPF_NO_MULTI_UPROBE=1` measures the per-probe perf links instead. Needs root.
//!
//! ```text
//! cargo run --release -p memscope-bpf --example attach_cost -- --lib L --count 1000 --pid P
//! ```

use std::{path::PathBuf, time::Instant};

use anyhow::{Context, Result, bail};
use memscope_bpf::{
    trace::bpf::{Bpf, Scope},
    trace::tracefs,
};

fn main() -> Result<()> {
    let mut lib = None;
    let mut count = 100usize;
    let mut pid = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--lib" => lib = Some(PathBuf::from(value()?)),
            "--count" => count = value()?.parse()?,
            "--pid" => pid = Some(value()?.parse::<u32>()?),
            other => bail!("unknown option {other} (--lib PATH --count N [--pid P])"),
        }
    }
    let lib = lib.context("--lib PATH is required")?;
    let obj = memscope_symbols::ElfObject::open(&lib)?;
    let mut funcs: Vec<u64> = obj
        .exported
        .iter()
        .filter_map(|name| obj.function(name).map(|f| f.file_offset))
        .collect();
    funcs.sort_unstable();
    if funcs.len() < count {
        bail!(
            "{} exports {} functions, fewer than {count}",
            lib.display(),
            funcs.len()
        );
    }
    // Probe id 1 in the low 16 bits, the function's index above it (as a caller with one
    // probe id for many functions would do).
    let points: Vec<(u64, u64)> = funcs[..count]
        .iter()
        .enumerate()
        .map(|(i, off)| (*off, ((i as u64) << 16) | 1))
        .collect();
    let offsets = tracefs::read_offsets(tracefs::ensure_mounted()?)?;
    let (mut bpf, ring) = Bpf::load(&offsets, 1 << 20)?;
    let scope = pid.map_or(Scope::AllProcesses, Scope::Process);
    let started = Instant::now();
    bpf.attach_many(&lib, &points, true, scope)?;
    let attach = started.elapsed();
    let links = if bpf.uses_multi_links() {
        "multi"
    } else {
        "perf"
    };
    let started = Instant::now();
    bpf.detach_uprobes();
    let detach = started.elapsed();
    let started = Instant::now();
    drop(bpf);
    drop(ring);
    let rest = started.elapsed();
    println!(
        "RESULT count={count} links={links} attach_ms={:.2} detach_ms={:.2} rest_ms={:.2}",
        attach.as_secs_f64() * 1e3,
        detach.as_secs_f64() * 1e3,
        rest.as_secs_f64() * 1e3
    );
    Ok(())
}
