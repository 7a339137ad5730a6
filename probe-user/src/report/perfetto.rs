//! Chrome trace-event JSON (what ui.perfetto.dev and chrome://tracing open): counter tracks of
//! the memory of every device, per owner and in total; operator and kernel slices per thread;
//! mstx ranges as async slices; instant events for the blocks that leaked and for failed
//! allocations (OOM).
//!
//! Timestamps are microseconds after the run's first event (`otherData.t0_ns` is that event's
//! wall-clock time): absolute epoch microseconds with nanosecond fractions would not fit the
//! precision of a JSON number. Counters are written at every change, not downsampled, so the
//! counter at the peak is the peak.

use std::{collections::HashMap, io::Write};

use serde_json::{Value, json};

use super::model::{Kind, Model, Stacks, TrackKey, device_label};

fn us(model: &Model, ts: u64) -> f64 {
    (ts - model.t0) as f64 / 1000.0
}

/// Name of the counter track of a device.
pub fn counter_name(key: &TrackKey) -> String {
    format!("memory device {}", key.device_label())
}

pub const DRIVER_TOTAL: &str = "driver total";
pub const POOL_TOTAL: &str = "pools total";

/// The trace as a JSON value.
/// Writes the trace to `w`, one event at a time (a long run's trace is never held in memory).
pub fn write_trace(model: &Model, w: impl Write) -> std::io::Result<()> {
    let mut out = Sink {
        w: std::io::BufWriter::with_capacity(1 << 20, w),
        first: true,
    };
    out.w.write_all(b"{\"traceEvents\":[\n")?;
    let mut pids: Vec<u32> = model.tracks.keys().map(|k| k.pid).collect();
    pids.extend(model.steps.keys());
    pids.sort();
    pids.dedup();
    for pid in &pids {
        out.push(
            json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
            "args": {"name": format!("pid {pid}")}}),
        )?;
    }

    // Counters: replay the memory events, one counter event per change.
    #[derive(Default)]
    struct Sums {
        owners: HashMap<u32, u64>,
        driver: u64,
        pool: u64,
    }
    let mut sums: HashMap<TrackKey, Sums> = HashMap::new();
    // (allocation id, size, owner, device) of the live blocks, by process, pool and address.
    type Live = Vec<(u64, u64, u32, crate::output::DeviceKey)>;
    let mut live: HashMap<(u32, u32, u64), Live> = HashMap::new();
    // Operators and kernels per thread, ranges per process (LIFO per thread).
    let mut open_ops: HashMap<(u32, u32), Vec<(u32, u64)>> = HashMap::new();
    let mut open_ranges: HashMap<(u32, u32), Vec<(u64, u32)>> = HashMap::new();
    let mut range_ids = 0u64;
    for e in &model.events {
        let ts = us(model, e.ts);
        match e.kind {
            Kind::Malloc | Kind::PoolMalloc | Kind::Free | Kind::PoolFree => {
                let driver = matches!(e.kind, Kind::Malloc | Kind::Free);
                let lkey = (e.pid, e.pool, e.addr);
                let (size, owner, device, sign) =
                    if matches!(e.kind, Kind::Malloc | Kind::PoolMalloc) {
                        live.entry(lkey)
                            .or_default()
                            .push((e.alloc_id, e.size, e.name, e.device));
                        (e.size, e.name, e.device, 1)
                    } else {
                        let Some(v) = live.get_mut(&lkey) else {
                            continue;
                        };
                        let pos = if e.alloc_id != 0 {
                            v.iter().rposition(|b| b.0 == e.alloc_id || b.0 == 0)
                        } else {
                            v.len().checked_sub(1)
                        };
                        let Some(pos) = pos else { continue };
                        let b = v.remove(pos);
                        if v.is_empty() {
                            live.remove(&lkey);
                        }
                        (b.1, b.2, b.3, -1)
                    };
                let key = TrackKey { pid: e.pid, device };
                let s = sums.entry(key).or_default();
                let o = s.owners.entry(owner).or_default();
                let total = if driver { &mut s.driver } else { &mut s.pool };
                if sign > 0 {
                    *o += size;
                    *total += size;
                } else {
                    *o = o.saturating_sub(size);
                    *total = total.saturating_sub(size);
                }
                let mut args = serde_json::Map::new();
                args.insert(model.name(owner).to_owned(), json!(*o));
                args.insert(
                    (if driver { DRIVER_TOTAL } else { POOL_TOTAL }).to_owned(),
                    json!(if driver { s.driver } else { s.pool }),
                );
                out.push(json!({"ph": "C", "name": counter_name(&key), "pid": e.pid,
                    "tid": 0, "ts": ts, "args": args}))?;
            }
            Kind::OpStart | Kind::KernelStart => {
                open_ops
                    .entry((e.pid, e.tid))
                    .or_default()
                    .push((e.name, e.ts));
            }
            Kind::OpEnd | Kind::KernelEnd => {
                let stack = open_ops.entry((e.pid, e.tid)).or_default();
                // The matching start: the newest of the same name (an end without a start is
                // dropped).
                if let Some(pos) = stack.iter().rposition(|(n, _)| *n == e.name) {
                    let (name, start) = stack.remove(pos);
                    let cat = if e.kind == Kind::OpEnd {
                        "operator"
                    } else {
                        "kernel"
                    };
                    out.push(json!({"ph": "X", "cat": cat, "name": model.name(name),
                        "pid": e.pid, "tid": e.tid, "ts": us(model, start),
                        "dur": (e.ts - start) as f64 / 1000.0}))?;
                }
            }
            Kind::KernelLaunch => {
                out.push(json!({"ph": "i", "s": "t", "cat": "kernel launch",
                    "name": model.name(e.name), "pid": e.pid, "tid": e.tid, "ts": ts}))?;
            }
            Kind::RangeStart | Kind::Step => {
                range_ids += 1;
                open_ranges
                    .entry((e.pid, e.tid))
                    .or_default()
                    .push((range_ids, e.name));
                out.push(json!({"ph": "b", "cat": "mstx", "name": model.name(e.name),
                    "id": range_ids, "pid": e.pid, "tid": e.tid, "ts": ts}))?;
            }
            Kind::RangeEnd => {
                if let Some((id, name)) = open_ranges.entry((e.pid, e.tid)).or_default().pop() {
                    out.push(
                        json!({"ph": "e", "cat": "mstx", "id": id, "name": model.name(name),
                        "pid": e.pid, "tid": e.tid, "ts": ts}),
                    )?;
                }
            }
            Kind::Mark => {
                out.push(json!({"ph": "i", "s": "t", "cat": "mstx",
                    "name": model.name(e.name), "pid": e.pid, "tid": e.tid, "ts": ts}))?;
            }
            Kind::Oom => {
                out.push(json!({"ph": "i", "s": "p", "cat": "oom",
                    "name": format!("OOM: {} of {} bytes failed", model.name(e.name), e.size),
                    "pid": e.pid, "tid": e.tid, "ts": ts,
                    "args": {"device": device_label(e.device), "request": e.size}}))?;
            }
        }
    }
    // Ranges still open at the end are closed there, so the slices show.
    let end = us(model, model.t1);
    let mut still_open: Vec<_> = open_ranges.into_iter().collect();
    still_open.sort();
    for ((pid, tid), ids) in still_open {
        for (id, name) in ids {
            out.push(
                json!({"ph": "e", "cat": "mstx", "id": id, "name": model.name(name),
                "pid": pid, "tid": tid, "ts": end}),
            )?;
        }
    }
    for (key, blocks) in &model.leaks {
        for b in blocks {
            out.push(json!({"ph": "i", "s": "p", "cat": "leak",
                "name": format!("leak: {} bytes at {:#x}", b.size, b.addr),
                "pid": key.pid, "tid": b.tid, "ts": us(model, b.ts),
                "args": {"device": key.device_label(), "size": b.size,
                    "addr": format!("{:#018x}", b.addr), "allocation_id": b.alloc_id,
                    "owner": model.name(b.owner), "step": b.step,
                    "stack": model.stack(b.stack).text(), "site": model.stack(b.stack).site()}}))?;
        }
    }
    // Leaked tensors, named by the line that made them.
    for (pid, exit) in &model.exit {
        for t in &exit.tensor_leaks {
            let b = &t.block;
            let stacks = Stacks::of_block(b);
            let site = stacks.site();
            out.push(json!({"ph": "i", "s": "p", "cat": "leak",
                "name": format!("leaked tensor: {} bytes from {site} (step {})", b.size, b.step),
                "pid": pid, "tid": b.tid, "ts": us(model, b.ts_ns),
                "args": {"device": b.device, "size": b.size, "pool": b.event_type(),
                    "addr": format!("{:#018x}", b.addr), "allocation_id": b.allocation_id,
                    "step": b.step, "outlived_to_step": t.outlived_to_step,
                    "live_at_end": t.live_at_end, "site": site, "stack": stacks.text()}}))?;
        }
    }
    let tail = json!({
        "displayTimeUnit": "ns",
        "otherData": {"producer": concat!("memscope-bpf ", env!("CARGO_PKG_VERSION")),
            "t0_ns": model.t0.to_string()},
    });
    let tail = serde_json::to_string(&tail)?;
    // `],` then the other members of the top-level object.
    write!(out.w, "\n],{}", &tail[1..])?;
    out.w.flush()
}

/// The trace as one JSON value (small runs, tests).
pub fn trace(model: &Model) -> Value {
    let mut v = Vec::new();
    write_trace(model, &mut v).expect("writing to memory");
    serde_json::from_slice(&v).expect("the trace is JSON")
}

struct Sink<W: Write> {
    w: std::io::BufWriter<W>,
    first: bool,
}

impl<W: Write> Sink<W> {
    fn push(&mut self, v: Value) -> std::io::Result<()> {
        if !self.first {
            self.w.write_all(b",\n")?;
        }
        self.first = false;
        serde_json::to_writer(&mut self.w, &v)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The operator rows of a traced torch_npu process (`ACLNN_START`/`ACLNN_END`, written by
    /// `state/calls.rs` from each op API call) become one `X` slice each on the calling thread,
    /// beside the ATen operators of the mstx protocol.
    #[test]
    fn op_api_rows_become_operator_slices() {
        let h = crate::output::csv::CSV_HEADER;
        let text = format!(
            "{h}\n\
             1,OP_LAUNCH,ACLNN_START,aclnnAdd,1000,7,9,0,N/A,\"{{workspace_addr:0x0,workspace_size:0}}\",,\n\
             2,OP_LAUNCH,ACLNN_END,aclnnAdd,3500,7,9,0,N/A,\"{{ret:0}}\",,\n\
             3,OP_LAUNCH,ACLNN_START,aclnnMul,4000,7,9,0,N/A,\"{{workspace_addr:0x0,workspace_size:0}}\",,\n\
             4,OP_LAUNCH,ACLNN_END,aclnnMul,4100,7,9,0,N/A,\"{{ret:0}}\",,\n\
             5,OP_LAUNCH,ATEN_START,aten::add,900,7,7,0,N/A,,,\n\
             6,OP_LAUNCH,ATEN_END,aten::add,3600,7,7,0,N/A,,,\n"
        );
        let dir = std::env::temp_dir().join(format!("memscope-perfetto-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("memscope_dump_1.csv"), text).unwrap();
        let model = super::super::model::load(&dir, 100).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let t = trace(&model);
        let slices: Vec<(String, u64, f64, f64)> = t["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X" && e["cat"] == "operator")
            .map(|e| {
                let name = e["name"].as_str().unwrap().to_owned();
                let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
                (name, e["tid"].as_u64().unwrap(), ts, dur)
            })
            .collect();
        // t0 is the first row (900 ns); microseconds after it.
        assert_eq!(
            slices,
            [
                ("aclnnAdd".to_owned(), 9, 0.1, 2.5),
                ("aten::add".to_owned(), 7, 0.0, 2.7),
                ("aclnnMul".to_owned(), 9, 3.1, 0.1),
            ]
        );
    }
}
