//! User-space throughput benchmark (run by `cargo xtask bench`): replays a synthetic stream
//! of ring-buffer records through the same path the tracer uses — per-CPU batch records of
//! packed calls (`decode::batch_calls`, the layout of `probe_common::packed`), `decode::decode`,
//! `state::ProcessState::apply_into`, a writer, and the leak analysis at the end — and
//! prints one JSON line:
//!
//! `{"writer":"csv","events":N,"seconds":S,"events_per_s":R,"rows":N,"live_blocks":B,"peak_rss_kib":K}`
//!
//! The stream: `--threads` threads, each allocating blocks (halMemAlloc with a return) and
//! freeing them after a while; every `--leak-every`th block is never freed, so the live set
//! grows slowly (like a leak) while the event count grows fast. Records are synthesized on
//! the fly (nothing is stored up front), so peak RSS is the pipeline's own.
//!
//! ```text
//! cargo run --release -p memscope-bpf --example replay -- --events 10000000 --writer csv --out DIR
//! ```
//! Writers: `csv` (msMemScope dump files under DIR), `none` (decode + track + leaks only).

use std::{path::PathBuf, time::Instant};

use memscope_bpf::{
    events::decode::{self, Decoded},
    output::ProcessOutput,
    output::leaks,
    settings::{DataFormat, DeviceFilter, EventSet},
    state::{ProcessState, StepFilter, TrackOptions},
    trace::probes::ProbeId,
};
use probe_common::{BATCH_KIND, BATCH_WORDS, RawEvent, event_flags, kind, packed};

struct Args {
    events: u64,
    writer: String,
    out: PathBuf,
    threads: u32,
    leak_every: u64,
    window: usize,
}

fn parse() -> Args {
    let mut a = Args {
        events: 10_000_000,
        writer: "csv".into(),
        out: std::env::temp_dir().join("memscope-replay"),
        threads: 8,
        leak_every: 1000,
        window: 64,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--events" => a.events = v.parse().expect("--events N"),
            "--writer" => a.writer = v,
            "--out" => a.out = PathBuf::from(v),
            "--threads" => a.threads = v.parse().expect("--threads N"),
            "--leak-every" => a.leak_every = v.parse().expect("--leak-every N"),
            "--window" => a.window = v.parse().expect("--window N"),
            _ => panic!("unknown option {k}"),
        }
    }
    a
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Appends `raw` to a batch record packed as the BPF side packs it (`probe_common::packed`):
/// ids, descriptor (return value inline), timestamp, return timestamp, deref, kept arguments.
fn pack(batch: &mut Vec<u64>, raw: &RawEvent, kept_args: u32) {
    let mut desc = packed::descriptor(raw.probe as u32, raw.flags, kept_args)
        | packed::RET_TS
        | (raw.ret as u32 as u64) << packed::RET_SHIFT;
    if raw.probe == ProbeId::HalMemAlloc as u16 {
        desc |= packed::DEREF;
    }
    batch.extend([
        raw.pid as u64 | (raw.tid as u64) << 32,
        desc,
        raw.ts_ns,
        raw.ret_ts_ns,
    ]);
    if desc & packed::DEREF != 0 {
        batch.push(raw.deref);
    }
    for (i, a) in raw.args.iter().enumerate() {
        if kept_args & 1 << i != 0 {
            batch.push(*a);
        }
    }
}

/// The bytes of a batch record holding `words`.
fn batch_record(words: &[u64], bytes: &mut Vec<u8>) {
    bytes.clear();
    bytes.extend_from_slice(&BATCH_KIND.to_ne_bytes());
    bytes.extend_from_slice(&0u16.to_ne_bytes());
    bytes.extend_from_slice(&(words.len() as u32).to_ne_bytes());
    for w in words {
        bytes.extend_from_slice(&w.to_ne_bytes());
    }
}

fn main() -> anyhow::Result<()> {
    let args = parse();
    let pid = 4242;
    let opts = TrackOptions {
        dump: EventSet::CLI_DEFAULT,
        devices: DeviceFilter::default(),
        steps: StepFilter::default(),
        step_analyses: true,
        oom_top_k: None,
        decompose: false,
        inefficient: false,
        write_op_launch: false,
        write_kernel_launch: false,
        row_attrs: true,
    };
    let mut state = ProcessState::new(pid);
    let mut out = match args.writer.as_str() {
        "csv" => {
            std::fs::create_dir_all(&args.out)?;
            Some(ProcessOutput::new(&args.out, pid, "{}".into()))
        }
        "db" => {
            std::fs::create_dir_all(&args.out)?;
            Some(ProcessOutput::with_format(
                &args.out,
                pid,
                "{}".into(),
                DataFormat::Db,
            ))
        }
        "none" => None,
        w => anyhow::bail!("unknown writer {w} (csv, db, none)"),
    };
    // Per thread: a FIFO of live addresses (freed after `window` newer allocations).
    let threads = args.threads.max(1) as usize;
    let mut live: Vec<std::collections::VecDeque<u64>> = vec![Default::default(); threads];
    let mut next_addr: Vec<u64> = (0..threads as u64)
        .map(|t| 0x12c0_0000_0000 + t * 0x10_0000_0000)
        .collect();
    let mut raw = RawEvent::zeroed();
    raw.kind = kind::CALL;
    raw.pid = pid;
    let mut rows = 0u64;
    let mut row_buf = Vec::new();
    let mut allocs = 0u64;
    let mut ts = 1_000_000u64;
    let spec_of = |id: ProbeId| {
        memscope_bpf::trace::probes::PROBES
            .iter()
            .find(|d| d.id == id)
            .expect("probe")
            .spec
            .kept_args
    };
    let (alloc_args, free_args) = (spec_of(ProbeId::HalMemAlloc), spec_of(ProbeId::HalMemFree));
    let mut words: Vec<u64> = Vec::with_capacity(BATCH_WORDS);
    let mut bytes: Vec<u8> = Vec::with_capacity(8 + 8 * BATCH_WORDS);
    let start = Instant::now();
    for i in 0..args.events {
        let t = (i % threads as u64) as usize;
        ts += 100;
        raw.tid = pid + 1 + t as u32;
        raw.ts_ns = ts;
        raw.ret_ts_ns = ts + 50;
        raw.flags = event_flags::HAS_RET;
        raw.ret = 0;
        let q = &mut live[t];
        if q.len() >= args.window {
            // free the oldest block of this thread
            let addr = q.pop_front().expect("non-empty");
            raw.probe = ProbeId::HalMemFree as u16;
            raw.args = [addr, 0, 0, 0, 0, 0];
            raw.deref = 0;
        } else {
            allocs += 1;
            let size = 4096 * (1 + (allocs % 64));
            let addr = next_addr[t];
            next_addr[t] += 2 << 20;
            raw.probe = ProbeId::HalMemAlloc as u16;
            raw.args = [
                0x7ff0_0000_0000,
                size,
                (t as u64 % 2) | (1 << 10) | (33 << 56),
                0,
                0,
                0,
            ];
            raw.deref = addr;
            // every leak_every-th block is never freed
            if args.leak_every == 0 || !allocs.is_multiple_of(args.leak_every) {
                q.push_back(addr);
            }
        }
        let kept = if raw.probe == ProbeId::HalMemAlloc as u16 {
            alloc_args
        } else {
            free_args
        };
        pack(&mut words, &raw, kept);
        if words.len() > BATCH_WORDS - packed::MAX_WORDS || i + 1 == args.events {
            batch_record(&words, &mut bytes);
            words.clear();
            for rec in decode::batch_calls(&bytes).expect("a batch record") {
                let Some(Decoded::Call(call)) = decode::decode(&rec) else {
                    continue;
                };
                let ts_real = call.ts_mono;
                state.apply_into(&call, ts_real, &opts, None, &mut row_buf);
                for row in &row_buf {
                    rows += 1;
                    if let Some(o) = out.as_mut() {
                        o.write_ref(row)?;
                    }
                }
                row_buf.clear();
            }
        }
    }
    let blocks = state.live_blocks();
    let memory = state.exit_memory();
    if let Some(o) = out.as_mut() {
        leaks::write_leak_files(o, pid, &memory, leaks::LeakCause::Exited)?;
        o.finish()?;
    }
    let report = leaks::format_report(
        &[leaks::ProcessLeaks {
            pid,
            cause: leaks::LeakCause::Exited,
            memory,
            files: Vec::new(),
            pool_report: String::new(),
        }],
        20,
    );
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{{\"writer\":\"{}\",\"events\":{},\"seconds\":{:.3},\"events_per_s\":{:.0},\"rows\":{},\"live_blocks\":{},\"leak_report_lines\":{},\"peak_rss_kib\":{}}}",
        args.writer,
        args.events,
        secs,
        args.events as f64 / secs,
        rows,
        blocks.len(),
        report.lines().count(),
        peak_rss_kib()
    );
    Ok(())
}
