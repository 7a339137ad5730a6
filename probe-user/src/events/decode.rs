//! Raw ring-buffer records to typed events.
//!
//! Here: the record types and the dispatch by record kind; `decode/calls.rs` turns one
//! probe's record into a [`Call`] (strings read late when BPF could not), `decode/regions.rs`
//! puts mstx region lists back together from their chunks.

mod calls;
mod regions;
#[cfg(test)]
mod tests;

pub use calls::STRINGS_READ_LATE;
pub use calls::STRINGS_UNREAD;

use crate::events::hal::DrvMemProp;
use crate::trace::probes::ProbeId;
use calls::decode_call;
use probe_common::{
    BATCH_HEADER, BATCH_KIND, BATCH_WORDS, RAW_HEADER, RawEvent, event_flags, kind, packed,
};
use regions::decode_chunk;
use std::path::PathBuf;

/// A probed vendor call, with what the probe captured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    HalAlloc {
        size: u64,
        flag: u64,
        ret: i32,
        addr: Option<u64>,
    },
    HalFree {
        addr: u64,
        ret: i32,
    },
    HalCreate {
        size: u64,
        flag: u64,
        prop: Option<DrvMemProp>,
        ret: i32,
        handle: Option<u64>,
    },
    HalRelease {
        handle: u64,
        ret: i32,
    },
    AclInit {
        ret: i32,
    },
    AclFinalize {
        ret: i32,
    },
    SetDevice {
        device: i32,
        ret: i32,
    },
    Mark {
        text: String,
    },
    RangeStart {
        text: String,
        id: u64,
    },
    RangeEnd {
        id: u64,
    },
    /// NVTX's `nvtxRangePushA`/`nvtxRangePop`: ranges of a thread, ended innermost first.
    RangePush {
        text: String,
    },
    RangePop,
    DomainCreate {
        name: String,
        handle: u64,
    },
    /// The process called `exit()`; `stopped`: it waits for SIGCONT.
    Exiting {
        stopped: bool,
    },
    /// A kernel launch. `name` is the AICPU operator name, or filled in by the session for
    /// stub-function launches (symbolized while the process is alive).
    KernelLaunch {
        api: ProbeId,
        kernel: u64,
        tiling_key: Option<u64>,
        stream: u64,
        name: Option<String>,
        /// For `aclrt*` launches (traced to their return): how long the call took. `rt*`
        /// launches the same thread makes within it are that call's own, not new launches.
        duration_ns: Option<u64>,
    },
    /// `range`: the heap's `mstxMemVirtualRangeDesc_t`, when it could be read.
    HeapRegister {
        domain: u64,
        heap: u64,
        range: Option<RegionDesc>,
    },
    HeapUnregister {
        domain: u64,
        heap: u64,
    },
    /// One chunk of a batch: `first` is the index of `regions[0]` in the batch of `total`.
    RegionsRegister {
        domain: u64,
        regions: Vec<RegionDesc>,
        first: u64,
        total: u64,
    },
    RegionsUnregister {
        domain: u64,
        refs: Vec<RegionRef>,
        first: u64,
        total: u64,
    },
    /// One part of an ATB call (spec §1.8): `object` is the runner of `Runner::Execute`
    /// (with its `pack`), or the `Mki::LaunchParam` of `SaveLaunchParam` (`pack` 0).
    Atb {
        object: u64,
        pack: u64,
        event: AtbEvent,
    },
    /// A block event of torch_npu's caching or workspace allocator (`torch_npu.rs`).
    PtaUsage(crate::trace::torch_npu::MemoryUsage),
    /// What the located report function received is not a `MemoryUsage`: why.
    PtaNotUsage(String),
    /// MindSpore's pool handed out a tensor block (`AllocTensorMem`): `pool` is the pool
    /// object, `addr` 0 when it failed.
    MsPoolAlloc {
        pool: u64,
        size: u64,
        addr: u64,
        /// The pool's own used bytes after the call, when they could be read.
        pool_used: Option<u64>,
        /// The pool's own reserved bytes without VMM (`memory_reserved()`) after the call,
        /// when they could be read.
        pool_reserved: Option<u64>,
    },
    /// MindSpore's pool was asked to free the block at `addr` (`DoFreeTensorMem`); `freed`:
    /// it said it did.
    MsPoolFree {
        pool: u64,
        addr: u64,
        freed: bool,
        pool_used: Option<u64>,
        pool_reserved: Option<u64>,
    },
    /// MindSpore's pipeline enqueued `task` (`AsyncRQueue::Push`) for a worker thread.
    MsTaskPush {
        task: u64,
    },
    /// A worker thread started MindSpore pipeline `task` (its class's `Run()`).
    MsTaskRun {
        task: u64,
    },
    /// `aclrtReserveMemAddress`: `addr` when it could be read back.
    VmmReserve {
        addr: Option<u64>,
        size: u64,
        ret: i32,
    },
    VmmRelease {
        addr: u64,
        ret: i32,
    },
    /// `aclrtMapMem`: the physical `handle` (a `halMemCreate` handle) mapped at `addr`.
    VmmMap {
        addr: u64,
        size: u64,
        handle: u64,
        ret: i32,
    },
    VmmUnmap {
        addr: u64,
        ret: i32,
    },
    /// A CUDA runtime allocation (`api`: which entry point); `addr` when `*p` was read back.
    CudaAlloc {
        api: ProbeId,
        size: u64,
        ret: i32,
        addr: Option<u64>,
    },
    CudaFree {
        api: ProbeId,
        addr: u64,
        ret: i32,
    },
    /// The driver's `cuMemCreate`: physical memory behind a handle (torch's expandable
    /// segments map it with `cuMemMap`, decoded as `VmmMap`).
    CudaCreate {
        size: u64,
        ret: i32,
        handle: Option<u64>,
    },
    /// c10's caching allocator reported a block (`events/cuda.rs`).
    C10Usage(crate::events::cuda::C10Report),
    /// An operator of the op API ran (`aclnn.rs`): `op` indexes the registered names.
    OpLaunch {
        op: u32,
        workspace: u64,
        workspace_size: u64,
        ret: i32,
        /// From entry to return.
        duration_ns: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AtbEvent {
    /// The runner's operation name (entry).
    Name(String),
    /// The runner's save-tensor directory (entry).
    Dir(String),
    /// The variant pack's workspace (entry): `workspace_size` is the workspace plus the
    /// intermediate buffer, as msMemScope reports it.
    Pack { workspace: u64, workspace_size: u64 },
    /// `Runner::Execute` returned.
    End,
    /// Tensors of the pack, before (entry) or after (return) execution; `first` is the index
    /// of `tensors[0]` in the array.
    Tensors {
        output: bool,
        after: bool,
        tensors: Vec<AtbTensor>,
        first: u64,
    },
    /// `SaveLaunchParam`'s directory path, `<dir>/<kernel>/before` or `.../after`.
    KernelDir(String),
    /// The launch parameter's tensors.
    KernelTensors {
        output: bool,
        tensors: Vec<AtbTensor>,
        first: u64,
    },
}

/// An `atb::Tensor` (probes::atb has the layout).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AtbTensor {
    pub addr: u64,
    pub size: u64,
    pub dtype: i32,
    pub format: i32,
    pub shape: Vec<i64>,
}

impl AtbTensor {
    fn from_bytes(b: &[u8]) -> Option<Self> {
        use crate::trace::probes::atb;
        let dims = (u64_at(b, atb::TENSOR_DIM_NUM)? as usize).min(atb::TENSOR_DIMS);
        Some(AtbTensor {
            addr: u64_at(b, atb::TENSOR_DEVICE_DATA)?,
            size: u64_at(b, atb::TENSOR_DATA_SIZE)?,
            dtype: u32_at(b, 0)? as i32,
            format: u32_at(b, 4)? as i32,
            shape: (0..dims)
                .map(|i| u64_at(b, 8 + i * 8).map(|d| d as i64))
                .collect::<Option<_>>()?,
        })
    }

    /// msMemScope's ATB access Attr: `dtype:<enum>,format:<enum>,shape:[d0,d1,]`.
    pub fn attr(&self) -> String {
        let mut s = format!("dtype:{},format:{},shape:[", self.dtype, self.format);
        for d in &self.shape {
            s.push_str(&d.to_string());
            s.push(',');
        }
        s.push(']');
        s
    }
}

/// A memory region reported by a framework pool (`mstxMemVirtualRangeDesc_t`), with the handle
/// the mstx library returned for it (0 if none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionDesc {
    pub device: u32,
    pub ptr: u64,
    pub size: u64,
    pub handle: u64,
}

/// `mstxMemRegionRef_t`: a region named by its address or by its handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionRef {
    Pointer(u64),
    Handle(u64),
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

fn range_desc(b: &[u8]) -> Option<RegionDesc> {
    Some(RegionDesc {
        device: u32_at(b, 0)?,
        ptr: u64_at(b, 8)?,
        size: u64_at(b, 16)?,
        handle: 0,
    })
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallEvent {
    pub pid: u32,
    pub tid: u32,
    /// CLOCK_MONOTONIC ns at which the call took effect: the return of an allocation, the
    /// entry of a free (so a free and a racing reuse of the address order correctly).
    pub ts_mono: u64,
    pub call: Call,
    /// Captured at the function's return (registers and stack are the caller's after it).
    pub at_return: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded {
    Call(CallEvent),
    /// `stopped`: the child was stopped before its first instruction (`Bpf::hold_children`).
    Fork {
        parent: u32,
        child: u32,
        stopped: bool,
        ts_mono: u64,
    },
    /// `stopped`: the BPF side stopped the process; it must be continued once handled.
    Exec {
        pid: u32,
        path: PathBuf,
        stopped: bool,
        ts_mono: u64,
    },
    Exit {
        pid: u32,
        ts_mono: u64,
    },
    Open {
        pid: u32,
        dfd: i32,
        path: PathBuf,
        stopped: bool,
        ts_mono: u64,
        /// Who opened it, the path's `probe_common::path_hash` and the cgroup id (the agent's
        /// hold, `trace::hold`; 0 elsewhere).
        tid: u32,
        path_hash: u64,
        cgroup: u64,
        /// Opened for writing (probe-ebpf's `shared_object_open` sends no name hash then): a
        /// file being made or rewritten, not loaded.
        for_writing: bool,
    },
}

impl Decoded {
    pub fn ts_mono(&self) -> u64 {
        match self {
            Decoded::Call(c) => c.ts_mono,
            Decoded::Fork { ts_mono, .. }
            | Decoded::Exec { ts_mono, .. }
            | Decoded::Exit { ts_mono, .. }
            | Decoded::Open { ts_mono, .. } => *ts_mono,
        }
    }
}

/// The calls of a batch record (`probe_common::BATCH_KIND`), unpacked into [`RawEvent`]
/// headers; None for other records. A call cut short by the end of the record ends the walk.
pub fn batch_calls(bytes: &[u8]) -> Option<PackedCalls<'_>> {
    if bytes.len() < BATCH_HEADER || u16::from_ne_bytes([bytes[0], bytes[1]]) != BATCH_KIND {
        return None;
    }
    let words = u32::from_ne_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
    let body = &bytes[BATCH_HEADER..];
    let len = (words.min(BATCH_WORDS) * 8).min(body.len() / 8 * 8);
    Some(PackedCalls {
        words: body[..len].chunks_exact(8),
    })
}

/// Iterator over the calls of a batch record: see [`batch_calls`].
pub struct PackedCalls<'a> {
    words: std::slice::ChunksExact<'a, u8>,
}

impl PackedCalls<'_> {
    fn word(&mut self) -> Option<u64> {
        let w = self.words.next()?;
        Some(u64::from_ne_bytes(w.try_into().ok()?))
    }
}

impl PackedCalls<'_> {
    /// The next call into `raw`, a CALL event that only ever holds packed calls: only the
    /// fields a packed call sets are written (a 360-byte event zeroed and moved per call was
    /// ~5% of the node agent's CPU). Returns false at the end of the batch.
    pub fn next_into(&mut self, raw: &mut RawEvent) -> bool {
        self.fill(raw).is_some()
    }

    fn fill(&mut self, raw: &mut RawEvent) -> Option<()> {
        let (ids, desc, ts_ns) = (self.word()?, self.word()?, self.word()?);
        raw.kind = kind::CALL;
        raw.pid = ids as u32;
        raw.tid = (ids >> 32) as u32;
        raw.probe = (desc & packed::PROBE_MASK) as u16;
        raw.flags = (desc >> packed::FLAGS_SHIFT & packed::FLAGS_MASK) as u16;
        raw.ts_ns = ts_ns;
        raw.ret_ts_ns = if desc & packed::RET_TS != 0 {
            self.word()?
        } else {
            ts_ns
        };
        raw.deref = if desc & packed::DEREF != 0 {
            self.word()?
        } else {
            0
        };
        raw.ret = if desc & packed::RET_WORD != 0 {
            self.word()?
        } else {
            (desc >> packed::RET_SHIFT) as u32 as i32 as i64 as u64
        };
        let kept = desc >> packed::ARGS_SHIFT & packed::ARGS_MASK;
        for (i, arg) in raw.args.iter_mut().enumerate() {
            *arg = if kept & 1 << i != 0 { self.word()? } else { 0 };
        }
        Some(())
    }
}

impl Iterator for PackedCalls<'_> {
    type Item = RawEvent;

    fn next(&mut self) -> Option<RawEvent> {
        let mut raw = RawEvent::zeroed();
        self.next_into(&mut raw).then_some(raw)
    }
}

/// Copies a record out of the ring buffer. `None` for short records.
pub fn raw_from_bytes(bytes: &[u8]) -> Option<RawEvent> {
    // Records carry the header and only the valid part of `data`.
    if bytes.len() < RAW_HEADER {
        return None;
    }
    let size = std::mem::size_of::<RawEvent>();
    let n = bytes.len().min(size);
    let mut ev = std::mem::MaybeUninit::<RawEvent>::uninit();
    // SAFETY: RawEvent is repr(C) plain integers and byte arrays, so any bytes are a valid
    // value; the first `n <= size` bytes are copied from the record and the rest zeroed (only
    // the rest: most records are a header and a short `data`), so every byte is initialized.
    unsafe {
        let p = ev.as_mut_ptr() as *mut u8;
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, n);
        std::ptr::write_bytes(p.add(n), 0, size - n);
        Some(ev.assume_init())
    }
}

pub fn decode(raw: &RawEvent) -> Option<Decoded> {
    let stopped = raw.flags & event_flags::STOPPED != 0;
    let path =
        || PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(raw.data()));
    match raw.kind {
        kind::CALL => decode_call(raw).map(Decoded::Call),
        kind::FORK => Some(Decoded::Fork {
            parent: raw.pid,
            child: raw.args[0] as u32,
            stopped,
            ts_mono: raw.ts_ns,
        }),
        kind::EXEC => Some(Decoded::Exec {
            pid: raw.pid,
            path: path(),
            stopped,
            ts_mono: raw.ts_ns,
        }),
        kind::EXIT => Some(Decoded::Exit {
            pid: raw.pid,
            ts_mono: raw.ts_ns,
        }),
        kind::CHUNK => decode_chunk(raw).map(Decoded::Call),
        kind::OPEN => Some(Decoded::Open {
            pid: raw.pid,
            dfd: raw.args[0] as i32,
            path: path(),
            stopped,
            ts_mono: raw.ts_ns,
            tid: raw.tid,
            path_hash: raw.args[1],
            cgroup: raw.args[3],
            for_writing: raw.args[2] == 0,
        }),
        _ => None,
    }
}
