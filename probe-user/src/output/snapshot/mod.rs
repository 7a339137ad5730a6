//! PyTorch memory snapshots (`--memory-snapshot`): the pickle `torch.cuda.memory._dump_snapshot()`
//! and torch_npu's `torch_npu.npu.memory._dump_snapshot()` write, the one memory_viz
//! (`python -m torch.cuda._memory_viz`, pytorch.org/memory_viz) reads, built from outside the
//! process out of the rows a run writes:
//!
//! * `segments`: the driver allocations (HAL MALLOC rows) a framework pool block (PTA rows,
//!   the report function of torch_npu's caching allocator) was ever seen in, each with its
//!   live blocks (`active_allocated`) and the gaps between them (`inactive`: the caching
//!   allocator merges free neighbours, so a gap is one free block);
//! * `device_traces`: per device, `segment_alloc`, `alloc`, `free_requested`,
//!   `free_completed` and `segment_free` actions in the order the rows were written;
//! * frames `{filename, line, name}`, innermost first: the C stack's frames (our symbolizer's
//!   file:line where it has them) with the Python stack's frames placed before the first
//!   interpreter-loop frame, as torch places them.
//!
//! What cannot be known from outside is said in the file's `memscope_bpf` entry and not
//! made up: see [`UNKNOWN`].

pub mod pickle;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};

use super::csv::ProcessOutput;
use crate::state::{DeviceKey, Row};
use pickle::Value;

/// What the snapshot cannot say, written into it (`memscope_bpf.unknown`) and into
/// docs/output.md.
pub const UNKNOWN: &[&str] = &[
    "stream: the report function carries no stream; every stream is written as 0",
    "requested_size: the report function carries the block size only; requested_size is \
     the block size (and an alloc action's size the block size, where torch writes the \
     size asked for)",
    "free_completed: written right after free_requested (the report function reports one \
     free); blocks waiting for another stream's event (active_pending_free) are not seen",
    "expandable segments (virtual memory mapped on demand) are not drawn as segments",
];

/// Trace entries kept per device by a traced run; older ones are dropped first (counted in
/// the file), as torch's own `max_entries` ring does.
pub const MAX_TRACE_ENTRIES: usize = 1 << 20;
/// The same for the node agent, which keeps one per process for as long as it lives.
pub const AGENT_TRACE_ENTRIES: usize = 10_000;

/// A frame list shared by a block and its trace entry (written once into the pickle).
type Frames = Arc<Value>;

struct Segment {
    size: u64,
    /// A pool block was seen inside: the segment belongs to the framework's pool.
    pooled: bool,
    frames: Frames,
    id: u64,
}

struct LiveBlock {
    size: u64,
    frames: Frames,
}

struct TraceEntry {
    action: &'static str,
    addr: u64,
    size: u64,
    time_us: u64,
    frames: Frames,
    /// For segment actions: the segment, written only if it turned out to be pooled.
    segment: Option<u64>,
}

#[derive(Default)]
struct DeviceHistory {
    segments: BTreeMap<u64, Segment>,
    blocks: BTreeMap<u64, LiveBlock>,
    trace: VecDeque<TraceEntry>,
    dropped: u64,
    /// Pool blocks (allocations and frees) in no segment seen: left out, since memory_viz
    /// draws every block inside its segment (a segment made before an attach).
    outside: u64,
}

/// Builds a process's snapshot from the rows written for it, as they are written.
#[derive(Default)]
pub struct SnapshotRecorder {
    devices: BTreeMap<u32, DeviceHistory>,
    /// Segment ids that ever held a pool block.
    pooled: std::collections::HashSet<u64>,
    next_segment: u64,
    /// Set for a `--pid` session: what happened before it is not in the rows.
    attached: bool,
    /// Trace entries kept per device.
    max_entries: usize,
}

impl SnapshotRecorder {
    /// `attached`: the process was running before tracing began (`--pid`, the agent).
    pub fn new(attached: bool) -> Self {
        Self::keeping(attached, MAX_TRACE_ENTRIES)
    }

    /// Keeping at most `max_entries` trace entries per device.
    pub fn keeping(attached: bool, max_entries: usize) -> Self {
        SnapshotRecorder {
            attached,
            max_entries: max_entries.max(1),
            ..Default::default()
        }
    }

    /// Whether [`row`](Self::row) would use this row (driver (HAL, CUDA) and PTA MALLOC/FREE on
    /// a device).
    pub fn wants(row: &Row) -> bool {
        matches!(row.device, DeviceKey::Npu(_))
            && matches!(row.event_type, "HAL" | "CUDA" | "PTA")
            && matches!(row.event, "MALLOC" | "FREE")
    }

    /// Takes one written row; rows other than HAL and PTA MALLOC/FREE are passed over.
    pub fn row(&mut self, row: &Row) {
        let DeviceKey::Npu(device) = row.device else {
            return;
        };
        let (Some(addr), Some(size)) = (row.ptr, row.size) else {
            return;
        };
        let pool = match row.event_type {
            "HAL" | "CUDA" => false,
            "PTA" => true,
            _ => return,
        };
        let frames = || Arc::new(frames_of(row.c_stack.as_deref(), row.py_stack.as_deref()));
        let time_us = row.ts_ns / 1000;
        let max_entries = self.max_entries;
        let dev = self.devices.entry(device).or_default();
        let push = |dev: &mut DeviceHistory, action, size, frames: &Frames, segment| {
            if dev.trace.len() >= max_entries {
                dev.trace.pop_front();
                dev.dropped += 1;
            }
            dev.trace.push_back(TraceEntry {
                action,
                addr,
                size,
                time_us,
                frames: frames.clone(),
                segment,
            });
        };
        match (row.event, pool) {
            ("MALLOC", false) => {
                let id = self.next_segment;
                self.next_segment += 1;
                let frames = frames();
                push(dev, "segment_alloc", size, &frames, Some(id));
                let seg = Segment {
                    size,
                    pooled: false,
                    frames,
                    id,
                };
                dev.segments.insert(addr, seg);
            }
            ("FREE", false) => {
                if let Some(seg) = dev.segments.remove(&addr) {
                    push(dev, "segment_free", seg.size, &frames(), Some(seg.id));
                }
            }
            ("MALLOC", true) => {
                let Some((&start, seg)) = dev.segments.range_mut(..=addr).next_back() else {
                    dev.outside += 1;
                    return;
                };
                if addr >= start.saturating_add(seg.size) {
                    dev.outside += 1;
                    return;
                }
                if !seg.pooled {
                    seg.pooled = true;
                    self.pooled.insert(seg.id);
                }
                let frames = frames();
                push(dev, "alloc", size, &frames, None);
                dev.blocks.insert(addr, LiveBlock { size, frames });
            }
            ("FREE", true) => {
                let inside = dev
                    .segments
                    .range(..=addr)
                    .next_back()
                    .is_some_and(|(&start, seg)| addr < start.saturating_add(seg.size));
                if !inside {
                    dev.outside += 1;
                    return;
                }
                // The free's own stack: where the last reference was dropped.
                let frames = frames();
                let size = dev.blocks.remove(&addr).map_or(size, |b| b.size);
                push(dev, "free_requested", size, &frames, None);
                push(dev, "free_completed", size, &frames, None);
            }
            _ => {}
        }
    }

    /// Whether any pool block was seen (a snapshot without one has nothing to draw).
    pub fn has_pool(&self) -> bool {
        !self.pooled.is_empty()
    }

    /// The snapshot now, as a pickle.
    pub fn pickle(&self) -> Vec<u8> {
        pickle::dumps(&self.value())
    }

    /// Writes the snapshot now as `<process dir>/<stem>.pickle` (`<stem>_<n>.pickle` if that
    /// name is taken); returns the file and its size.
    pub fn write(&self, out: &mut ProcessOutput, stem: &str) -> Result<(PathBuf, u64)> {
        let bytes = self.pickle();
        let dir = out.ensure_dir()?;
        let (path, mut f) = dir.create_unique_file(stem, ".pickle")?;
        f.write_all(&bytes)
            .and_then(|()| f.sync_data())
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok((path, bytes.len() as u64))
    }

    fn value(&self) -> Value {
        let mut segments = Vec::new();
        for (&device, dev) in &self.devices {
            for (&address, seg) in dev.segments.iter().filter(|(_, s)| s.pooled) {
                segments.push(segment_value(device, address, seg, &dev.blocks));
            }
        }
        let max_device = self.devices.keys().next_back().map_or(0, |d| d + 1);
        let traces = (0..max_device)
            .map(|d| match self.devices.get(&d) {
                Some(dev) => Value::List(
                    dev.trace
                        .iter()
                        .filter(|e| e.segment.is_none_or(|id| self.pooled.contains(&id)))
                        .map(trace_value)
                        .collect(),
                ),
                None => Value::List(Vec::new()),
            })
            .collect();
        let dropped: u64 = self.devices.values().map(|d| d.dropped).sum();
        let outside: u64 = self.devices.values().map(|d| d.outside).sum();
        let mut unknown: Vec<Value> = UNKNOWN.iter().map(|s| Value::from(*s)).collect();
        if self.attached {
            unknown.push(
                "attached to a running process: segments, blocks and actions from before the \
                 attach are not in this snapshot; blocks in a segment made before it are left \
                 out (pool_rows_outside_known_segments counts their rows)"
                    .into(),
            );
        }
        Value::Dict(vec![
            ("segments", Value::List(segments)),
            ("device_traces", Value::List(traces)),
            (
                "memscope_bpf",
                Value::Dict(vec![
                    (
                        "source",
                        "memscope-bpf: HAL rows (segments) and the framework's report \
                         function (PTA rows: blocks), traced from outside the process"
                            .into(),
                    ),
                    ("version", env!("CARGO_PKG_VERSION").into()),
                    ("attached", self.attached.into()),
                    ("dropped_trace_entries", dropped.into()),
                    ("pool_rows_outside_known_segments", outside.into()),
                    ("unknown", Value::List(unknown)),
                ]),
            ),
        ])
    }
}

/// One segment with its blocks: live ones and the gaps between them.
fn segment_value(
    device: u32,
    address: u64,
    seg: &Segment,
    blocks: &BTreeMap<u64, LiveBlock>,
) -> Value {
    let end = address + seg.size;
    let mut out = Vec::new();
    let mut at = address;
    let mut allocated = 0u64;
    let empty: Frames = Arc::new(Value::List(Vec::new()));
    let gap = |out: &mut Vec<Value>, from: u64, to: u64| {
        if to > from {
            out.push(block_value(from, to - from, "inactive", &empty));
        }
    };
    for (&b_addr, b) in blocks.range(address..end) {
        gap(&mut out, at, b_addr);
        out.push(block_value(b_addr, b.size, "active_allocated", &b.frames));
        allocated += b.size;
        at = at.max(b_addr + b.size);
    }
    gap(&mut out, at, end);
    Value::Dict(vec![
        ("device", device.into()),
        ("address", address.into()),
        ("total_size", seg.size.into()),
        ("allocated_size", allocated.into()),
        ("active_size", allocated.into()),
        ("requested_size", allocated.into()),
        ("stream", 0u64.into()),
        ("segment_type", segment_type(seg.size).into()),
        (
            "segment_pool_id",
            Value::Tuple(vec![Value::Int(0), Value::Int(0)]),
        ),
        ("is_expandable", false.into()),
        ("frames", Value::Shared(seg.frames.clone())),
        ("blocks", Value::List(out)),
    ])
}

/// The caching allocator's small pool allocates 2 MiB segments and nothing else does
/// (large-pool segments are 20 MiB, or a request over 10 MiB rounded up to 2 MiB).
fn segment_type(size: u64) -> &'static str {
    if size == 2 << 20 { "small" } else { "large" }
}

fn block_value(address: u64, size: u64, state: &str, frames: &Frames) -> Value {
    Value::Dict(vec![
        ("address", address.into()),
        ("size", size.into()),
        ("requested_size", size.into()),
        ("state", state.into()),
        ("frames", Value::Shared(frames.clone())),
    ])
}

fn trace_value(e: &TraceEntry) -> Value {
    Value::Dict(vec![
        ("action", e.action.into()),
        ("addr", e.addr.into()),
        ("size", e.size.into()),
        ("stream", 0u64.into()),
        ("time_us", e.time_us.into()),
        ("frames", Value::Shared(e.frames.clone())),
    ])
}

/// The frames of a row's stacks, innermost first: C frames, with the Python frames placed
/// before the first frame of the interpreter loop (or after the C frames if none is seen).
pub fn frames_of(c_stack: Option<&str>, py_stack: Option<&str>) -> Value {
    let python: Vec<Value> = py_stack
        .into_iter()
        .flat_map(str::lines)
        .filter_map(python_frame)
        .collect();
    let mut out = Vec::new();
    let mut python = Some(python);
    for line in c_stack.into_iter().flat_map(str::lines) {
        let Some(frame) = c_frame(line) else {
            continue;
        };
        if let Value::Dict(pairs) = &frame
            && let Some((_, Value::Str(name))) = pairs.iter().find(|(k, _)| *k == "name")
            && name.contains("_PyEval_EvalFrameDefault")
            && let Some(py) = python.take()
        {
            out.extend(py);
        }
        out.push(frame);
    }
    if let Some(py) = python {
        out.extend(py);
    }
    Value::List(out)
}

fn frame(filename: &str, line: u64, name: &str) -> Value {
    Value::Dict(vec![
        ("filename", filename.into()),
        ("line", line.into()),
        ("name", name.into()),
    ])
}

/// `file(line): function` (docs/call-stacks.md).
fn python_frame(text: &str) -> Option<Value> {
    let (place, name) = text.trim().split_once("): ")?;
    let (file, line) = place.rsplit_once('(')?;
    Some(frame(file, line.parse().ok()?, name))
}

/// `0xADDR function at file:line`, `0xADDR [inlined] function at file:line`,
/// `0xADDR function`, `0xADDR lib.so+0xOFF`, and `[truncated]` (a frame of that name); other
/// lines are no frame.
fn c_frame(text: &str) -> Option<Value> {
    let text = text.trim().trim_matches('"');
    // The stack copy ended before the stack did (docs/call-stacks.md): said where it ends.
    if text == "[truncated]" {
        return Some(frame("??", 0, text));
    }
    let (addr, rest) = text.split_once(' ')?;
    if !addr.starts_with("0x") {
        return None;
    }
    let rest = rest.strip_prefix("[inlined] ").unwrap_or(rest);
    if let Some((name, place)) = rest.rsplit_once(" at ")
        && let Some((file, line)) = place.rsplit_once(':')
        && let Ok(line) = line.parse()
    {
        return Some(frame(file, line, name));
    }
    // A library and offset (no symbol), or a symbol without line information.
    let file = match rest.split_once('+') {
        Some((lib, off)) if off.starts_with("0x") => lib,
        _ => "??",
    };
    Some(frame(file, 0, rest))
}

#[cfg(test)]
mod tests;
