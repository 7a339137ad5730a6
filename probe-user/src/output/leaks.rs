//! Leak report of a process's end (or of tracing stopping): the tensors that leaked (pool
//! blocks that outlived their step or were still live), the driver blocks no pool owns, each
//! with the program's line that asked for it (`analysis::sites`), and apart from them what the
//! framework pools keep cached on purpose, which is no leak.

use std::{collections::BTreeMap, io::Write, path::PathBuf};

use anyhow::Result;

use crate::{
    analysis::sites,
    output::{DeviceKey, ProcessOutput, local_timestamp},
    state::{BlockKind, module_label},
};

pub use crate::state::{Block, ExitMemory, PoolHeld, TensorLeak};

pub const LEAKS_HEADER: &str = "Process Id,Thread Id,Device Id,Event Type,Ptr,Size,Step,\
Allocation Id,Module,Timestamp(ns),Leak,Site";

/// Why the blocks are reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeakCause {
    /// The process exited with these blocks live.
    Exited,
    /// Tracing stopped (Ctrl-C, SIGTERM) while the process was still running.
    Detached,
}

#[derive(Clone, Debug)]
pub struct ProcessLeaks {
    pub pid: u32,
    pub cause: LeakCause,
    pub memory: ExitMemory,
    pub files: Vec<PathBuf>,
    /// The pool step-leak and gap reports (spec §6.1, §6.3), empty if nothing to report.
    pub pool_report: String,
}

/// The user's site of a block (`analysis::sites`): the program's line that asked for it.
pub fn block_site(b: &Block) -> String {
    sites::user_site(
        b.stack.as_deref().unwrap_or(""),
        b.py_stack.as_deref().unwrap_or(""),
    )
}

/// What the `Leak` column says of a tensor: the last step it outlived, or live at the end.
pub fn tensor_leak_text(t: &TensorLeak, cause: LeakCause) -> String {
    match (t.outlived_to_step, t.live_at_end) {
        (Some(s), true) => format!("outlived_step_{s}_and_{}", end_word(cause)),
        (Some(s), false) => format!("outlived_step_{s}"),
        (None, _) => end_word(cause).to_owned(),
    }
}

fn end_word(cause: LeakCause) -> &'static str {
    match cause {
        LeakCause::Exited => "live_at_exit",
        LeakCause::Detached => "live_at_detach",
    }
}

/// Writes `leaks_<ts>.csv` into the dump directory of each device that has leaks: leaked
/// tensors and driver blocks no pool owns (a pool's cached segments are not leaks).
pub fn write_leak_files(
    out: &mut ProcessOutput,
    pid: u32,
    memory: &ExitMemory,
    cause: LeakCause,
) -> Result<Vec<PathBuf>> {
    let mut by_device: BTreeMap<DeviceKey, Vec<(&Block, String)>> = BTreeMap::new();
    for t in &memory.tensor_leaks {
        by_device
            .entry(DeviceKey::from_id(t.block.device))
            .or_default()
            .push((&t.block, tensor_leak_text(t, cause)));
    }
    for b in &memory.driver_leaks {
        by_device
            .entry(DeviceKey::from_id(b.device))
            .or_default()
            .push((b, end_word(cause).to_owned()));
    }
    let mut files = Vec::new();
    for (device, blocks) in by_device {
        let dir = out.device_dump_dir(device)?;
        let (path, f) = dir.create_unique_file(&format!("leaks_{}", local_timestamp()), ".csv")?;
        let mut f = std::io::BufWriter::new(f);
        writeln!(f, "{LEAKS_HEADER}")?;
        for (b, why) in blocks {
            writeln!(
                f,
                "{pid},{},{device},{},0x{:016x},{},{},{},{},{},{why},{}",
                b.tid,
                b.event_type(),
                b.addr,
                b.size,
                b.step,
                b.allocation_id,
                module_of(b),
                b.ts_ns,
                csv_field(&block_site(b))
            )?;
        }
        f.flush()?;
        files.push(path);
    }
    Ok(files)
}

fn module_of(b: &Block) -> &'static str {
    match b.kind {
        BlockKind::Pool(_) => "N/A",
        _ => module_label(b.module_id),
    }
}

/// A CSV field: quoted when it holds a comma, a quote or a line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// `1.50 MiB (1572864 bytes)`: human units next to the exact count.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{v:.2} {} ({bytes} bytes)", UNITS[u])
    }
}

/// `... N more` when a list was cut at `shown` lines.
fn more_lines(s: &mut String, total: usize, shown: usize) {
    if total > shown {
        s.push_str(&format!(
            "    ... {} more (see the leaks CSV)\n",
            total - shown
        ));
    }
}

/// The human summary printed at the end of a run.
pub fn format_report(all: &[ProcessLeaks], max_lines_per_process: usize) -> String {
    let mut s = String::new();
    let tensors: usize = all.iter().map(|p| p.memory.tensor_leaks.len()).sum();
    let tensor_bytes: u64 = all.iter().map(|p| p.memory.tensor_bytes()).sum();
    let driver: usize = all.iter().map(|p| p.memory.driver_leaks.len()).sum();
    let driver_bytes: u64 = all.iter().map(|p| p.memory.driver_bytes()).sum();
    let cached: u64 = all.iter().map(|p| p.memory.cached_bytes()).sum();
    let cached_note = if cached > 0 {
        format!(
            "; {} cached by framework pools (kept for reuse, not a leak)",
            human_bytes(cached)
        )
    } else {
        String::new()
    };
    if tensors == 0 && driver == 0 {
        s.push_str(&format!(
            "leak report: no leaked tensor and no leaked driver memory{cached_note}\n"
        ));
    } else {
        s.push_str(&format!(
            "leak report: {tensors} tensor(s) leaked, {}; {driver} driver block(s) no pool owns \
             leaked, {}{cached_note}\n",
            human_bytes(tensor_bytes),
            human_bytes(driver_bytes)
        ));
    }
    for p in all.iter().filter(|p| !p.memory.is_empty()) {
        let when = match p.cause {
            LeakCause::Exited => "at exit",
            LeakCause::Detached => "when tracing stopped (process still running)",
        };
        let m = &p.memory;
        if !m.tensor_leaks.is_empty() {
            s.push_str(&format!(
                "  pid {}: {} tensor(s) leaked, {}\n",
                p.pid,
                m.tensor_leaks.len(),
                human_bytes(m.tensor_bytes())
            ));
            for t in m.tensor_leaks.iter().take(max_lines_per_process) {
                let b = &t.block;
                let why = t.why(when);
                s.push_str(&format!(
                    "    {} step {:<3} {:<13} device {:<3} 0x{:016x} {:>12} bytes  {why}\n",
                    block_site(b),
                    b.step,
                    b.event_type(),
                    DeviceKey::from_id(b.device).to_string(),
                    b.addr,
                    b.size,
                ));
            }
            more_lines(&mut s, m.tensor_leaks.len(), max_lines_per_process);
        }
        if !m.driver_leaks.is_empty() {
            s.push_str(&format!(
                "  pid {}: {} driver block(s) no pool owns, {}, live {when}\n",
                p.pid,
                m.driver_leaks.len(),
                human_bytes(m.driver_bytes())
            ));
            for b in m.driver_leaks.iter().take(max_lines_per_process) {
                s.push_str(&format!(
                    "    {} step {:<3} {:<4} device {:<4} 0x{:016x} {:>12} bytes  tid {} \
                     allocation_id {} module {}\n",
                    block_site(b),
                    b.step,
                    b.event_type(),
                    DeviceKey::from_id(b.device).to_string(),
                    b.addr,
                    b.size,
                    b.tid,
                    b.allocation_id,
                    module_label(b.module_id)
                ));
            }
            more_lines(&mut s, m.driver_leaks.len(), max_lines_per_process);
        }
        for h in &m.pools {
            let name = h.pool_name();
            let reported = h
                .reported
                .map(|r| {
                    format!(
                        " (the pool's own last figures: allocated {}, reserved {})",
                        human_bytes(r.allocated),
                        human_bytes(r.reserved)
                    )
                })
                .unwrap_or_default();
            s.push_str(&format!(
                "  pid {}: {name} pool on device {} {when}: {} segment(s) of driver memory, {}; \
                 {} in {} live block(s); {} cached for reuse (not a leak){reported}\n",
                p.pid,
                DeviceKey::from_id(h.device),
                h.segments,
                human_bytes(h.segment_bytes),
                human_bytes(h.live_bytes),
                h.live_blocks,
                human_bytes(h.cached_bytes()),
            ));
        }
        for f in &p.files {
            s.push_str(&format!("    written to {}\n", f.display()));
        }
    }
    s
}
