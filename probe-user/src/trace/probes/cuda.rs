//! The CUDA source's probes: the runtime's memory entry points (`libcudart.so`, driver-level
//! rows like the HAL's on Ascend), the c10 caching allocator's report function (`libc10.so`,
//! the framework pool's rows like torch_npu's), the driver's virtual memory management
//! (`libcuda.so`: torch's expandable segments, as `aclrt*Mem*` on Ascend) and NVTX's push/pop
//! ranges (`libnvToolsExt.so`, steps like mstx ranges). Both libraries export them, so no
//! code analysis is needed (unlike `libtorch_npu.so`).

use super::{Home, ProbeDef, ProbeId, keeping, spec};
use probe_common::spec_flags as sf;

pub const CUDART_LIBRARY: &str = "libcudart.so";
pub const C10_LIBRARY: &str = "libc10.so";
pub const DRIVER_LIBRARY: &str = "libcuda.so";
/// NVTX's library (the `nvidia-nvtx-cu12` wheel's, or the CUDA toolkit's). Code built with the
/// header-only NVTX 3 (torch's own `torch.cuda.nvtx`) calls through a table an injected tool
/// fills, and exports nothing a probe could sit on.
pub const NVTX_LIBRARY: &str = "libnvToolsExt.so";
/// `void c10::reportMemoryUsageToProfiler(void *ptr, int64_t alloc_size, size_t
/// total_allocated, size_t total_reserved, c10::Device device)`: the CUDA caching allocator
/// calls it at every block it hands out (`alloc_size` > 0) or takes back (< 0), with its
/// `memory_allocated()`/`memory_reserved()` after the change; `c10::Device` is two bytes in
/// one register (type, then index).
pub const C10_REPORT_MEMORY_USAGE: &str = "_ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE";

/// `cudaError_t cudaX(void **p, size_t size, ...)`: `*p` read at return, dated at return.
const fn allocation(id: ProbeId, symbol: &'static str) -> ProbeDef {
    ProbeDef {
        id,
        symbol,
        home: Home::Library(CUDART_LIBRARY),
        spec: keeping(
            spec(
                sf::WANTS_RETURN | sf::DEREF_AT_RETURN | sf::TIME_AT_RETURN,
                0,
                0,
                0,
            ),
            &[1],
        ),
    }
}

/// `cudaError_t cudaX(void *p, ...)`: only successful frees count, dated at entry.
const fn free(id: ProbeId, symbol: &'static str) -> ProbeDef {
    ProbeDef {
        id,
        symbol,
        home: Home::Library(CUDART_LIBRARY),
        spec: keeping(spec(sf::WANTS_RETURN | sf::TIME_AT_ENTRY, 0, 0, 0), &[0]),
    }
}

pub const PROBES: [ProbeDef; 18] = [
    allocation(ProbeId::CudaMalloc, "cudaMalloc"),
    allocation(ProbeId::CudaMallocAsync, "cudaMallocAsync"),
    allocation(ProbeId::CudaMallocManaged, "cudaMallocManaged"),
    allocation(ProbeId::CudaMallocHost, "cudaMallocHost"),
    allocation(ProbeId::CudaHostAlloc, "cudaHostAlloc"),
    free(ProbeId::CudaFree, "cudaFree"),
    free(ProbeId::CudaFreeAsync, "cudaFreeAsync"),
    free(ProbeId::CudaFreeHost, "cudaFreeHost"),
    // cudaError_t cudaSetDevice(int device): the thread's device for the runtime's blocks.
    ProbeDef {
        id: ProbeId::CudaSetDevice,
        symbol: "cudaSetDevice",
        home: Home::Library(CUDART_LIBRARY),
        spec: keeping(spec(sf::WANTS_RETURN | sf::TIME_AT_RETURN, 0, 0, 0), &[0]),
    },
    // Entry only: everything is in the five argument registers.
    ProbeDef {
        id: ProbeId::C10ReportMemoryUsage,
        symbol: C10_REPORT_MEMORY_USAGE,
        home: Home::Library(C10_LIBRARY),
        spec: keeping(spec(0, 0, 0, 0), &[0, 1, 2, 3, 4]),
    },
    // CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
    // CUdeviceptr addr, unsigned long long flags): *ptr read at return.
    ProbeDef {
        id: ProbeId::CuMemAddressReserve,
        symbol: "cuMemAddressReserve",
        home: Home::Library(DRIVER_LIBRARY),
        spec: keeping(spec(sf::WANTS_RETURN | sf::DEREF_AT_RETURN, 0, 0, 0), &[1]),
    },
    // CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
    ProbeDef {
        id: ProbeId::CuMemAddressFree,
        symbol: "cuMemAddressFree",
        home: Home::Library(DRIVER_LIBRARY),
        spec: keeping(spec(sf::WANTS_RETURN, 0, 0, 0), &[0]),
    },
    // CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
    // const CUmemAllocationProp *prop, unsigned long long flags): the handle read at return.
    ProbeDef {
        id: ProbeId::CuMemCreate,
        symbol: "cuMemCreate",
        home: Home::Library(DRIVER_LIBRARY),
        spec: keeping(
            spec(
                sf::WANTS_RETURN | sf::DEREF_AT_RETURN | sf::TIME_AT_RETURN,
                0,
                0,
                0,
            ),
            &[1],
        ),
    },
    // CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
    ProbeDef {
        id: ProbeId::CuMemRelease,
        symbol: "cuMemRelease",
        home: Home::Library(DRIVER_LIBRARY),
        spec: keeping(spec(sf::WANTS_RETURN | sf::TIME_AT_ENTRY, 0, 0, 0), &[0]),
    },
    // CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
    // CUmemGenericAllocationHandle handle, unsigned long long flags)
    ProbeDef {
        id: ProbeId::CuMemMap,
        symbol: "cuMemMap",
        home: Home::Library(DRIVER_LIBRARY),
        spec: keeping(spec(sf::WANTS_RETURN, 0, 0, 0), &[0, 1, 3]),
    },
    // CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
    ProbeDef {
        id: ProbeId::CuMemUnmap,
        symbol: "cuMemUnmap",
        home: Home::Library(DRIVER_LIBRARY),
        spec: keeping(spec(sf::WANTS_RETURN, 0, 0, 0), &[0]),
    },
    // int nvtxRangePushA(const char *message): the message is copied at entry. A call, not
    // an entry-only mark: NVIDIA's library sends the process's first NVTX call through a lazy
    // initialiser that tail-jumps back into nvtxRangePushA, so that push enters twice at one
    // stack pointer and returns once; pairing entry with return counts it once.
    ProbeDef {
        id: ProbeId::NvtxRangePushA,
        symbol: "nvtxRangePushA",
        home: Home::Library(NVTX_LIBRARY),
        spec: spec(sf::WANTS_RETURN | sf::DATA_IS_STRING, 0, 0, 0),
    },
    // int nvtxRangePop(void): ends the thread's innermost range.
    ProbeDef {
        id: ProbeId::NvtxRangePop,
        symbol: "nvtxRangePop",
        home: Home::Library(NVTX_LIBRARY),
        spec: spec(0, 0, 0, 0),
    },
];
