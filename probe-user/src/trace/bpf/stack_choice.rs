//! Which calls get a stack, decided in BPF before anything is read (`probe-ebpf/src/sampling.rs`):
//! every call's (the default of the BPF side), or the calls that allocate only. The node agent
//! takes a byte-weighted sample of those (`agent::sampling`); a single run with the default
//! `--call-stack` takes all of them (the line that made each block: the leak and site views
//! read nothing else, and a free's walk would cost its thread as much as the allocation's).

use anyhow::{Context, Result, anyhow};
use aya::maps::{Array, MapData};
use probe_common::sampling::{
    MAX_MEAN_BYTES, SAMPLING_MEAN, SAMPLING_ON, SIZE_ALWAYS, SIZE_ARG, SIZE_DATA_I64, SIZE_NONE,
};

use super::Bpf;
use crate::trace::probes::ProbeId;

/// Where each allocating probe's size is, for the BPF side. Every other probe gets no stack.
fn size_sources(mean_bytes: u64) -> [(ProbeId, u32); 14] {
    let every_one = if mean_bytes == 0 {
        SIZE_ALWAYS
    } else {
        SIZE_NONE
    };
    [
        // halMemAlloc(void **pp, u64 size, u64 flag), halMemCreate(handle **h, size_t size, ...)
        (ProbeId::HalMemAlloc, SIZE_ARG | 1),
        (ProbeId::HalMemCreate, SIZE_ARG | 1),
        // CUDA: cudaMalloc*(void **p, size_t size, ...), cudaHostAlloc(void **p, size_t, flags),
        // cuMemCreate(handle *h, size_t size, ...).
        (ProbeId::CudaMalloc, SIZE_ARG | 1),
        (ProbeId::CudaMallocAsync, SIZE_ARG | 1),
        (ProbeId::CudaMallocManaged, SIZE_ARG | 1),
        (ProbeId::CudaMallocHost, SIZE_ARG | 1),
        (ProbeId::CudaHostAlloc, SIZE_ARG | 1),
        (ProbeId::CuMemCreate, SIZE_ARG | 1),
        // MindSpore: AbstractDynamicMemPool::AllocTensorMem(this, size_t size, ...).
        (ProbeId::MsAllocTensorMem, SIZE_ARG | 1),
        // c10::reportMemoryUsageToProfiler(void *ptr, int64_t alloc_size, ...): negative on free.
        (ProbeId::C10ReportMemoryUsage, SIZE_ARG | 1),
        // MemoryUsage.alloc_size (i64 at byte 16; negative when the report is a free).
        (ProbeId::PtaUsageOriginal, SIZE_DATA_I64 | 16),
        (ProbeId::PtaUsageWithComponent, SIZE_DATA_I64 | 16),
        // Pool regions registered through the mstx memory API come as one batch per call
        // whose sizes BPF does not add up: sampled, they carry no stack.
        (ProbeId::MstxMemRegionsRegister, every_one),
        // MindSpore's task push allocates nothing, but its Python line is the one the task's
        // blocks get (they are allocated on worker threads with no Python frame:
        // `state::tasks`).
        (ProbeId::MsTaskPush, every_one),
    ]
}

impl Bpf {
    /// Stacks for the calls that allocate only, before any probe is attached: a byte-weighted
    /// sample of mean spacing `mean_bytes`, or every one of them for 0.
    pub fn stacks_for_allocations(&mut self, mean_bytes: u64) -> Result<()> {
        let mut sizes: Array<&mut MapData, u32> = Array::try_from(
            self.map_mut("SAMPLE_SIZES")
                .ok_or_else(|| anyhow!("BPF map SAMPLE_SIZES missing"))?,
        )?;
        for (id, source) in size_sources(mean_bytes) {
            sizes
                .set(id as u32, source, 0)
                .with_context(|| format!("cannot store the size source of {id:?}"))?;
        }
        let mut sampling: Array<&mut MapData, u64> = Array::try_from(
            self.map_mut("SAMPLING")
                .ok_or_else(|| anyhow!("BPF map SAMPLING missing"))?,
        )?;
        sampling.set(SAMPLING_MEAN, mean_bytes.min(MAX_MEAN_BYTES), 0)?;
        sampling
            .set(SAMPLING_ON, 1, 0)
            .context("cannot turn stack sampling on")
    }
}
