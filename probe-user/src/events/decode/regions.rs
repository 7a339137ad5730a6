//! mstx region chunks: the BPF side sends a framework pool's region list in chunks of
//! descriptors or references; each chunk becomes one call.

use super::calls::id_wants_return;
use super::{AtbEvent, AtbTensor, Call, CallEvent, RegionRef, range_desc, u32_at, u64_at};
use crate::trace::probes::ProbeId;
use probe_common::{RawEvent, event_flags};

pub(super) fn decode_chunk(raw: &RawEvent) -> Option<CallEvent> {
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
