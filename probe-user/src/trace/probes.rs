//! The probe table: which vendor entry points are traced and what each one captures.
//! This is the only place that knows symbol names; the BPF programs only see probe ids.

use probe_common::{ALL_ARGS, NO_ARRAY2, ProbeSpec, spec_flags as sf};

/// Size of `struct drv_mem_prop` (five u32 and a u64 at offset 24).
pub const DRV_MEM_PROP_SIZE: u32 = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum ProbeId {
    HalMemAlloc = 1,
    HalMemFree = 2,
    HalMemCreate = 3,
    HalMemRelease = 4,
    AclInit = 5,
    AclFinalize = 6,
    AclrtSetDevice = 7,
    MstxMarkA = 8,
    MstxRangeStartA = 9,
    MstxRangeEnd = 10,
    MstxDomainCreateA = 11,
    MstxMemHeapRegister = 12,
    MstxMemHeapUnregister = 13,
    MstxMemRegionsRegister = 14,
    MstxMemRegionsUnregister = 15,
    LibcExit = 16,
    RtKernelLaunch = 17,
    RtKernelLaunchWithFlagV2 = 18,
    RtKernelLaunchWithHandleV2 = 19,
    RtAicpuKernelLaunchExWithArgs = 20,
    RtLaunchKernelByFuncHandle = 21,
    RtLaunchKernelByFuncHandleV2 = 22,
    AclrtLaunchKernelWithConfig = 23,
    AclrtLaunchKernelWithHostArgs = 24,
    AclrtLaunchKernelImpl = 25,
    AclrtLaunchKernelV2Impl = 26,
    // ATB (spec §1.8): several probes share one function, each capturing one part of the call.
    AtbRunnerName = 27,
    AtbRunnerDir = 28,
    AtbRunnerPack = 29,
    AtbInBefore = 30,
    AtbOutBefore = 31,
    AtbRunnerEnd = 32,
    AtbInAfter = 33,
    AtbOutAfter = 34,
    AtbKernelDir = 35,
    AtbKernelIn = 36,
    AtbKernelOut = 37,
    AtbKernelDirAbi0 = 38,
    AtbKernelInAbi0 = 39,
    AtbKernelOutAbi0 = 40,
    PyFinalize = 41,
    PyExit = 42,
    /// torch_npu's `reportMemoryDataToNpuProfiler(const MemoryUsage&)`, found by code analysis
    /// (`torch_npu.rs`); one id per `MemoryUsage` layout, so decoding knows which one it is.
    PtaUsageOriginal = 43,
    PtaUsageWithComponent = 44,
    /// Every `aclnnX(workspace, workspaceSize, executor, stream)` of the op libraries
    /// (`aclnn.rs`); the function is the cookie's upper bits.
    AclnnOp = 45,
    /// MindSpore's device memory pool (`libmindspore_memory_pool.so`, exported and unstripped):
    /// `AbstractDynamicMemPool::AllocTensorMem` and `DoFreeTensorMem`, one call per tensor block.
    MsAllocTensorMem = 46,
    MsFreeTensorMem = 47,
    /// Virtual memory management of the runtime (MindSpore's pool, torch_npu's expandable
    /// segments): a range of device addresses reserved, physical handles mapped into it.
    AclrtReserveMemAddress = 48,
    AclrtReleaseMemAddress = 49,
    AclrtMapMem = 50,
    AclrtUnmapMem = 51,
    /// The CUDA runtime's memory entry points and c10's allocator report (`probes/cuda.rs`).
    CudaMalloc = 52,
    CudaMallocAsync = 53,
    CudaMallocManaged = 54,
    CudaMallocHost = 55,
    CudaHostAlloc = 56,
    CudaFree = 57,
    CudaFreeAsync = 58,
    CudaFreeHost = 59,
    CudaSetDevice = 60,
    C10ReportMemoryUsage = 61,
    NvtxRangePushA = 62,
    NvtxRangePop = 63,
    CuMemAddressReserve = 64,
    CuMemAddressFree = 65,
    CuMemCreate = 66,
    CuMemRelease = 67,
    CuMemMap = 68,
    CuMemUnmap = 69,
    /// MindSpore's pipeline (`runtime::AsyncRQueue::Push`): a task enqueued for a worker
    /// thread, with the Python stack of the thread that enqueued it.
    MsTaskPush = 70,
    /// A MindSpore pipeline task starting (`Run()` of each task class; several functions
    /// share this id): what its thread does next is done for the task's enqueuer.
    MsTaskRun = 71,
}

impl ProbeId {
    pub fn from_raw(raw: u16) -> Option<Self> {
        PROBES.iter().find(|p| p.id as u16 == raw).map(|p| p.id)
    }
}

/// Which objects a probe belongs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Home {
    /// Only in a library whose file name starts with this (e.g. `libascend_hal.so`, also
    /// `libascend_hal.so.1`), or one named by `--lib`.
    Library(&'static str),
    /// In every mapped object that exports the symbol (mstx can be linked into anything).
    AnyExporter,
    /// Not exported: found by analysing the code of `libtorch_npu.so` (`torch_npu::locate`);
    /// `symbol` is only the name shown to users.
    TorchNpu,
    /// Every operator function of an op library (`aclnn.rs`).
    OpApi,
}

#[derive(Clone, Copy, Debug)]
pub struct ProbeDef {
    pub id: ProbeId,
    pub symbol: &'static str,
    pub home: Home,
    pub spec: ProbeSpec,
}

impl ProbeDef {
    pub fn wants_return(&self) -> bool {
        self.spec.flags & sf::WANTS_RETURN != 0
    }
}

pub const HAL_LIBRARY: &str = "libascend_hal.so";
pub const ACL_LIBRARY: &str = "libascendcl.so";
pub const MSTX_LIBRARY: &str = "libms_tools_ext.so";
pub const RUNTIME_LIBRARY: &str = "libruntime.so";
pub const ACL_IMPL_LIBRARY: &str = "libascendcl_impl.so";
pub const ACL_RT_IMPL_LIBRARY: &str = "libacl_rt_impl.so";
pub const ATB_LIBRARY: &str = "libatb.so";
/// Library names searched for ahead of time so they get probes before they are mapped.
pub const KNOWN_LIBRARIES: [&str; 7] = [
    HAL_LIBRARY,
    ACL_LIBRARY,
    MSTX_LIBRARY,
    RUNTIME_LIBRARY,
    ACL_IMPL_LIBRARY,
    ACL_RT_IMPL_LIBRARY,
    ATB_LIBRARY,
];

/// Where a kernel launch entry point keeps what names the kernel and its stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchArgs {
    /// The argument naming the kernel: a function address (stub), a handle, or (for AICPU) a
    /// string copied into the event.
    pub kernel_arg: usize,
    pub kernel: KernelRef,
    pub stream_arg: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelRef {
    /// The address of the kernel's stub function: named by symbolizing it.
    Function,
    /// An opaque function handle (with a tiling key in `args[1]` for the V2 handle launch).
    Handle,
    /// A C string (the AICPU operator name).
    Name,
}

/// The launch entry points (spec §1.4) and their arguments.
pub fn launch_args(id: ProbeId) -> Option<LaunchArgs> {
    use KernelRef::*;
    let (kernel_arg, kernel, stream_arg) = match id {
        ProbeId::RtKernelLaunch => (0, Function, 5),
        ProbeId::RtKernelLaunchWithFlagV2 => (0, Function, 4),
        ProbeId::RtKernelLaunchWithHandleV2 => (0, Handle, 5),
        ProbeId::RtAicpuKernelLaunchExWithArgs => (1, Name, 5),
        ProbeId::RtLaunchKernelByFuncHandle | ProbeId::RtLaunchKernelByFuncHandleV2 => {
            (0, Handle, 3)
        }
        ProbeId::AclrtLaunchKernelWithConfig | ProbeId::AclrtLaunchKernelWithHostArgs => {
            (0, Handle, 2)
        }
        ProbeId::AclrtLaunchKernelImpl => (0, Handle, 4),
        ProbeId::AclrtLaunchKernelV2Impl => (0, Handle, 5),
        _ => return None,
    };
    Some(LaunchArgs {
        kernel_arg,
        kernel,
        stream_arg,
    })
}

pub(crate) const NONE: ProbeSpec = ProbeSpec {
    flags: 0,
    data_arg: 0,
    data_len: 0,
    deref_arg: 0,
    indirect_off: 0,
    indirect_len: 0,
    count_off: 0,
    array_off: 0,
    elem_size: 0,
    per_chunk: 0,
    array2_off: NO_ARRAY2,
    elem2_size: 0,
    array2_base: 0,
    kept_args: ALL_ARGS,
    skip_off: 0,
    skip_value: 0,
};

const fn spec(flags: u32, data_arg: u32, data_len: u32, deref_arg: u32) -> ProbeSpec {
    ProbeSpec {
        flags,
        data_arg,
        data_len,
        deref_arg,
        ..NONE
    }
}

/// `spec` whose batched calls keep only the arguments `decode` reads (the others cost ring
/// buffer bytes for nothing; a test checks that decoding never needs a dropped one).
const fn keeping(spec: ProbeSpec, args: &[u32]) -> ProbeSpec {
    let mut kept = 0;
    let mut i = 0;
    while i < args.len() {
        kept |= 1 << args[i];
        i += 1;
    }
    ProbeSpec {
        kept_args: kept,
        ..spec
    }
}

/// Size of `mstxMemVirtualRangeDesc_t { u32 deviceId; const void *ptr; u64 size; }`.
pub const RANGE_DESC_SIZE: u32 = 24;
/// Size of `mstxMemRegionRef_t { u32 refType; union { ptr, handle }; }`.
pub const REGION_REF_SIZE: u32 = 16;
/// Regions per CHUNK event of `mstxMemRegionsRegister`: 7 descriptors (168 bytes), then their
/// handles at byte 192 (the BPF side's mask-friendly bounds, see `ProbeSpec`).
pub const REGIONS_PER_CHUNK: u32 = 7;
pub const REGION_HANDLES_BASE: u32 = 192;
/// References per CHUNK event of `mstxMemRegionsUnregister`.
pub const REFS_PER_CHUNK: u32 = 15;

/// `rt*` launches are entry probes. The `aclrt*` ones are traced to their return too: the
/// runtime launches they make on the way are not counted again (spec §1.4).
const fn launch(id: ProbeId, symbol: &'static str, lib: &'static str) -> ProbeDef {
    let acl = matches!(
        id,
        ProbeId::AclrtLaunchKernelWithConfig
            | ProbeId::AclrtLaunchKernelWithHostArgs
            | ProbeId::AclrtLaunchKernelImpl
            | ProbeId::AclrtLaunchKernelV2Impl
    );
    ProbeDef {
        id,
        symbol,
        home: Home::Library(lib),
        spec: spec(if acl { sf::WANTS_RETURN } else { 0 }, 0, 0, 0),
    }
}

pub mod atb;
pub use atb::{AtbPart, atb_part};
pub mod cuda;
pub mod mindspore;
pub use mindspore::*;

/// Every probe: Ascend's, then CUDA's.
pub const PROBES: [ProbeDef; 81] = concat(ASCEND, cuda::PROBES);

const fn concat<const A: usize, const B: usize, const N: usize>(
    a: [ProbeDef; A],
    b: [ProbeDef; B],
) -> [ProbeDef; N] {
    assert!(A + B == N && A > 0);
    let mut out = [a[0]; N];
    let mut i = 0;
    while i < N {
        out[i] = if i < A { a[i] } else { b[i - A] };
        i += 1;
    }
    out
}

/// A string reached through a pointer at `ptr_off` of the struct argument `arg`.
const fn string_field(arg: u32, ptr_off: u32) -> ProbeSpec {
    ProbeSpec {
        indirect_off: ptr_off,
        indirect_len: atb::STRING_MAX,
        ..spec(
            sf::DATA_IS_BYTES | sf::INDIRECT | sf::INDIRECT_STR,
            arg,
            ptr_off + 8,
            0,
        )
    }
}

/// The tensor array of the `SVector` at `vec_off` of the struct argument `arg`, as CHUNKs.
const fn tensor_walk(arg: u32, copy: u32, vec_off: u32, at_return: bool) -> ProbeSpec {
    let ret = if at_return { sf::WANTS_RETURN } else { 0 };
    ProbeSpec {
        count_off: vec_off + atb::SVECTOR_SIZE,
        array_off: vec_off + atb::SVECTOR_DATA,
        elem_size: atb::TENSOR_SIZE,
        per_chunk: atb::TENSORS_PER_CHUNK,
        ..spec(ret | sf::DATA_IS_BYTES | sf::BATCH, arg, copy, 0)
    }
}

/// Runners run runners (a graph runner executes its nodes), so every ATB probe that waits
/// for a return is `NESTED`.
const fn atb_probe(id: ProbeId, symbol: &'static str, spec: ProbeSpec) -> ProbeDef {
    let nested = if spec.flags & sf::WANTS_RETURN != 0 {
        sf::NESTED
    } else {
        0
    };
    ProbeDef {
        id,
        symbol,
        home: Home::Library(ATB_LIBRARY),
        spec: ProbeSpec {
            flags: spec.flags | nested,
            ..spec
        },
    }
}

/// Ascend's probes (CANN, torch_npu, MindSpore, ATB, mstx, Python's exit).
const ASCEND: [ProbeDef; 63] = [
    // drvError_t halMemAlloc(void **pp, u64 size, u64 flag): *pp is read at return.
    ProbeDef {
        id: ProbeId::HalMemAlloc,
        symbol: "halMemAlloc",
        home: Home::Library(HAL_LIBRARY),
        spec: keeping(
            spec(
                sf::WANTS_RETURN | sf::DEREF_AT_RETURN | sf::TIME_AT_RETURN,
                0,
                0,
                0,
            ),
            &[1, 2],
        ),
    },
    // drvError_t halMemFree(void *p): only successful frees count.
    ProbeDef {
        id: ProbeId::HalMemFree,
        symbol: "halMemFree",
        home: Home::Library(HAL_LIBRARY),
        spec: keeping(spec(sf::WANTS_RETURN | sf::TIME_AT_ENTRY, 0, 0, 0), &[0]),
    },
    // drvError_t halMemCreate(handle **h, size_t size, const drv_mem_prop *prop, u64 flag)
    ProbeDef {
        id: ProbeId::HalMemCreate,
        symbol: "halMemCreate",
        home: Home::Library(HAL_LIBRARY),
        spec: spec(
            sf::WANTS_RETURN | sf::DEREF_AT_RETURN | sf::DATA_IS_BYTES,
            2,
            DRV_MEM_PROP_SIZE,
            0,
        ),
    },
    // drvError_t halMemRelease(handle *h)
    ProbeDef {
        id: ProbeId::HalMemRelease,
        symbol: "halMemRelease",
        home: Home::Library(HAL_LIBRARY),
        spec: keeping(spec(sf::WANTS_RETURN | sf::TIME_AT_ENTRY, 0, 0, 0), &[0]),
    },
    ProbeDef {
        id: ProbeId::AclInit,
        symbol: "aclInit",
        home: Home::Library(ACL_LIBRARY),
        spec: keeping(spec(sf::WANTS_RETURN | sf::TIME_AT_RETURN, 0, 0, 0), &[]),
    },
    ProbeDef {
        id: ProbeId::AclFinalize,
        symbol: "aclFinalize",
        home: Home::Library(ACL_LIBRARY),
        spec: keeping(spec(sf::WANTS_RETURN | sf::TIME_AT_ENTRY, 0, 0, 0), &[]),
    },
    // aclError aclrtSetDevice(int32_t deviceId): gives marks and ranges their device.
    ProbeDef {
        id: ProbeId::AclrtSetDevice,
        symbol: "aclrtSetDevice",
        home: Home::Library(ACL_LIBRARY),
        spec: keeping(spec(sf::WANTS_RETURN | sf::TIME_AT_RETURN, 0, 0, 0), &[0]),
    },
    // void mstxMarkA(const char *message, aclrtStream stream)
    ProbeDef {
        id: ProbeId::MstxMarkA,
        symbol: "mstxMarkA",
        home: Home::AnyExporter,
        spec: spec(sf::DATA_IS_STRING, 0, 0, 0),
    },
    // uint64_t mstxRangeStartA(const char *message, aclrtStream stream): returns the range id.
    ProbeDef {
        id: ProbeId::MstxRangeStartA,
        symbol: "mstxRangeStartA",
        home: Home::AnyExporter,
        spec: spec(sf::WANTS_RETURN | sf::DATA_IS_STRING, 0, 0, 0),
    },
    // void mstxRangeEnd(uint64_t id)
    ProbeDef {
        id: ProbeId::MstxRangeEnd,
        symbol: "mstxRangeEnd",
        home: Home::AnyExporter,
        spec: spec(0, 0, 0, 0),
    },
    // mstxDomainHandle_t mstxDomainCreateA(const char *name): names the memory pools.
    ProbeDef {
        id: ProbeId::MstxDomainCreateA,
        symbol: "mstxDomainCreateA",
        home: Home::AnyExporter,
        spec: spec(sf::WANTS_RETURN | sf::DATA_IS_STRING, 0, 0, 0),
    },
    // mstxMemHeapHandle_t mstxMemHeapRegister(domain, const mstxMemHeapDesc_t *desc):
    // the 16-byte heap descriptor, then the range descriptor its typeSpecificDesc points to.
    ProbeDef {
        id: ProbeId::MstxMemHeapRegister,
        symbol: "mstxMemHeapRegister",
        home: Home::AnyExporter,
        spec: ProbeSpec {
            indirect_off: 8,
            indirect_len: RANGE_DESC_SIZE,
            ..spec(
                sf::WANTS_RETURN | sf::DATA_IS_BYTES | sf::INDIRECT,
                1,
                16,
                0,
            )
        },
    },
    // void mstxMemHeapUnregister(domain, heap)
    ProbeDef {
        id: ProbeId::MstxMemHeapUnregister,
        symbol: "mstxMemHeapUnregister",
        home: Home::AnyExporter,
        spec: spec(0, 0, 0, 0),
    },
    // void mstxMemRegionsRegister(domain, const mstxMemRegionsRegisterBatch_t *batch):
    // walked at return, when the callee has filled regionHandleArrayOut.
    ProbeDef {
        id: ProbeId::MstxMemRegionsRegister,
        symbol: "mstxMemRegionsRegister",
        home: Home::AnyExporter,
        spec: ProbeSpec {
            count_off: 16,
            array_off: 24,
            elem_size: RANGE_DESC_SIZE,
            per_chunk: REGIONS_PER_CHUNK,
            array2_off: 32,
            elem2_size: 8,
            array2_base: REGION_HANDLES_BASE,
            ..spec(sf::WANTS_RETURN | sf::DATA_IS_BYTES | sf::BATCH, 1, 40, 0)
        },
    },
    // void mstxMemRegionsUnregister(domain, const mstxMemRegionsUnregisterBatch_t *batch)
    ProbeDef {
        id: ProbeId::MstxMemRegionsUnregister,
        symbol: "mstxMemRegionsUnregister",
        home: Home::AnyExporter,
        spec: ProbeSpec {
            count_off: 0,
            array_off: 8,
            elem_size: REGION_REF_SIZE,
            per_chunk: REFS_PER_CHUNK,
            ..spec(sf::DATA_IS_BYTES | sf::BATCH, 1, 16, 0)
        },
    },
    // void exit(int): with stacks in launch mode, the process is held here until user space
    // has snapshotted its mappings (a short-lived process is otherwise gone before its stacks
    // are symbolized). Attached only when stacks are collected.
    ProbeDef {
        id: ProbeId::LibcExit,
        symbol: "exit",
        home: Home::Library("libc.so.6"),
        spec: spec(sf::STOP_AT_ENTRY, 0, 0, 0),
    },
    // int Py_FinalizeEx(void): with Python stacks in launch mode, the process is held here
    // until user space has read the code objects of its last samples (finalizing frees them,
    // and a short script gets there before its samples are read). In libpython or a
    // statically linked python, which export it.
    ProbeDef {
        id: ProbeId::PyFinalize,
        symbol: "Py_FinalizeEx",
        home: Home::AnyExporter,
        spec: spec(sf::STOP_AT_ENTRY, 0, 0, 0),
    },
    // void Py_Exit(int): `SystemExit` (sys.exit(), `raise SystemExit`) finalizes through it,
    // and from 3.13 on without calling Py_FinalizeEx.
    ProbeDef {
        id: ProbeId::PyExit,
        symbol: "Py_Exit",
        home: Home::AnyExporter,
        spec: spec(sf::STOP_AT_ENTRY, 0, 0, 0),
    },
    // Kernel launches (spec §1.4): entry probes; the kernel is named in user space.
    launch(ProbeId::RtKernelLaunch, "rtKernelLaunch", RUNTIME_LIBRARY),
    launch(
        ProbeId::RtKernelLaunchWithFlagV2,
        "rtKernelLaunchWithFlagV2",
        RUNTIME_LIBRARY,
    ),
    launch(
        ProbeId::RtKernelLaunchWithHandleV2,
        "rtKernelLaunchWithHandleV2",
        RUNTIME_LIBRARY,
    ),
    ProbeDef {
        id: ProbeId::RtAicpuKernelLaunchExWithArgs,
        symbol: "rtAicpuKernelLaunchExWithArgs",
        home: Home::Library(RUNTIME_LIBRARY),
        spec: spec(sf::DATA_IS_STRING, 1, 0, 0),
    },
    launch(
        ProbeId::RtLaunchKernelByFuncHandle,
        "rtLaunchKernelByFuncHandle",
        RUNTIME_LIBRARY,
    ),
    launch(
        ProbeId::RtLaunchKernelByFuncHandleV2,
        "rtLaunchKernelByFuncHandleV2",
        RUNTIME_LIBRARY,
    ),
    launch(
        ProbeId::AclrtLaunchKernelWithConfig,
        "aclrtLaunchKernelWithConfig",
        ACL_LIBRARY,
    ),
    launch(
        ProbeId::AclrtLaunchKernelWithHostArgs,
        "aclrtLaunchKernelWithHostArgs",
        ACL_LIBRARY,
    ),
    launch(
        ProbeId::AclrtLaunchKernelImpl,
        "aclrtLaunchKernelImpl",
        ACL_IMPL_LIBRARY,
    ),
    launch(
        ProbeId::AclrtLaunchKernelV2Impl,
        "aclrtLaunchKernelV2Impl",
        ACL_IMPL_LIBRARY,
    ),
    // Status atb::Runner::Execute(RunnerVariantPack &pack): at entry the runner's name and
    // save-tensor dir, the pack (workspace) and its tensors; at return, the tensors again.
    atb_probe(
        ProbeId::AtbRunnerName,
        atb::EXECUTE,
        string_field(0, atb::RUNNER_NAME),
    ),
    atb_probe(
        ProbeId::AtbRunnerDir,
        atb::EXECUTE,
        string_field(0, atb::RUNNER_DIR),
    ),
    atb_probe(
        ProbeId::AtbRunnerPack,
        atb::EXECUTE,
        spec(sf::DATA_IS_BYTES, 1, atb::PACK_COPY, 0),
    ),
    atb_probe(
        ProbeId::AtbInBefore,
        atb::EXECUTE,
        tensor_walk(1, atb::PACK_COPY, atb::PACK_IN, false),
    ),
    atb_probe(
        ProbeId::AtbOutBefore,
        atb::EXECUTE,
        tensor_walk(1, atb::PACK_COPY, atb::PACK_OUT, false),
    ),
    atb_probe(
        ProbeId::AtbRunnerEnd,
        atb::EXECUTE,
        spec(sf::WANTS_RETURN, 0, 0, 0),
    ),
    atb_probe(
        ProbeId::AtbInAfter,
        atb::EXECUTE,
        tensor_walk(1, atb::PACK_COPY, atb::PACK_IN, true),
    ),
    atb_probe(
        ProbeId::AtbOutAfter,
        atb::EXECUTE,
        tensor_walk(1, atb::PACK_COPY, atb::PACK_OUT, true),
    ),
    // void atb::StoreUtil::SaveLaunchParam(void *stream, const Mki::LaunchParam &param,
    // const std::string &dirPath), in both string ABIs: the path and the kernel's tensors.
    atb_probe(
        ProbeId::AtbKernelDir,
        atb::SAVE_LAUNCH_PARAM_ABI1,
        string_field(2, 0),
    ),
    atb_probe(
        ProbeId::AtbKernelIn,
        atb::SAVE_LAUNCH_PARAM_ABI1,
        tensor_walk(1, 48, atb::PARAM_IN, false),
    ),
    atb_probe(
        ProbeId::AtbKernelOut,
        atb::SAVE_LAUNCH_PARAM_ABI1,
        tensor_walk(1, 48, atb::PARAM_OUT, false),
    ),
    atb_probe(
        ProbeId::AtbKernelDirAbi0,
        atb::SAVE_LAUNCH_PARAM_ABI0,
        string_field(2, 0),
    ),
    atb_probe(
        ProbeId::AtbKernelInAbi0,
        atb::SAVE_LAUNCH_PARAM_ABI0,
        tensor_walk(1, 48, atb::PARAM_IN, false),
    ),
    atb_probe(
        ProbeId::AtbKernelOutAbi0,
        atb::SAVE_LAUNCH_PARAM_ABI0,
        tensor_walk(1, 48, atb::PARAM_OUT, false),
    ),
    // void reportMemoryDataToNpuProfiler(const MemoryUsage &usage): the struct is copied at
    // entry; it describes a block event that has already happened. BPF drops its BLOCK_FREE
    // reports (no row needs them) by `data_type`, at +2 or +3 by layout.
    ProbeDef {
        id: ProbeId::PtaUsageOriginal,
        symbol: "torch_npu::profiler::reportMemoryDataToNpuProfiler",
        home: Home::TorchNpu,
        spec: crate::trace::torch_npu::probe_spec(crate::trace::torch_npu::UsageLayout::Original),
    },
    ProbeDef {
        id: ProbeId::PtaUsageWithComponent,
        symbol: "torch_npu::profiler::reportMemoryDataToNpuProfiler",
        home: Home::TorchNpu,
        spec: crate::trace::torch_npu::probe_spec(
            crate::trace::torch_npu::UsageLayout::WithComponent,
        ),
    },
    // aclnnStatus aclnnX(void *workspace, u64 workspaceSize, aclOpExecutor *executor,
    // aclrtStream stream): entry and return date the operator. The executor's first word is
    // copied only so the call takes the unbatched path, whose event carries the function's
    // index (packed batch records have no room for it).
    ProbeDef {
        id: ProbeId::AclnnOp,
        symbol: "aclnn*",
        home: Home::OpApi,
        spec: spec(sf::WANTS_RETURN | sf::DATA_IS_BYTES, 2, 8, 0),
    },
    // MindSpore's pool (C++: NESTED, so the return is seen at the return instructions and an
    // exception may unwind through). The size is already the pool's aligned block size; the
    // block's address is the return value. `this` names the pool; at the return of both, the
    // pool's own used bytes are read through it (READ_CHAIN, `trace/mindspore.rs`). Dated at its return (a
    // NESTED call reads both ends' times): the driver memory it mapped on the way is then in
    // the pool's total.
    ProbeDef {
        id: ProbeId::MsAllocTensorMem,
        symbol: MS_ALLOC_TENSOR_MEM,
        home: Home::Library(MINDSPORE_POOL_LIBRARY),
        spec: keeping(
            spec(sf::WANTS_RETURN | sf::NESTED | sf::READ_CHAIN, 0, 0, 0),
            &[0, 1],
        ),
    },
    // The address is read through the reference at entry; the free counts only when the pool
    // says it freed the block (returns true).
    ProbeDef {
        id: ProbeId::MsFreeTensorMem,
        symbol: MS_FREE_TENSOR_MEM,
        home: Home::Library(MINDSPORE_POOL_LIBRARY),
        spec: spec(
            sf::WANTS_RETURN | sf::NESTED | sf::DATA_IS_BYTES | sf::READ_CHAIN,
            1,
            8,
            0,
        ),
    },
    // aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment,
    // void *expectPtr, uint64_t flags): *virPtr is read at return.
    ProbeDef {
        id: ProbeId::AclrtReserveMemAddress,
        symbol: "aclrtReserveMemAddress",
        home: Home::Library(ACL_LIBRARY),
        spec: keeping(spec(sf::WANTS_RETURN | sf::DEREF_AT_RETURN, 0, 0, 0), &[1]),
    },
    // aclError aclrtReleaseMemAddress(void *virPtr)
    ProbeDef {
        id: ProbeId::AclrtReleaseMemAddress,
        symbol: "aclrtReleaseMemAddress",
        home: Home::Library(ACL_LIBRARY),
        spec: keeping(spec(sf::WANTS_RETURN, 0, 0, 0), &[0]),
    },
    // aclError aclrtMapMem(void *virPtr, size_t size, size_t offset,
    // aclrtDrvMemHandle handle, uint64_t flags)
    ProbeDef {
        id: ProbeId::AclrtMapMem,
        symbol: "aclrtMapMem",
        home: Home::Library(ACL_LIBRARY),
        spec: keeping(spec(sf::WANTS_RETURN, 0, 0, 0), &[0, 1, 3]),
    },
    // aclError aclrtUnmapMem(void *virPtr)
    ProbeDef {
        id: ProbeId::AclrtUnmapMem,
        symbol: "aclrtUnmapMem",
        home: Home::Library(ACL_LIBRARY),
        spec: keeping(spec(sf::WANTS_RETURN, 0, 0, 0), &[0]),
    },
    // MindSpore's pipeline: the task is read through the shared_ptr reference at entry, with
    // the enqueuing thread's Python stack (no C stack: only the Python line is carried).
    ProbeDef {
        id: ProbeId::MsTaskPush,
        symbol: MS_TASK_PUSH,
        home: Home::Library(MINDSPORE_PIPELINE_LIBRARY),
        spec: spec(sf::DATA_IS_BYTES | sf::PYTHON_STACK_ONLY, 1, 8, 0),
    },
    ms_task_run(0),
    ms_task_run(1),
    ms_task_run(2),
    ms_task_run(3),
    ms_task_run(4),
    ms_task_run(5),
    ms_task_run(6),
    ms_task_run(7),
    ms_task_run(8),
    ms_task_run(9),
    ms_task_run(10),
];

/// The probes expected in a library of this file name (for "missing symbol" warnings).
pub fn expected_in(file_name: &str) -> Vec<&'static ProbeDef> {
    PROBES
        .iter()
        // Launch entry points vary between CANN versions, and a libatb.so has one string ABI:
        // a missing one is not worth a warning.
        .filter(|p| {
            launch_args(p.id).is_none()
                // The Python holds belong to whatever object has the interpreter.
                && !matches!(p.id, ProbeId::PyFinalize | ProbeId::PyExit)
                // MindSpore's pool says once for both functions (attach.rs).
                && !matches!(p.id, ProbeId::MsAllocTensorMem | ProbeId::MsFreeTensorMem)
                // Older runtimes have no virtual memory management.
                && !matches!(
                    p.id,
                    ProbeId::AclrtReserveMemAddress
                        | ProbeId::AclrtReleaseMemAddress
                        | ProbeId::AclrtMapMem
                        | ProbeId::AclrtUnmapMem
                )
                && !matches!(
                    atb_part(p.id),
                    Some(AtbPart::KernelDir | AtbPart::KernelTensors { .. })
                )
        })
        .filter(|p| match p.home {
            Home::Library(lib) => library_matches(file_name, lib),
            Home::AnyExporter => library_matches(file_name, MSTX_LIBRARY),
            Home::TorchNpu | Home::OpApi => false,
        })
        .collect()
}

/// Whether `file_name` is one of [`KNOWN_LIBRARIES`] (a versioned name too).
pub fn is_known_library(file_name: &str) -> bool {
    KNOWN_LIBRARIES
        .iter()
        .any(|lib| library_matches(file_name, lib))
}

/// `libascend_hal.so` matches `libascend_hal.so` and `libascend_hal.so.1.2`.
pub fn library_matches(file_name: &str, lib: &str) -> bool {
    file_name == lib
        || file_name
            .strip_prefix(lib)
            .is_some_and(|rest| rest.starts_with('.'))
}

#[cfg(test)]
mod tests;
