//! Leak report: HAL blocks still live when a traced process exited (or when tracing stopped).

use std::{collections::BTreeMap, io::Write, path::PathBuf};

use anyhow::Result;

use crate::{
    output::{DeviceKey, ProcessOutput, local_timestamp},
    state::{Block, module_label},
};

pub const LEAKS_HEADER: &str =
    "Process Id,Thread Id,Device Id,Event Type,Ptr,Size,Step,Allocation Id,Module,Timestamp(ns)";

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
    pub blocks: Vec<Block>,
    pub files: Vec<PathBuf>,
    /// The pool step-leak and gap reports (spec §6.1, §6.3), empty if nothing to report.
    pub pool_report: String,
}

impl ProcessLeaks {
    pub fn total_bytes(&self) -> u64 {
        self.blocks.iter().map(|b| b.size).sum()
    }
}

/// Writes `leaks_<ts>.csv` into the dump directory of each device that has leaked blocks.
pub fn write_leak_files(
    out: &mut ProcessOutput,
    pid: u32,
    blocks: &[Block],
) -> Result<Vec<PathBuf>> {
    let mut by_device: BTreeMap<DeviceKey, Vec<&Block>> = BTreeMap::new();
    for b in blocks {
        by_device
            .entry(DeviceKey::from_id(b.device))
            .or_default()
            .push(b);
    }
    let mut files = Vec::new();
    for (device, blocks) in by_device {
        let dir = out.device_dump_dir(device)?;
        let (path, f) = dir.create_unique_file(&format!("leaks_{}", local_timestamp()), ".csv")?;
        let mut f = std::io::BufWriter::new(f);
        writeln!(f, "{LEAKS_HEADER}")?;
        for b in blocks {
            writeln!(
                f,
                "{pid},{},{device},{},0x{:016x},{},{},{},{},{}",
                b.tid,
                b.kind.event_type(),
                b.addr,
                b.size,
                b.step,
                b.allocation_id,
                module_label(b.module_id),
                b.ts_ns
            )?;
        }
        f.flush()?;
        files.push(path);
    }
    Ok(files)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The human summary printed at the end of a run.
pub fn format_report(all: &[ProcessLeaks], max_lines_per_process: usize) -> String {
    let mut s = String::new();
    let blocks: usize = all.iter().map(|p| p.blocks.len()).sum();
    let bytes: u64 = all.iter().map(ProcessLeaks::total_bytes).sum();
    if blocks == 0 {
        s.push_str("leak report: no HAL memory left live by the traced processes\n");
        return s;
    }
    s.push_str(&format!(
        "leak report: {blocks} HAL block(s), {bytes} bytes ({:.2} MiB) still live\n",
        mib(bytes)
    ));
    for p in all.iter().filter(|p| !p.blocks.is_empty()) {
        let when = match p.cause {
            LeakCause::Exited => "at exit",
            LeakCause::Detached => "when tracing stopped (process still running)",
        };
        s.push_str(&format!(
            "  pid {}: {} block(s), {} bytes ({:.2} MiB) live {when}\n",
            p.pid,
            p.blocks.len(),
            p.total_bytes(),
            mib(p.total_bytes())
        ));
        for b in p.blocks.iter().take(max_lines_per_process) {
            s.push_str(&format!(
                "    device {:<4} 0x{:016x} {:>12} bytes  {:<4} tid {:<7} step {:<4} allocation_id {} module {}\n",
                DeviceKey::from_id(b.device).to_string(),
                b.addr,
                b.size,
                b.kind.event_type(),
                b.tid,
                b.step,
                b.allocation_id,
                module_label(b.module_id)
            ));
        }
        if p.blocks.len() > max_lines_per_process {
            s.push_str(&format!(
                "    ... {} more (see the leaks CSV)\n",
                p.blocks.len() - max_lines_per_process
            ));
        }
        for f in &p.files {
            s.push_str(&format!("    written to {}\n", f.display()));
        }
    }
    s
}
