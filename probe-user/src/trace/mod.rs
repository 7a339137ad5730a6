//! Stage 1, loading and attaching: which objects get which probes ([`attach`], the planner,
//! with [`probes`] the probe table and [`aclnn`] the op-function registry), where in each
//! function ([`placement`], [`torch_npu`] for the hidden allocator function, [`mindspore`] for
//! the pool's used-bytes counter), the BPF object
//! and its links ([`bpf`], [`bpf_log`], [`multi_uprobe`], [`scope`], [`tracefs`]), the
//! target itself ([`launch`], [`target`], [`watchdog`]), and what is remembered across runs
//! ([`disk_cache`]). The only part that needs root.
//!
//! Uses only the shared `log` and `settings`. Nothing downstream (`events`, `state`, `session`, `analysis`, `output`,
//! ...): the probe vocabulary flows down from here, never back (tests/layout.rs checks it).

pub mod aclnn;
pub mod attach;
pub mod bpf;
pub mod bpf_log;
pub mod disk_cache;
pub mod hold;
pub mod holders;
pub mod launch;
pub mod mindspore;
pub mod multi_uprobe;
pub mod placement;
pub mod probes;
pub mod scope;
pub mod target;
pub mod torch_npu;
pub mod tracefs;
pub mod watchdog;
