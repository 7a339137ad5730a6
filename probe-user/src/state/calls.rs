//! What each probed call does to a process: the one dispatcher from a decoded call to state
//! changes and output rows.

use super::{
    BlockKind, DRV_ERROR_OUT_OF_MEMORY, DeviceKey, ProcessState, Row, TrackOptions, quote_text,
};
use crate::events::decode::{Call, CallEvent};
use crate::events::hal::{AllocFlag, MemType, PageType};
use crate::events::pools::{PoolKind, RegionChange};

impl ProcessState {
    pub(super) fn apply_call(
        &mut self,
        ev: &CallEvent,
        ts_ns: u64,
        opts: &TrackOptions,
    ) -> Vec<Row> {
        let mut rows = std::mem::take(&mut self.spare_rows);
        let row =
            |event: &'static str, event_type: &'static str, name: String, device: DeviceKey| Row {
                event,
                event_type,
                name: name.into(),
                ts_ns,
                pid: ev.pid,
                tid: ev.tid,
                device,
                ptr: None,
                size: None,
                attr: String::new(),
                c_stack: None,
                py_stack: None,
            };
        match &ev.call {
            Call::HalAlloc {
                size,
                flag,
                ret,
                addr,
            } => {
                let f = AllocFlag::decode(*flag);
                let device = f.reported_device();
                let Some(addr) = addr.filter(|_| *ret == 0) else {
                    self.stats.failed_allocs += 1;
                    if *ret == DRV_ERROR_OUT_OF_MEMORY
                        && let Some(k) = opts.oom_top_k
                    {
                        self.oom(
                            "halMemAlloc",
                            *size,
                            *flag,
                            device,
                            ev.tid,
                            ts_ns,
                            k,
                            &mut rows,
                        );
                    }
                    return rows;
                };
                if !self.wants_device(opts, device) {
                    self.stats.filtered += 1;
                    // Its free is filtered too, not reported as a free of an unknown address.
                    self.filtered_addrs.insert(addr);
                    return rows;
                }
                let kind = if f.mem_type == MemType::Host {
                    BlockKind::PinnedHost
                } else {
                    BlockKind::Device
                };
                self.stats.mallocs += 1;
                let block = self.new_block(
                    addr,
                    *size,
                    device,
                    kind,
                    ev.tid,
                    ts_ns,
                    f.module_id as u32,
                    f.page_type,
                );
                self.insert_block(block, false, opts, ts_ns, &mut rows);
            }
            Call::HalCreate {
                size,
                prop,
                ret,
                handle,
                flag,
            } => {
                let (device, module, page) = match prop {
                    Some(p) => (p.devid, p.module_id, PageType::from_prop(p.pg_type)),
                    None => (0, u32::MAX, PageType::Normal),
                };
                let Some(handle) = handle.filter(|_| *ret == 0) else {
                    self.stats.failed_allocs += 1;
                    if *ret == DRV_ERROR_OUT_OF_MEMORY
                        && let Some(k) = opts.oom_top_k
                    {
                        self.oom(
                            "halMemCreate",
                            *size,
                            *flag,
                            device,
                            ev.tid,
                            ts_ns,
                            k,
                            &mut rows,
                        );
                    }
                    return rows;
                };
                if !self.wants_device(opts, device) {
                    self.stats.filtered += 1;
                    self.filtered_addrs.insert(handle);
                    return rows;
                }
                self.stats.creates += 1;
                let block = self.new_block(
                    handle,
                    *size,
                    device,
                    BlockKind::Handle,
                    ev.tid,
                    ts_ns,
                    module,
                    page,
                );
                self.insert_block(block, true, opts, ts_ns, &mut rows);
            }
            Call::HalFree { addr, ret } => {
                if *ret != 0 {
                    self.stats.failed_frees += 1;
                    return rows;
                }
                match self.live.remove(addr) {
                    Some(block) => {
                        self.stats.frees += 1;
                        self.free_row(&block, ev.tid, ts_ns, opts, &mut rows);
                    }
                    None => self.note_unmatched(*addr, opts),
                }
            }
            Call::HalRelease { handle, ret } => {
                if *ret != 0 {
                    self.stats.failed_frees += 1;
                    return rows;
                }
                match self.live_handles.remove(handle) {
                    Some(block) => {
                        self.stats.releases += 1;
                        self.free_row(&block, ev.tid, ts_ns, opts, &mut rows);
                    }
                    None => self.note_unmatched(*handle, opts),
                }
            }
            Call::AclInit { .. } => {
                rows.push(row(
                    "SYSTEM",
                    "ACL_INIT",
                    "N/A".into(),
                    DeviceKey::NotApplicable,
                ));
            }
            Call::AclFinalize { .. } => {
                rows.push(row(
                    "SYSTEM",
                    "ACL_FINI",
                    "N/A".into(),
                    DeviceKey::NotApplicable,
                ));
            }
            Call::SetDevice { device, ret } => {
                if *ret == 0 && *device >= 0 {
                    self.thread_device.insert(ev.tid, *device as u32);
                }
            }
            Call::Mark { text } if text.starts_with("memscope-aten-") => {
                self.aten_mark(text, ev.tid, ts_ns, opts, &mut rows);
            }
            Call::Mark { text } if text.starts_with("memscope-label-") => {
                self.label_mark(text, ev.tid, opts);
            }
            // Marks for the NPU sanitizer are never MSTX rows (msMemScope routes them away).
            Call::Mark { text } if text.starts_with("sanitizer-op:") => {}
            Call::Mark { text } => {
                self.stats.marks += 1;
                if let Some(device) = self.mstx_device(ev.tid, opts) {
                    rows.push(row(
                        "MSTX",
                        "Mark",
                        quote_text(&guard_formula(text)),
                        device,
                    ));
                }
            }
            Call::RangeStart { text, id } => {
                self.stats.ranges += 1;
                // Steps advance even when `--device` keeps the row out of the output.
                if text == "step start" {
                    self.step += 1;
                    self.step_range = Some(*id);
                    if opts.step_analyses {
                        self.gaps.on_step_start(self.step);
                    }
                }
                if let Some(device) = self.mstx_device(ev.tid, opts) {
                    let name = quote_text(&guard_formula(text));
                    rows.push(row("MSTX", "Range_start", name, device));
                }
            }
            Call::RangeEnd { id } => {
                if let Some(device) = self.mstx_device(ev.tid, opts) {
                    let name = quote_text(&format!("Range end from id {id}"));
                    rows.push(row("MSTX", "Range_end", name, device));
                }
                if self.step_range == Some(*id) {
                    self.step_range = None;
                    if opts.step_analyses {
                        self.step_ended();
                    }
                    if opts.decompose {
                        self.decompose.on_step_end(self.step);
                    }
                }
            }
            Call::DomainCreate { name, handle } => self.pools.domain_created(name, *handle),
            Call::HeapRegister {
                domain,
                heap,
                range,
            } => {
                if let Some(range) = range {
                    self.pools.heap_registered(*domain, *heap, *range);
                }
            }
            Call::HeapUnregister { domain, heap } => self.pools.heap_unregistered(*domain, *heap),
            Call::RegionsRegister {
                domain, regions, ..
            } => {
                for change in self.pools.regions_registered(*domain, regions) {
                    self.pool_malloc(change, ev.tid, ts_ns, opts, &mut rows);
                }
            }
            Call::Exiting { .. } => {}
            Call::OpLaunch {
                op,
                workspace,
                workspace_size,
                ret,
                duration_ns,
            } => {
                self.stats.ops += 1;
                if opts.write_op_launch
                    && let Some(device) = self.mstx_device(ev.tid, opts)
                {
                    let name =
                        crate::trace::aclnn::name(*op).unwrap_or_else(|| format!("aclnn#{op}"));
                    let mut attr =
                        format!("workspace_addr:0x{workspace:x},workspace_size:{workspace_size}");
                    if let Some(id) = self.workspace_block(*workspace) {
                        attr.push_str(&format!(",workspace_allocation_id:{id}"));
                    }
                    if *workspace_size > 0
                        && let Some(range) = self.vmm_attr(*workspace)
                    {
                        attr.push(',');
                        attr.push_str(&range);
                    }
                    let (pid, tid) = (self.pid, ev.tid);
                    let op_row = |event_type, ts_ns, attr: String| Row {
                        event: "OP_LAUNCH",
                        event_type,
                        name: name.clone().into(),
                        ts_ns,
                        pid,
                        tid,
                        device,
                        ptr: None,
                        size: None,
                        attr,
                        c_stack: None,
                        py_stack: None,
                    };
                    rows.push(op_row("ACLNN_START", ts_ns, attr));
                    rows.push(op_row(
                        "ACLNN_END",
                        ts_ns.saturating_add(*duration_ns),
                        format!("ret:{ret}"),
                    ));
                }
            }
            Call::VmmReserve {
                addr: Some(addr),
                size,
                ret: 0,
            } => self.vmm_reserved(*addr, *size),
            Call::VmmRelease { addr, ret: 0 } => self.vmm_released(*addr),
            Call::VmmMap {
                addr,
                size,
                handle,
                ret: 0,
            } => self.vmm_mapped(*addr, *size, *handle),
            Call::VmmUnmap { addr, ret: 0 } => self.vmm_unmapped(*addr),
            Call::VmmReserve { .. }
            | Call::VmmRelease { .. }
            | Call::VmmMap { .. }
            | Call::VmmUnmap { .. } => {}
            // Followed before the call is applied (`tasks.rs`).
            Call::MsTaskPush { .. } | Call::MsTaskRun { .. } => {}
            Call::MsPoolAlloc {
                size,
                addr,
                pool_used,
                pool_reserved,
                ..
            } => {
                let device = self.pool_device(ev.tid);
                self.take_driver_before(device);
                self.take_pool_reserved(device, *pool_reserved);
                if let Some(mut change) = self.ms_pools.alloc(device, *addr, *size, *pool_used) {
                    change.reserved = self.driver_bytes(device);
                    self.pool_malloc(change, ev.tid, ts_ns, opts, &mut rows);
                }
            }
            Call::MsPoolFree {
                addr,
                freed,
                pool_used,
                pool_reserved,
                ..
            } => {
                let device = self.pool_device(ev.tid);
                self.take_driver_before(device);
                self.take_pool_reserved(device, *pool_reserved);
                if let Some(mut change) = self.ms_pools.free(device, *addr, *freed, *pool_used) {
                    change.reserved = self.driver_bytes(change.device);
                    self.pool_free(change, ev.tid, ts_ns, opts, &mut rows);
                }
            }
            Call::CudaAlloc {
                api,
                size,
                ret,
                addr,
            } => self.cuda_alloc(ev, (*api, *size, *ret, *addr), ts_ns, opts, &mut rows),
            Call::CudaFree { addr, ret, .. } => {
                self.cuda_free(ev, *addr, *ret, ts_ns, opts, &mut rows)
            }
            Call::CudaCreate { size, ret, handle } => {
                self.cuda_create(ev, (*size, *ret, *handle), ts_ns, opts, &mut rows)
            }
            Call::C10Usage(report) => self.c10_usage(ev, report, ts_ns, opts, &mut rows),
            Call::RangePush { .. } | Call::RangePop => {
                if let Some(range) = self.nvtx_as_mstx(ev) {
                    rows.extend(self.apply_call(&range, ts_ns, opts));
                }
            }
            Call::PtaNotUsage(why) => {
                if !std::mem::replace(&mut self.pta_refused, true) {
                    refuse_pta_reports(ev.pid, why);
                }
            }
            Call::PtaUsage(_) if self.pta_refused => {}
            Call::PtaUsage(u) => {
                use crate::trace::torch_npu::{Component, DataType};
                let change = RegionChange {
                    pool: match u.component {
                        Component::CachingAllocator => PoolKind::PtaCaching,
                        Component::WorkspaceAllocator => PoolKind::PtaWorkspace,
                    },
                    device: u.device_index.max(0) as u32,
                    addr: u.ptr,
                    size: u.size,
                    allocated: u.total_allocated.max(0) as u64,
                    reserved: u.total_reserved.max(0) as u64,
                };
                match u.data_type {
                    DataType::Malloc => self.pool_malloc(change, ev.tid, ts_ns, opts, &mut rows),
                    DataType::Free => self.pool_free(change, ev.tid, ts_ns, opts, &mut rows),
                    // The same block's FREE follows, with the totals after the whole free.
                    DataType::BlockFree => {}
                }
            }
            Call::KernelLaunch {
                api,
                kernel,
                tiling_key,
                stream,
                name,
                duration_ns,
            } => {
                if let Some(d) = duration_ns {
                    self.aclrt_launch_until
                        .insert(ev.tid, ts_ns.saturating_add(*d));
                } else if self
                    .aclrt_launch_until
                    .get(&ev.tid)
                    .is_some_and(|until| ts_ns <= *until)
                {
                    // The runtime launch inside an aclrt* launch on this thread.
                    self.stats.nested_launches += 1;
                    return rows;
                }
                self.kernel_index += 1;
                self.stats.launches += 1;
                let next = self.streams.len() as u32;
                let entry = self.streams.entry(*stream).or_insert((next, 0));
                let (stream_id, task_id) = (entry.0, entry.1);
                entry.1 += 1;
                if opts.write_kernel_launch
                    && let Some(device) = self.mstx_device(ev.tid, opts)
                {
                    let name = name
                        .clone()
                        .unwrap_or_else(|| kernel_label(*api, *kernel, *tiling_key));
                    let mut r = row("KERNEL_LAUNCH", "KERNEL_LAUNCH", name, device);
                    r.attr = format!("streamId:{stream_id},taskId:{task_id}");
                    rows.push(r);
                }
            }
            Call::Atb {
                object,
                pack,
                event,
            } => {
                let outs = self
                    .atb
                    .on_event(ev.tid, *object, *pack, event.clone(), ts_ns);
                self.atb_rows(outs, ev.tid, opts, &mut rows);
            }
            Call::RegionsUnregister { domain, refs, .. } => {
                let before = self.pools.unmatched;
                for change in self.pools.regions_unregistered(*domain, refs) {
                    self.pool_free(change, ev.tid, ts_ns, opts, &mut rows);
                }
                self.stats.pool_unmatched += self.pools.unmatched - before;
            }
        }
        rows
    }
}

/// A kernel without a name: its handle (and tiling key) or its stub address.
/// Says once per run that a process's torch_npu report function got something that is not a
/// `MemoryUsage`, so its PTA rows stop (HAL rows go on).
fn refuse_pta_reports(pid: u32, why: &str) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        crate::log::warn(&format!(
            "pid {pid}: what torch_npu's allocator report function received is not a \
             MemoryUsage ({why}): the function found in libtorch_npu.so is not the one expected, \
             so no PTA rows are read from it (HAL is still traced)"
        ));
    }
}

pub(super) fn kernel_label(
    api: crate::trace::probes::ProbeId,
    kernel: u64,
    tiling_key: Option<u64>,
) -> String {
    match (
        crate::trace::probes::launch_args(api).map(|a| a.kernel),
        tiling_key,
    ) {
        (Some(crate::trace::probes::KernelRef::Handle), Some(t)) => {
            format!("handle_0x{kernel:x}_tiling_{t}")
        }
        (Some(crate::trace::probes::KernelRef::Handle), None) => format!("handle_0x{kernel:x}"),
        _ => format!("0x{kernel:x}"),
    }
}

/// msMemScope blanks messages that a spreadsheet would run as a formula.
pub(super) fn guard_formula(text: &str) -> String {
    if text.starts_with(['=', '+', '-', '@']) {
        String::new()
    } else {
        text.to_string()
    }
}
