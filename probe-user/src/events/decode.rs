//! Raw ring-buffer records to typed events.

use std::path::PathBuf;

use probe_common::{
    BATCH_HEADER, BATCH_KIND, BATCH_WORDS, RAW_HEADER, RawEvent, event_flags, kind, packed,
};

use crate::{events::hal::DrvMemProp, trace::probes::ProbeId};

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

impl Iterator for PackedCalls<'_> {
    type Item = RawEvent;

    fn next(&mut self) -> Option<RawEvent> {
        let ids = self.word()?;
        let desc = self.word()?;
        let ts_ns = self.word()?;
        let mut raw = RawEvent::zeroed();
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
        if desc & packed::DEREF != 0 {
            raw.deref = self.word()?;
        }
        raw.ret = if desc & packed::RET_WORD != 0 {
            self.word()?
        } else {
            (desc >> packed::RET_SHIFT) as u32 as i32 as i64 as u64
        };
        let kept = desc >> packed::ARGS_SHIFT & packed::ARGS_MASK;
        for (i, arg) in raw.args.iter_mut().enumerate() {
            if kept & 1 << i != 0 {
                *arg = self.word()?;
            }
        }
        Some(raw)
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
        }),
        _ => None,
    }
}

/// Strings the BPF side could not read and user space then read from `/proc/PID/mem`, and
/// ones it could not read either (left empty).
pub static STRINGS_READ_LATE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub static STRINGS_UNREAD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The NUL-terminated string at `addr` in process `pid` (at most
/// [`probe_common::DATA_LEN`] bytes, as the BPF side reads), read through `/proc/PID/mem` opened read
/// only; empty (and counted) when that fails too.
fn deferred_string(pid: u32, addr: u64) -> String {
    use std::{os::unix::fs::FileExt, sync::atomic::Ordering};
    let max = probe_common::DATA_LEN;
    let read = || -> Option<String> {
        if addr == 0 {
            return None;
        }
        let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
        let mut buf = vec![0u8; max];
        // A string near the end of a mapping: read what there is.
        let mut n = 0;
        while n < max {
            match mem.read_at(&mut buf[n..], addr + n as u64) {
                Ok(0) | Err(_) => break,
                Ok(k) => {
                    n += k;
                    if buf[..n].contains(&0) {
                        break;
                    }
                }
            }
        }
        let end = buf[..n].iter().position(|&b| b == 0)?;
        Some(String::from_utf8_lossy(&buf[..end]).into_owned())
    };
    match read() {
        Some(s) => {
            STRINGS_READ_LATE.fetch_add(1, Ordering::Relaxed);
            s
        }
        None => {
            STRINGS_UNREAD.fetch_add(1, Ordering::Relaxed);
            String::new()
        }
    }
}

fn decode_call(raw: &RawEvent) -> Option<CallEvent> {
    let id = ProbeId::from_raw(raw.probe)?;
    let ret = raw.ret as i32;
    let has_ret = raw.flags & event_flags::HAS_RET != 0;
    let deref = (raw.flags & event_flags::DEREF_FAULT == 0).then_some(raw.deref);
    let text = || {
        if raw.flags & event_flags::DATA_FAULT != 0 {
            // The BPF side cannot fault a page in (a string literal in a page the target
            // has not touched yet): read it from user space instead.
            deferred_string(raw.pid, raw.args[0])
        } else {
            String::from_utf8_lossy(raw.data()).into_owned()
        }
    };
    let (call, ts) = match id {
        ProbeId::HalMemAlloc => (
            Call::HalAlloc {
                size: raw.args[1],
                flag: raw.args[2],
                ret,
                addr: deref,
            },
            raw.ret_ts_ns,
        ),
        ProbeId::HalMemFree => (
            Call::HalFree {
                addr: raw.args[0],
                ret,
            },
            raw.ts_ns,
        ),
        ProbeId::HalMemCreate => (
            Call::HalCreate {
                size: raw.args[1],
                flag: raw.args[3],
                prop: (raw.flags & event_flags::DATA_FAULT == 0)
                    .then(|| DrvMemProp::from_bytes(raw.data()))
                    .flatten(),
                ret,
                handle: deref,
            },
            raw.ret_ts_ns,
        ),
        ProbeId::HalMemRelease => (
            Call::HalRelease {
                handle: raw.args[0],
                ret,
            },
            raw.ts_ns,
        ),
        ProbeId::AclInit => (Call::AclInit { ret }, raw.ret_ts_ns),
        ProbeId::AclFinalize => (Call::AclFinalize { ret }, raw.ts_ns),
        ProbeId::AclrtSetDevice => (
            Call::SetDevice {
                device: raw.args[0] as i32,
                ret,
            },
            raw.ret_ts_ns,
        ),
        ProbeId::MstxMarkA => (Call::Mark { text: text() }, raw.ts_ns),
        ProbeId::MstxRangeStartA => (
            Call::RangeStart {
                text: text(),
                id: raw.ret,
            },
            raw.ts_ns,
        ),
        ProbeId::MstxRangeEnd => (Call::RangeEnd { id: raw.args[0] }, raw.ts_ns),
        ProbeId::MstxDomainCreateA => (
            Call::DomainCreate {
                name: text(),
                handle: raw.ret,
            },
            raw.ret_ts_ns,
        ),
        ProbeId::MstxMemHeapRegister => (
            Call::HeapRegister {
                domain: raw.args[0],
                heap: raw.ret,
                range: (raw.flags & event_flags::DATA_FAULT == 0)
                    .then(|| range_desc(raw.data().get(16..)?))
                    .flatten(),
            },
            raw.ret_ts_ns,
        ),
        ProbeId::MstxMemHeapUnregister => (
            Call::HeapUnregister {
                domain: raw.args[0],
                heap: raw.args[1],
            },
            raw.ts_ns,
        ),
        ProbeId::AclnnOp => (
            Call::OpLaunch {
                op: raw.cpu,
                workspace: raw.args[0],
                workspace_size: raw.args[1],
                ret,
                duration_ns: raw.ret_ts_ns.saturating_sub(raw.ts_ns),
            },
            raw.ts_ns,
        ),
        ProbeId::PtaUsageOriginal | ProbeId::PtaUsageWithComponent => {
            if raw.flags & event_flags::DATA_FAULT != 0 {
                return None;
            }
            let layout = if id == ProbeId::PtaUsageOriginal {
                crate::trace::torch_npu::UsageLayout::Original
            } else {
                crate::trace::torch_npu::UsageLayout::WithComponent
            };
            let usage = crate::trace::torch_npu::MemoryUsage::decode(layout, raw.data())?;
            (Call::PtaUsage(usage), raw.ts_ns)
        }
        ProbeId::LibcExit | ProbeId::PyFinalize | ProbeId::PyExit => (
            Call::Exiting {
                stopped: raw.flags & event_flags::STOPPED != 0,
            },
            raw.ts_ns,
        ),
        ProbeId::RtKernelLaunch
        | ProbeId::RtKernelLaunchWithFlagV2
        | ProbeId::RtKernelLaunchWithHandleV2
        | ProbeId::RtAicpuKernelLaunchExWithArgs
        | ProbeId::RtLaunchKernelByFuncHandle
        | ProbeId::RtLaunchKernelByFuncHandleV2
        | ProbeId::AclrtLaunchKernelWithConfig
        | ProbeId::AclrtLaunchKernelWithHostArgs
        | ProbeId::AclrtLaunchKernelImpl
        | ProbeId::AclrtLaunchKernelV2Impl => {
            let a = crate::trace::probes::launch_args(id)?;
            (
                Call::KernelLaunch {
                    api: id,
                    kernel: raw.args[a.kernel_arg],
                    tiling_key: (id == ProbeId::RtKernelLaunchWithHandleV2).then_some(raw.args[1]),
                    stream: raw.args[a.stream_arg],
                    name: (a.kernel == crate::trace::probes::KernelRef::Name).then(text),
                    duration_ns: has_ret.then(|| raw.ret_ts_ns.saturating_sub(raw.ts_ns)),
                },
                raw.ts_ns,
            )
        }
        // Batches arrive as CHUNK events; a CALL record of these is never emitted.
        ProbeId::MstxMemRegionsRegister | ProbeId::MstxMemRegionsUnregister => return None,
        _ => {
            use crate::trace::probes::{AtbPart, atb, atb_part};
            let string = || indirect_string(raw, id);
            let (object, pack) = (raw.args[0], raw.args[1]);
            let (object, event, ts) = match atb_part(id)? {
                AtbPart::Name => (object, AtbEvent::Name(string()?), raw.ts_ns),
                AtbPart::Dir => (object, AtbEvent::Dir(string()?), raw.ts_ns),
                AtbPart::Pack => {
                    if raw.flags & event_flags::DATA_FAULT != 0 {
                        return None;
                    }
                    let d = raw.data();
                    let size = u64_at(d, atb::PACK_WORKSPACE_SIZE)?
                        .saturating_add(u64_at(d, atb::PACK_INTERMEDIATE_SIZE)?);
                    let event = AtbEvent::Pack {
                        workspace: u64_at(d, atb::PACK_WORKSPACE)?,
                        workspace_size: size,
                    };
                    (object, event, raw.ts_ns)
                }
                AtbPart::End => (object, AtbEvent::End, raw.ret_ts_ns),
                AtbPart::KernelDir => (raw.args[1], AtbEvent::KernelDir(string()?), raw.ts_ns),
                AtbPart::Tensors { .. } | AtbPart::KernelTensors { .. } => return None,
            };
            let pack = if matches!(event, AtbEvent::KernelDir(_)) {
                0
            } else {
                pack
            };
            (
                Call::Atb {
                    object,
                    pack,
                    event,
                },
                ts,
            )
        }
    };
    if id_wants_return(id) && !has_ret {
        return None;
    }
    Some(CallEvent {
        pid: raw.pid,
        tid: raw.tid,
        ts_mono: if ts == 0 { raw.ts_ns } else { ts },
        call,
        at_return: id_wants_return(id),
    })
}

fn decode_chunk(raw: &RawEvent) -> Option<CallEvent> {
    use crate::trace::probes::{
        RANGE_DESC_SIZE, REFS_PER_CHUNK, REGION_HANDLES_BASE, REGION_REF_SIZE,
    };
    if raw.flags & event_flags::DATA_FAULT != 0 {
        return None;
    }
    let data = &raw.data;
    let (domain, total, first, n) = (raw.args[0], raw.args[2], raw.args[3], raw.args[4] as usize);
    let (call, ts) = match ProbeId::from_raw(raw.probe)? {
        ProbeId::MstxMemRegionsRegister => {
            let has_handles = raw.flags & event_flags::DEREF_FAULT == 0;
            let regions = (0..n.min(crate::trace::probes::REGIONS_PER_CHUNK as usize))
                .filter_map(|i| {
                    let mut r = range_desc(&data[i * RANGE_DESC_SIZE as usize..])?;
                    if has_handles {
                        r.handle = u64_at(data, REGION_HANDLES_BASE as usize + i * 8).unwrap_or(0);
                    }
                    Some(r)
                })
                .collect();
            (
                Call::RegionsRegister {
                    domain,
                    regions,
                    first,
                    total,
                },
                raw.ret_ts_ns,
            )
        }
        ProbeId::MstxMemRegionsUnregister => {
            let refs = (0..n.min(REFS_PER_CHUNK as usize))
                .filter_map(|i| {
                    let at = i * REGION_REF_SIZE as usize;
                    let value = u64_at(data, at + 8)?;
                    Some(match u32_at(data, at)? {
                        0 => RegionRef::Pointer(value),
                        _ => RegionRef::Handle(value),
                    })
                })
                .collect();
            (
                Call::RegionsUnregister {
                    domain,
                    refs,
                    first,
                    total,
                },
                raw.ts_ns,
            )
        }
        id => {
            let part = crate::trace::probes::atb_part(id)?;
            let n = n.min(crate::trace::probes::atb::TENSORS_PER_CHUNK as usize);
            let size = crate::trace::probes::atb::TENSOR_SIZE as usize;
            let tensors = (0..n)
                .filter_map(|i| AtbTensor::from_bytes(data.get(i * size..(i + 1) * size)?))
                .collect();
            match part {
                crate::trace::probes::AtbPart::Tensors { output, after } => (
                    Call::Atb {
                        object: raw.args[0],
                        pack: raw.args[1],
                        event: AtbEvent::Tensors {
                            output,
                            after,
                            tensors,
                            first,
                        },
                    },
                    if after { raw.ret_ts_ns } else { raw.ts_ns },
                ),
                crate::trace::probes::AtbPart::KernelTensors { output } => (
                    Call::Atb {
                        object: raw.args[1],
                        pack: 0,
                        event: AtbEvent::KernelTensors {
                            output,
                            tensors,
                            first,
                        },
                    },
                    raw.ts_ns,
                ),
                _ => return None,
            }
        }
    };
    Some(CallEvent {
        pid: raw.pid,
        tid: raw.tid,
        ts_mono: if ts == 0 { raw.ts_ns } else { ts },
        call,
        at_return: id_wants_return(ProbeId::from_raw(raw.probe)?),
    })
}

/// The string an `INDIRECT_STR` probe appended after the struct it copied, up to its NUL.
fn indirect_string(raw: &RawEvent, id: ProbeId) -> Option<String> {
    if raw.flags & event_flags::DATA_FAULT != 0 {
        return None;
    }
    let spec = crate::trace::probes::PROBES
        .iter()
        .find(|p| p.id == id)?
        .spec;
    let s = raw.data().get(spec.data_len as usize..)?;
    let s = s.split(|b| *b == 0).next().unwrap_or(s);
    Some(String::from_utf8_lossy(s).into_owned())
}

fn id_wants_return(id: ProbeId) -> bool {
    crate::trace::probes::PROBES
        .iter()
        .find(|p| p.id == id)
        .is_some_and(|p| p.wants_return())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call_raw(id: ProbeId) -> RawEvent {
        let mut r = RawEvent::zeroed();
        r.kind = kind::CALL;
        r.probe = id as u16;
        r.pid = 10;
        r.tid = 11;
        r.ts_ns = 100;
        r.ret_ts_ns = 200;
        r.flags = event_flags::HAS_RET;
        r
    }

    /// The BPF side reads the clock once for probes flagged TIME_AT_ENTRY / TIME_AT_RETURN,
    /// at that end only: decoding must date them by that end, or its time would be a copy
    /// of the other one's that was never taken.
    #[test]
    fn one_clock_read_probes_are_dated_at_the_end_they_read() {
        use probe_common::spec_flags as sf;
        let mut checked = 0;
        for def in crate::trace::probes::PROBES.iter() {
            let flags = def.spec.flags;
            let expect = if flags & sf::TIME_AT_ENTRY != 0 {
                100
            } else if flags & sf::TIME_AT_RETURN != 0 {
                200
            } else {
                continue;
            };
            assert!(
                flags & (sf::TIME_AT_ENTRY | sf::TIME_AT_RETURN)
                    != sf::TIME_AT_ENTRY | sf::TIME_AT_RETURN,
                "{:?} has both one-clock flags",
                def.id
            );
            // Only calls without data take the pending-stack path that honours the flags.
            assert_eq!(
                flags & (sf::DATA_IS_STRING | sf::DATA_IS_BYTES | sf::NESTED),
                0
            );
            let mut r = call_raw(def.id);
            r.args = [0x7000, 4096, 0, 0, 0, 0];
            r.deref = 0x9000;
            let Some(Decoded::Call(c)) = decode(&r) else {
                panic!("{:?} does not decode", def.id)
            };
            assert_eq!(c.ts_mono, expect, "{:?}", def.id);
            checked += 1;
        }
        // halMemAlloc/Free/Release, aclInit/Finalize, aclrtSetDevice.
        assert_eq!(checked, 6);
    }

    /// A batch record as the BPF side writes it (layout written out here word by word, not
    /// through a shared encoder, so a change on one side shows).
    fn batch(words: &[u64]) -> Vec<u8> {
        let mut bytes = vec![0u8; BATCH_HEADER];
        bytes[0..2].copy_from_slice(&BATCH_KIND.to_ne_bytes());
        bytes[4..8].copy_from_slice(&(words.len() as u32).to_ne_bytes());
        for w in words {
            bytes.extend_from_slice(&w.to_ne_bytes());
        }
        bytes
    }

    #[test]
    fn batch_calls_unpack_every_layout() {
        let ids = 77u64 | 78 << 32;
        let words = [
            // halMemAlloc: one timestamp, deref, ret 0 in the descriptor, args 1 and 2.
            ids,
            ProbeId::HalMemAlloc as u64
                | (event_flags::HAS_RET as u64) << 8
                | 0b110 << 16
                | 1 << 23,
            500,
            0xdead_0000,
            4096,
            1 << 10,
            // halMemFree failing with -1 (fits an i32: sign-extended), arg 0.
            ids,
            ProbeId::HalMemFree as u64
                | (event_flags::HAS_RET as u64) << 8
                | 1 << 16
                | 0xffff_ffff << 32,
            600,
            0xbeef,
            // Two timestamps, a 64-bit return value in its own word, a deref that faulted,
            // arguments 0 and 5.
            ids,
            9 | ((event_flags::HAS_RET | event_flags::DEREF_FAULT) as u64) << 8
                | 0b100001 << 16
                | 1 << 22
                | 1 << 23
                | 1 << 24,
            700,
            750,
            0,
            0x1_0000_0000,
            11,
            66,
        ];
        let calls: Vec<RawEvent> = batch_calls(&batch(&words)).unwrap().collect();
        assert_eq!(calls.len(), 3);
        let c = &calls[0];
        assert_eq!(
            (c.kind, c.pid, c.tid, c.probe),
            (kind::CALL, 77, 78, ProbeId::HalMemAlloc as u16)
        );
        assert_eq!(
            (c.ts_ns, c.ret_ts_ns, c.ret, c.deref),
            (500, 500, 0, 0xdead_0000)
        );
        assert_eq!(c.args, [0, 4096, 1 << 10, 0, 0, 0]);
        assert_eq!(c.flags, event_flags::HAS_RET);
        let c = &calls[1];
        assert_eq!(
            (c.ts_ns, c.ret_ts_ns, c.ret as i64, c.deref),
            (600, 600, -1, 0)
        );
        assert_eq!(c.args, [0xbeef, 0, 0, 0, 0, 0]);
        let c = &calls[2];
        assert_eq!(c.probe, 9);
        assert_eq!(c.flags, event_flags::HAS_RET | event_flags::DEREF_FAULT);
        assert_eq!(
            (c.ts_ns, c.ret_ts_ns, c.ret, c.deref),
            (700, 750, 0x1_0000_0000, 0)
        );
        assert_eq!(c.args, [11, 0, 0, 0, 0, 66]);

        // A call cut short by the end of the record ends the walk; the whole ones stay.
        let cut = batch(&words[..words.len() - 1]);
        assert_eq!(batch_calls(&cut).unwrap().count(), 2);
        // A word count beyond the bytes sent reads only what is there.
        let mut short = batch(&words);
        short[4..8].copy_from_slice(&400u32.to_ne_bytes());
        assert_eq!(batch_calls(&short).unwrap().count(), 3);
        // Not a batch: a call record, and a runt.
        let mut call = vec![0u8; RAW_HEADER];
        call[0..2].copy_from_slice(&kind::CALL.to_ne_bytes());
        assert!(batch_calls(&call).is_none());
        assert!(batch_calls(&batch(&words)[..4]).is_none());
    }

    #[test]
    fn batched_calls_keep_every_argument_decode_reads() {
        use crate::trace::probes::PROBES;
        let mut narrowed = 0;
        for def in PROBES
            .iter()
            .filter(|d| d.spec.kept_args != probe_common::ALL_ARGS)
        {
            narrowed += 1;
            let mut full = call_raw(def.id);
            full.args = [0x11, 0x22, 0x33, 0x44, 0x55, 0x66];
            full.ret = 5;
            full.deref = 0x7000;
            let mut kept = full;
            for (i, a) in kept.args.iter_mut().enumerate() {
                if def.spec.kept_args & 1 << i == 0 {
                    *a = 0;
                }
            }
            assert_eq!(
                decode(&kept),
                decode(&full),
                "{} needs an argument it drops",
                def.symbol
            );
        }
        // halMemAlloc, halMemFree, halMemRelease, aclInit, aclFinalize, aclrtSetDevice.
        assert_eq!(narrowed, 6);
    }

    #[test]
    fn alloc_uses_return_time_and_out_pointer() {
        let mut r = call_raw(ProbeId::HalMemAlloc);
        r.args = [0x7000, 4096, 1 | (1 << 10), 0, 0, 0];
        r.deref = 0x12c0_0000_0000;
        let Some(Decoded::Call(c)) = decode(&r) else {
            panic!()
        };
        assert_eq!(c.ts_mono, 200);
        assert_eq!(
            c.call,
            Call::HalAlloc {
                size: 4096,
                flag: 1 | (1 << 10),
                ret: 0,
                addr: Some(0x12c0_0000_0000)
            }
        );
        r.flags |= event_flags::DEREF_FAULT;
        let Some(Decoded::Call(c)) = decode(&r) else {
            panic!()
        };
        assert!(matches!(c.call, Call::HalAlloc { addr: None, .. }));
    }

    #[test]
    fn free_uses_entry_time_and_negative_codes_survive() {
        let mut r = call_raw(ProbeId::HalMemFree);
        r.args[0] = 0xabc;
        r.ret = (-1i64) as u64;
        let Some(Decoded::Call(c)) = decode(&r) else {
            panic!()
        };
        assert_eq!(c.ts_mono, 100);
        assert_eq!(
            c.call,
            Call::HalFree {
                addr: 0xabc,
                ret: -1
            }
        );
    }

    #[test]
    fn mark_text_and_short_records() {
        let mut r = call_raw(ProbeId::MstxMarkA);
        r.flags = 0;
        r.data[..5].copy_from_slice(b"hello");
        r.data_len = 5;
        let Some(Decoded::Call(c)) = decode(&r) else {
            panic!()
        };
        assert_eq!(
            c.call,
            Call::Mark {
                text: "hello".into()
            }
        );
        assert!(raw_from_bytes(&[0u8; 16]).is_none());
        let mut unknown = r;
        unknown.probe = 63;
        assert!(decode(&unknown).is_none());
        // A return-probe call that arrived without its return is not trusted.
        let mut half = call_raw(ProbeId::HalMemAlloc);
        half.flags = 0;
        assert!(decode(&half).is_none());
    }

    #[test]
    fn atb_strings_and_tensor_chunks() {
        let mut r = call_raw(ProbeId::AtbRunnerName);
        r.flags = 0;
        r.args[0] = 0x1000;
        r.args[1] = 0x2000;
        // 16 bytes of the runner (vtable, name pointer), then the name with its NUL.
        r.data[16..23].copy_from_slice(b"Linear\0");
        r.data_len = 23;
        let Some(Decoded::Call(c)) = decode(&r) else {
            panic!()
        };
        assert_eq!(
            c.call,
            Call::Atb {
                object: 0x1000,
                pack: 0x2000,
                event: AtbEvent::Name("Linear".into())
            }
        );
        assert_eq!(c.ts_mono, 100);
        r.flags = event_flags::DATA_FAULT;
        assert!(decode(&r).is_none());

        let mut chunk = call_raw(ProbeId::AtbOutAfter);
        chunk.kind = kind::CHUNK;
        chunk.args = [0x1000, 0x2000, 3, 2, 1, 0];
        let t = &mut chunk.data[..104];
        t[0..4].copy_from_slice(&1i32.to_ne_bytes());
        t[4..8].copy_from_slice(&29i32.to_ne_bytes());
        t[8..16].copy_from_slice(&2i64.to_ne_bytes());
        t[16..24].copy_from_slice(&8i64.to_ne_bytes());
        t[72..80].copy_from_slice(&2u64.to_ne_bytes());
        t[80..88].copy_from_slice(&0x12c0_0000_0100u64.to_ne_bytes());
        t[96..104].copy_from_slice(&64u64.to_ne_bytes());
        chunk.data_len = 104;
        let Some(Decoded::Call(c)) = decode(&chunk) else {
            panic!()
        };
        let tensor = AtbTensor {
            addr: 0x12c0_0000_0100,
            size: 64,
            dtype: 1,
            format: 29,
            shape: vec![2, 8],
        };
        assert_eq!(tensor.attr(), "dtype:1,format:29,shape:[2,8,]");
        assert_eq!(
            c.call,
            Call::Atb {
                object: 0x1000,
                pack: 0x2000,
                event: AtbEvent::Tensors {
                    output: true,
                    after: true,
                    tensors: vec![tensor],
                    first: 2
                }
            }
        );
        // After tensors are read at the return.
        assert_eq!(c.ts_mono, 200);
        assert!(c.at_return);
    }
}
