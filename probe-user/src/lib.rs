//! memscope-bpf: trace an unmodified process's NPU memory through eBPF uprobes on the vendor
//! libraries, and write msMemScope-compatible dumps and a leak report.
//!
//! Data flow, one way, folder by folder: `cli` (options) -> `trace` (which objects get which
//! probes, load, attach) -> `session` (ring buffer, ordering) -> `events` (decode, vendor
//! semantics, stacks) -> `state` (per-process tracking, rows) -> `analysis` (owners, steps,
//! inefficient blocks) and `output` (files, the leak report). `offline` reads saved dumps
//! back for `--compare` and `analyze`; `report` draws them (HTML, Perfetto, flame graphs);
//! `agent` serves live state.
//! `settings` holds the run settings (events, levels, devices, analyses, formats) that `cli`
//! and the agent build and every stage reads.

pub mod agent;
pub mod analysis;
pub mod cli;
pub mod digits;
pub mod events;
pub mod log;
pub mod offline;
pub mod output;
pub mod report;
pub mod session;
pub mod settings;
pub mod state;
pub mod trace;
