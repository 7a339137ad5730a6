//! Loading and attaching: which objects get which probes, where in each function, the BPF
//! object itself, starting or finding the target.

pub mod attach;
pub mod bpf;
pub mod launch;
pub mod multi_uprobe;
pub mod placement;
pub mod probes;
pub mod target;
pub mod torch_npu;
pub mod tracefs;
pub mod watchdog;
