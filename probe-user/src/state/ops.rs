//! Operators: ATen marks and ATB calls, their accesses to pool blocks, and what they feed to
//! the inefficient-memory analysis.

use super::{DeviceKey, ProcessState, Row, TrackOptions};
use crate::analysis::inefficient;
use crate::analysis::inefficient::MemEvent;
use crate::events::atb::AtbOut;
use crate::events::labels;
use crate::events::pools::PoolKind;

impl ProcessState {
    /// The ATen operator protocol of msMemScope's Python collector (spec §1.7): begin and end
    /// marks become OP_LAUNCH rows, access marks ACCESS rows on the PTA block they touch.
    pub(super) fn aten_mark(
        &mut self,
        text: &str,
        tid: u32,
        ts_ns: u64,
        opts: &TrackOptions,
        rows: &mut Vec<Row>,
    ) {
        let rest = &text["memscope-aten-".len()..];
        let field = |body: &str, key: &str| -> Option<String> {
            body.split(';')
                .find_map(|kv| {
                    kv.trim()
                        .strip_prefix(key)
                        .and_then(|v| v.strip_prefix('='))
                })
                .map(|v| v.trim_end_matches('}').to_string())
        };
        let pid = self.pid;
        let op_row = move |event_type: &'static str, name: String, device: DeviceKey| Row {
            event: "OP_LAUNCH",
            event_type,
            name: name.into(),
            ts_ns,
            pid,
            tid,
            device,
            ptr: None,
            size: None,
            attr: String::new(),
            c_stack: None,
            py_stack: None,
        };
        if let Some(body) = rest.strip_prefix("b:") {
            let name = field(body, "name").unwrap_or_default();
            self.stats.ops += 1;
            if opts.inefficient {
                self.inefficient.op_start();
            }
            self.current_op = Some(name.clone());
            if opts.write_op_launch
                && let Some(device) = self.mstx_device(tid, opts)
            {
                rows.push(op_row("ATEN_START", name, device));
            }
        } else if let Some(body) = rest.strip_prefix("e:") {
            let name = field(body, "name").unwrap_or_default();
            if opts.inefficient {
                self.inefficient.op_end();
            }
            self.current_op = None;
            if opts.write_op_launch
                && let Some(device) = self.mstx_device(tid, opts)
            {
                rows.push(op_row("ATEN_END", name, device));
            }
        } else if let Some(body) = rest.strip_prefix("ac:") {
            let Some(ptr) = field(body, "ptr")
                .and_then(|p| parse_int(&p))
                .filter(|p| *p != 0)
            else {
                return;
            };
            let flag = |k| field(body, k).as_deref() == Some("True");
            let kind = match (flag("is_write"), flag("is_read")) {
                (false, false) => "UNKNOWN",
                (true, _) => "WRITE",
                _ => "READ",
            };
            let name = field(body, "name")
                .or_else(|| self.current_op.clone())
                .unwrap_or_default();
            let tensor_size = field(body, "tensor_size")
                .and_then(|s| parse_int(&s))
                .unwrap_or(1);
            self.stats.accesses += 1;
            // The live PTA block that contains the accessed range.
            let block = self
                .pta_by_addr
                .range(..=ptr)
                .next_back()
                .and_then(|(_, key)| self.pool_blocks.get(&(PoolKind::PtaCaching, *key)))
                .filter(|b| ptr + tensor_size.max(1) <= b.addr + b.size)
                .cloned();
            let Some(block) = block else {
                self.stats.unmatched_accesses += 1;
                return;
            };
            if opts.inefficient {
                self.inefficient
                    .event(block.allocation_id, MemEvent::Access);
            }
            self.relabel(
                (PoolKind::PtaCaching, block.addr),
                labels::DETAIL_2,
                "ops",
                true,
                opts,
            );
            let device = match field(body, "device")
                .and_then(|d| d.strip_prefix("npu:").and_then(|n| n.parse().ok()))
            {
                Some(d) => DeviceKey::Npu(d),
                None => DeviceKey::from_id(block.device),
            };
            if !opts.dump.access || !self.wants_device(opts, block.device) {
                return;
            }
            let mut attr = format!(
                "allocation_id:{},addr:0x{:016x},size:{},type:PTA",
                block.allocation_id, block.addr, block.size
            );
            for key in ["dtype", "shape"] {
                if let Some(v) = field(body, key) {
                    attr.push_str(&format!(",{key}:{v}"));
                }
            }
            rows.push(Row {
                event: "ACCESS",
                event_type: kind,
                name: name.into(),
                ts_ns,
                pid: self.pid,
                tid,
                device,
                ptr: Some(ptr),
                size: None,
                attr,
                c_stack: None,
                py_stack: None,
            });
        }
    }
}

impl ProcessState {
    /// Rows for assembled ATB events: OP_LAUNCH ATB_START/ATB_END (`--level` op), KERNEL_LAUNCH
    /// KERNEL_START/KERNEL_END (`--level` kernel) and ACCESS rows on the ATB pool block that
    /// holds each tensor (spec §1.8, §3.2).
    pub(super) fn atb_rows(
        &mut self,
        outs: Vec<AtbOut>,
        tid: u32,
        opts: &TrackOptions,
        rows: &mut Vec<Row>,
    ) {
        let pid = self.pid;
        let row = |event, event_type, name: String, ts_ns, device, attr| Row {
            event,
            event_type,
            name: name.into(),
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
        for o in outs {
            let start = matches!(o, AtbOut::OpStart { .. });
            match o {
                AtbOut::OpStart {
                    name,
                    path,
                    workspace,
                    workspace_size,
                    ts_ns,
                }
                | AtbOut::OpEnd {
                    name,
                    path,
                    workspace,
                    workspace_size,
                    ts_ns,
                } => {
                    if start {
                        self.stats.ops += 1;
                    }
                    if opts.inefficient {
                        if start {
                            self.inefficient_atb.op_start();
                        } else {
                            self.inefficient_atb.op_end();
                        }
                    }
                    if opts.write_op_launch
                        && let Some(device) = self.mstx_device(tid, opts)
                    {
                        let attr = format!(
                            "path:{path},workspace_ptr:0x{workspace:x},workspace_size:{workspace_size}"
                        );
                        let ty = if start { "ATB_START" } else { "ATB_END" };
                        rows.push(row("OP_LAUNCH", ty, name, ts_ns, device, attr));
                    }
                }
                AtbOut::Kernel {
                    name,
                    path,
                    end,
                    ts_ns,
                } => {
                    if !end {
                        self.stats.atb_kernels += 1;
                    }
                    if opts.write_kernel_launch
                        && let Some(device) = self.mstx_device(tid, opts)
                    {
                        let ty = if end { "KERNEL_END" } else { "KERNEL_START" };
                        let attr = format!("path:{path}");
                        rows.push(row("KERNEL_LAUNCH", ty, name, ts_ns, device, attr));
                    }
                }
                AtbOut::Access {
                    owner,
                    tensor,
                    write,
                    ts_ns,
                } => {
                    self.stats.accesses += 1;
                    let ptr = tensor.addr;
                    let block = self
                        .atb_by_addr
                        .range(..=ptr)
                        .next_back()
                        .and_then(|(_, key)| self.pool_blocks.get(&(PoolKind::Atb, *key)))
                        .filter(|b| ptr.saturating_add(tensor.size.max(1)) <= b.addr + b.size);
                    let Some(block) = block else {
                        self.stats.unmatched_accesses += 1;
                        continue;
                    };
                    if opts.inefficient {
                        self.inefficient_atb
                            .event(block.allocation_id, MemEvent::Access);
                    }
                    if !opts.dump.access || !self.wants_device(opts, block.device) {
                        continue;
                    }
                    let attr = format!(
                        "allocation_id:{},addr:0x{:016x},size:{},type:ATB,{}",
                        block.allocation_id,
                        block.addr,
                        block.size,
                        tensor.attr()
                    );
                    let ty = if write { "WRITE" } else { "UNKNOWN" };
                    let mut r = row(
                        "ACCESS",
                        ty,
                        owner,
                        ts_ns,
                        DeviceKey::from_id(block.device),
                        attr,
                    );
                    r.ptr = Some(ptr);
                    rows.push(r);
                }
            }
        }
    }

    /// End of the process: ATB operators that never returned still get their rows.
    pub fn finish_atb(&mut self, opts: &TrackOptions) -> Vec<Row> {
        let mut rows = Vec::new();
        for (tid, outs) in self.atb.finish() {
            self.atb_rows(outs, tid, opts, &mut rows);
        }
        rows
    }

    /// Blocks the inefficient analysis flagged: (allocation id, addr, size, types).
    pub fn inefficient_blocks(&self) -> Vec<(u64, String)> {
        let mut v: Vec<(u64, String)> = self
            .inefficient
            .flagged()
            .chain(self.inefficient_atb.flagged())
            .map(|(id, f)| (id, inefficient::attr_value(f)))
            .collect();
        v.sort();
        v
    }
}

/// Decimal (as Python prints an int) or `0x` hex.
pub(super) fn parse_int(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}
