//! CUDA seen from outside: what the runtime's memory calls and c10's allocator report mean.
//!
//! PyTorch's CUDA caching allocator calls `c10::reportMemoryUsageToProfiler` (exported by
//! `libc10.so`) at every block it hands out or takes back, with the allocator's own
//! `memory_allocated()`/`memory_reserved()` after the change, whether a profiler listens or
//! not; the CPU allocator calls it only while the profiler records memory. The report is
//! torch's `MemoryUsage` of torch_npu in registers, so it becomes the same pool change.

use crate::events::pools::{PoolKind, RegionChange};

/// The module id of the CUDA runtime's blocks (no HAL module has it): their rows say `CUDA`
/// and decompose names their owner `CUDA`.
pub const RUNTIME_MODULE: u32 = u32::MAX - 1;

/// `c10::DeviceType::CUDA`.
pub const DEVICE_TYPE_CUDA: u8 = 1;

/// One call of `reportMemoryUsageToProfiler(ptr, alloc_size, total_allocated, total_reserved,
/// device)`, its arguments as the registers held them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct C10Report {
    pub ptr: u64,
    /// Positive for a block handed out, negative for one taken back.
    pub size: i64,
    pub allocated: u64,
    pub reserved: u64,
    /// `c10::Device { int8 type; int8 index; }` in the low two bytes of `r8`.
    pub device_type: u8,
    pub device_index: i8,
}

impl C10Report {
    pub fn from_args(args: &[u64]) -> Self {
        C10Report {
            ptr: args[0],
            size: args[1] as i64,
            allocated: args[2],
            reserved: args[3],
            device_type: args[4] as u8,
            device_index: (args[4] >> 8) as u8 as i8,
        }
    }

    /// The caching allocator's block change, or None for another device type (a CPU tensor
    /// while the profiler records memory) or an empty report.
    pub fn change(&self) -> Option<(bool, RegionChange)> {
        if self.device_type != DEVICE_TYPE_CUDA || self.size == 0 || self.ptr == 0 {
            return None;
        }
        Some((
            self.size > 0,
            RegionChange {
                pool: PoolKind::PtaCaching,
                device: self.device_index.max(0) as u32,
                addr: self.ptr,
                size: self.size.unsigned_abs(),
                allocated: self.allocated,
                reserved: self.reserved,
            },
        ))
    }
}

/// Whether a runtime allocation entry point gives pinned host memory.
pub fn is_host(api: crate::trace::probes::ProbeId) -> bool {
    use crate::trace::probes::ProbeId::*;
    matches!(api, CudaMallocHost | CudaHostAlloc | CudaFreeHost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_of_cuda_blocks_become_pool_changes() {
        // cuda:1, a 512-byte block handed out, then taken back (size negated).
        let made = C10Report::from_args(&[0x7f00_0000_0200, 512, 1024, 2 << 20, 1 | 1 << 8]);
        let (malloc, c) = made.change().unwrap();
        assert!(malloc);
        assert_eq!((c.device, c.addr, c.size), (1, 0x7f00_0000_0200, 512));
        assert_eq!((c.allocated, c.reserved), (1024, 2 << 20));
        let gone = C10Report::from_args(&[0x7f00_0000_0200, (-512i64) as u64, 512, 2 << 20, 1]);
        let (malloc, c) = gone.change().unwrap();
        assert!(!malloc);
        assert_eq!((c.device, c.size, c.allocated), (0, 512, 512));
        // Upper bits of r8 are not the device's; a CPU tensor (type 0) is no CUDA block.
        let cpu = C10Report::from_args(&[0x1000, 64, 64, 0, 0xdead_0000_0000_ff00]);
        assert_eq!((cpu.device_type, cpu.device_index), (0, -1));
        assert_eq!(cpu.change(), None);
    }
}
