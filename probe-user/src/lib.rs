//! memscope-bpf: trace an unmodified process's NPU memory through eBPF uprobes on the vendor
//! libraries, and write msMemScope-compatible dumps and a leak report.
//!
//! Data flow: `cli` (options) -> `attach` (which objects get which probes) -> `bpf` (load,
//! attach) -> `session` (ring buffer, ordering) -> `decode` -> `tracker` (per-process state,
//! rows) -> `output` (files) and `analysis` (leaks). `offline` reads saved dumps back for
//! `--compare` and `analyze`; `report` draws them (HTML, Perfetto, flame graphs).

pub mod aclnn;
pub mod agent;
pub mod analysis;
pub mod atb;
pub mod attach;
pub mod bpf;
pub mod cli;
pub mod decode;
pub mod hal;
pub mod kernels;
pub mod labels;
pub mod launch;
pub mod log;
pub mod multi_uprobe;
pub mod offline;
pub mod output;
pub mod placement;
pub mod pools;
pub mod probes;
pub mod pystacks;
pub mod report;
pub mod session;
pub mod stacks;
pub mod target;
pub mod torch_npu;
pub mod tracefs;
pub mod tracker;
pub mod watchdog;
