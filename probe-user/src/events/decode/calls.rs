//! Per-call records (`RawEvent` of one probe): the captured arguments, return value and
//! strings turned into a [`Call`], with strings the BPF side could not read read late.

use super::{AtbEvent, Call, CallEvent, range_desc, u64_at};
use crate::events::hal::DrvMemProp;
use crate::trace::probes::ProbeId;
use probe_common::{RawEvent, event_flags};

/// Strings the BPF side could not read and user space then read from `/proc/PID/mem`, and
/// ones it could not read either (left empty).
pub static STRINGS_READ_LATE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub static STRINGS_UNREAD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The NUL-terminated string at `addr` in process `pid` (at most
/// [`probe_common::DATA_LEN`] bytes, as the BPF side reads), read through `/proc/PID/mem` opened read
/// only; empty (and counted) when that fails too.
pub(super) fn deferred_string(pid: u32, addr: u64) -> String {
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

pub(super) fn decode_call(raw: &RawEvent) -> Option<CallEvent> {
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
        ProbeId::HalMemRelease | ProbeId::CuMemRelease => (
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
            match crate::trace::torch_npu::MemoryUsage::decode(layout, raw.data()) {
                Ok(usage) => (Call::PtaUsage(usage), raw.ts_ns),
                Err(why) => (Call::PtaNotUsage(why), raw.ts_ns),
            }
        }
        ProbeId::AclrtReserveMemAddress | ProbeId::CuMemAddressReserve => (
            Call::VmmReserve {
                addr: deref,
                size: raw.args[1],
                ret,
            },
            raw.ret_ts_ns,
        ),
        ProbeId::AclrtReleaseMemAddress | ProbeId::CuMemAddressFree => (
            Call::VmmRelease {
                addr: raw.args[0],
                ret,
            },
            raw.ts_ns,
        ),
        ProbeId::AclrtMapMem | ProbeId::CuMemMap => (
            Call::VmmMap {
                addr: raw.args[0],
                size: raw.args[1],
                handle: raw.args[3],
                ret,
            },
            raw.ret_ts_ns,
        ),
        ProbeId::AclrtUnmapMem | ProbeId::CuMemUnmap => (
            Call::VmmUnmap {
                addr: raw.args[0],
                ret,
            },
            raw.ts_ns,
        ),
        ProbeId::MsAllocTensorMem => (
            Call::MsPoolAlloc {
                pool: raw.args[0],
                size: raw.args[1],
                addr: if has_ret { raw.ret } else { 0 },
                pool_used: ms_pool_used(raw, has_ret),
                pool_reserved: ms_pool_reserved(raw, has_ret),
            },
            raw.ret_ts_ns,
        ),
        ProbeId::MsFreeTensorMem => {
            if raw.flags & event_flags::DATA_FAULT != 0 {
                return None;
            }
            (
                Call::MsPoolFree {
                    pool: raw.args[0],
                    addr: u64_at(raw.data(), 0)?,
                    // A C++ bool: only the low byte of the return register is set.
                    freed: has_ret && raw.ret & 0xff != 0,
                    pool_used: ms_pool_used(raw, has_ret),
                    pool_reserved: ms_pool_reserved(raw, has_ret),
                },
                raw.ts_ns,
            )
        }
        ProbeId::CudaMalloc
        | ProbeId::CudaMallocAsync
        | ProbeId::CudaMallocManaged
        | ProbeId::CudaMallocHost
        | ProbeId::CudaHostAlloc => (
            Call::CudaAlloc {
                api: id,
                size: raw.args[1],
                ret,
                addr: deref,
            },
            raw.ret_ts_ns,
        ),
        ProbeId::CudaFree | ProbeId::CudaFreeAsync | ProbeId::CudaFreeHost => (
            Call::CudaFree {
                api: id,
                addr: raw.args[0],
                ret,
            },
            raw.ts_ns,
        ),
        ProbeId::CuMemCreate => (
            Call::CudaCreate {
                size: raw.args[1],
                ret,
                handle: deref,
            },
            raw.ret_ts_ns,
        ),
        ProbeId::CudaSetDevice => (
            Call::SetDevice {
                device: raw.args[0] as i32,
                ret,
            },
            raw.ret_ts_ns,
        ),
        ProbeId::NvtxRangePushA => (Call::RangePush { text: text() }, raw.ts_ns),
        ProbeId::NvtxRangePop => (Call::RangePop, raw.ts_ns),
        ProbeId::C10ReportMemoryUsage => (
            Call::C10Usage(crate::events::cuda::C10Report::from_args(&raw.args)),
            raw.ts_ns,
        ),
        ProbeId::MsTaskPush => {
            if raw.flags & event_flags::DATA_FAULT != 0 {
                return None;
            }
            (
                Call::MsTaskPush {
                    task: u64_at(raw.data(), 0)?,
                },
                raw.ts_ns,
            )
        }
        ProbeId::MsTaskRun => (Call::MsTaskRun { task: raw.args[0] }, raw.ts_ns),
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

/// The string an `INDIRECT_STR` probe appended after the struct it copied, up to its NUL.
pub(super) fn indirect_string(raw: &RawEvent, id: ProbeId) -> Option<String> {
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

pub(super) fn id_wants_return(id: ProbeId) -> bool {
    crate::trace::probes::PROBES
        .iter()
        .find(|p| p.id == id)
        .is_some_and(|p| p.wants_return())
}

/// The used bytes a MindSpore pool probe read from the pool at its return (`READ_CHAIN`: the
/// cookie's upper bits, in `cpu`, say where; 0 when the tracer did not find the counter).
fn ms_pool_used(raw: &RawEvent, has_ret: bool) -> Option<u64> {
    (has_ret && raw.cpu != 0 && raw.flags & event_flags::DEREF_FAULT == 0).then_some(raw.deref)
}

/// The reserved bytes a MindSpore pool probe read from the pool at its return (`READ_CHAIN`'s
/// summed pair, when the cookie named one; `u64::MAX`: unreadable).
fn ms_pool_reserved(raw: &RawEvent, has_ret: bool) -> Option<u64> {
    let wanted = has_ret && probe_common::read_chain::sum(raw.cpu).is_some();
    let sum = raw.args[probe_common::CHAIN_SUM_ARG];
    (wanted && sum != u64::MAX).then_some(sum)
}
