//! `memscope-bpf analyze --input=DUMP`: the HAL leak analysis, run on a saved dump (ours or
//! msMemScope's, CSV or db) instead of a live process.
//!
//! A HAL block is a `MALLOC` row with Event Type `HAL` (or `HOST` with `pinned:true`, pinned
//! host memory from `halMemAlloc`). A `FREE` row closes the live block of the same process at
//! the same address; when the FREE carries an `allocation_id`, only the block with that id (or
//! one without any id) matches. Rows are taken in timestamp order (msMemScope writes a block's
//! rows together when it is freed, not in time order). Whatever is still live at the end of
//! the dump is reported exactly like the online report: a summary on stderr and
//! `leaks_<ts>.csv` per device under `<out>/msmemscope_<pid>_<ts>_ascend/device_<d>/dump/`.
//! The mstx step of a block counts the `"step start"` ranges of its process before it.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::Result;

use super::reader::{self, DumpRow, Loc, parse_ptr};
use crate::{
    analysis::steps::{Gaps, LiveBlock, StepLeaks, outlives_its_step},
    events::hal::{DEVICE_CPU, PageType},
    events::pools::PoolKind,
    log,
    output::{
        DeviceKey, ProcessOutput,
        leaks::{self, LeakCause, ProcessLeaks},
    },
    settings::UNKNOWN_DEVICE_ID,
    state::{Block, BlockKind, ExitMemory, PoolSegments, PoolTotals},
};

/// What the analysis found in one dump.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Analysis {
    /// Rows read.
    pub rows: u64,
    /// HAL MALLOC rows.
    pub mallocs: u64,
    /// HAL FREE rows that closed a block.
    pub frees: u64,
    /// HAL FREE rows that matched no live block.
    pub unmatched_frees: u64,
    /// Driver blocks still live at the end, by process, in allocation order.
    pub leaks: BTreeMap<u32, Vec<Block>>,
    /// Each process's end, sorted as the online report sorts it: leaked tensors, driver
    /// blocks no pool owns, what the pools keep cached.
    pub memory: BTreeMap<u32, ExitMemory>,
}

enum Ev {
    Step,
    StepEnd,
    Malloc(Block),
    Free {
        addr: u64,
        allocation_id: Option<u64>,
    },
    PoolMalloc(Block, Option<PoolTotals>),
    PoolFree {
        pool: PoolKind,
        addr: u64,
        allocation_id: Option<u64>,
        totals: Option<PoolTotals>,
    },
}

/// The pool of a pool row: its Event Type, the workspace told apart by its owner label.
fn pool_of(row: &DumpRow) -> Option<PoolKind> {
    Some(match row.event_type.as_str() {
        "PTA"
            if row
                .attr("owner")
                .is_some_and(|o| o.starts_with("PTA_WORKSPACE")) =>
        {
            PoolKind::PtaWorkspace
        }
        "PTA" => PoolKind::PtaCaching,
        "PTA_WORKSPACE" => PoolKind::PtaWorkspace,
        "ATB" => PoolKind::Atb,
        "MINDSPORE" => PoolKind::MindSpore,
        _ => return None,
    })
}

/// The stacks of a row, as a block keeps them.
fn row_stacks(row: &DumpRow) -> (Option<Arc<str>>, Option<Arc<str>>) {
    let keep = |s: &str| (!s.trim().is_empty()).then(|| Arc::from(s));
    (keep(&row.c_stack), keep(&row.python_stack))
}

/// Driver memory rows: HAL (CUDA's runtime on a CUDA host), and pinned host memory (`HOST`
/// with `pinned:true`).
pub(crate) fn is_hal(row: &DumpRow) -> bool {
    matches!(row.event_type.as_str(), "HAL" | "CUDA")
        || (row.event_type == "HOST" && row.attr("pinned") == Some("true"))
}

/// A memory row's address: the Ptr column, else Attr `addr`; an input error when neither.
pub(crate) fn address(row: &DumpRow, loc: Loc, path: &Path) -> Result<u64> {
    if let Some(p) = row.ptr {
        return Ok(p);
    }
    match row.attr("addr").map(parse_ptr) {
        Some(Ok(Some(a))) => Ok(a),
        _ => Err(loc
            .error(
                path,
                format!(
                    "{} {} row without an address (Ptr is N/A and Attr has no addr)",
                    row.event, row.event_type
                ),
            )
            .into()),
    }
}

fn attr_u64(row: &DumpRow, key: &str, loc: Loc, path: &Path) -> Result<Option<u64>> {
    match row.attr(key) {
        None => Ok(None),
        Some(v) => v.trim().parse::<u64>().map(Some).map_err(|_| {
            loc.error(
                path,
                format!(
                    "Attr {key} '{}' is not a non-negative integer",
                    super::excerpt(v, 40)
                ),
            )
            .into()
        }),
    }
}

fn device_id(d: DeviceKey) -> u32 {
    match d {
        DeviceKey::Npu(n) => n,
        DeviceKey::Cpu => DEVICE_CPU,
        DeviceKey::NotApplicable => UNKNOWN_DEVICE_ID,
    }
}

/// Reads `path` and returns the HAL blocks never freed.
/// Replays the pool rows of a dump through the step analyses (leaks per step, gaps); returns
/// the report of each process that has something to report. Pool kinds come from the Event
/// Type, so the PTA workspace pool (also written `PTA`) counts as the caching pool here.
pub fn pool_reports(path: &Path) -> Result<BTreeMap<u32, String>> {
    #[derive(Default)]
    struct Proc {
        step: u32,
        in_step: bool,
        live: HashMap<(PoolKind, u64), LiveBlock>,
        leaks: StepLeaks,
        gaps: Gaps,
    }
    let mut rows = reader::read_rows(path)?;
    rows.sort_by_key(|r| (r.ts_ns, r.id));
    let mut procs: BTreeMap<u32, Proc> = BTreeMap::new();
    for row in rows {
        let p = procs.entry(row.pid).or_default();
        let pool = match row.event_type.as_str() {
            "PTA" => Some(PoolKind::PtaCaching),
            "ATB" => Some(PoolKind::Atb),
            "MINDSPORE" => Some(PoolKind::MindSpore),
            _ => None,
        };
        match (row.event.as_str(), pool) {
            ("MSTX", _) if row.event_type == "Range_start" && row.name == "step start" => {
                p.step += 1;
                p.in_step = true;
                p.gaps.on_step_start(p.step);
            }
            // Any range end inside a step closes it, as msMemScope's step tracker does.
            ("MSTX", _) if row.event_type == "Range_end" && p.in_step => {
                p.in_step = false;
                let live: Vec<LiveBlock> = p.live.values().copied().collect();
                p.leaks.on_step_end(p.step, &live);
                p.gaps.on_step_end(p.step);
            }
            ("MALLOC" | "FREE", Some(pool)) => {
                let Some(addr) = row
                    .ptr
                    .or_else(|| row.attr("addr").and_then(|a| parse_ptr(a).ok().flatten()))
                else {
                    continue;
                };
                let device = device_id(row.device);
                let size = row
                    .attr("size")
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                if row.event == "MALLOC" {
                    p.live.insert(
                        (pool, addr),
                        LiveBlock {
                            pool,
                            device,
                            addr,
                            size,
                            alloc_step: p.step,
                            kernel_index: 0,
                        },
                    );
                } else {
                    p.live.remove(&(pool, addr));
                }
                if let Some(used) = row.attr("used").and_then(|u| u.trim().parse::<u64>().ok()) {
                    p.gaps.on_update(pool, device, used);
                }
            }
            _ => {}
        }
    }
    Ok(procs
        .into_iter()
        .filter_map(|(pid, p)| {
            let mut r = p.leaks.report();
            r.push_str(&p.gaps.report());
            (!r.is_empty()).then_some((pid, r))
        })
        .collect())
}

pub fn find_leaks(path: &Path) -> Result<Analysis> {
    let mut evs: Vec<(u64, u64, u32, Ev)> = Vec::new();
    let mut a = Analysis::default();
    reader::for_each_row(path, |loc, row| {
        a.rows += 1;
        let ev = match row.event.as_str() {
            "MSTX" if row.event_type == "Range_start" && row.name == "step start" => Ev::Step,
            "MSTX" if row.event_type == "Range_end" => Ev::StepEnd,
            "MALLOC" | "FREE" if pool_of(&row).is_some() => {
                let pool = pool_of(&row).expect("checked");
                let addr = address(&row, loc, path)?;
                let allocation_id = attr_u64(&row, "allocation_id", loc, path)?;
                let totals = match (
                    attr_u64(&row, "used", loc, path),
                    attr_u64(&row, "total", loc, path),
                ) {
                    (Ok(Some(allocated)), Ok(Some(reserved))) => Some(PoolTotals {
                        pool: Some(pool),
                        device: device_id(row.device),
                        allocated,
                        reserved,
                    }),
                    _ => None,
                };
                if row.event == "FREE" {
                    Ev::PoolFree {
                        pool,
                        addr,
                        allocation_id,
                        totals,
                    }
                } else {
                    let (stack, py_stack) = row_stacks(&row);
                    Ev::PoolMalloc(
                        Block {
                            allocation_id: allocation_id.unwrap_or(0),
                            addr,
                            size: attr_u64(&row, "size", loc, path)?.unwrap_or(0),
                            device: device_id(row.device),
                            kind: BlockKind::Pool(pool),
                            tid: row.tid,
                            ts_ns: row.ts_ns,
                            step: 0,
                            module_id: u32::MAX,
                            page_type: PageType::Normal,
                            stack,
                            py_stack,
                            kernel_index: 0,
                            labels: None,
                        },
                        totals,
                    )
                }
            }
            "MALLOC" if is_hal(&row) => {
                let size = match row.attr("size") {
                    None => 0,
                    Some(s) => s.trim().parse::<i64>().map_err(|_| {
                        loc.error(
                            path,
                            format!("Attr size '{}' is not an integer", super::excerpt(s, 40)),
                        )
                    })?,
                };
                let kind = if row.event_type == "HOST" {
                    BlockKind::PinnedHost
                } else if row.attr("alloc_type") == Some("create") {
                    BlockKind::Handle
                } else {
                    BlockKind::Device
                };
                let module_id = row
                    .attr("MID")
                    .and_then(|m| m.trim().parse::<u32>().ok())
                    .unwrap_or(u32::MAX);
                let page_type = match row.attr("page_type") {
                    Some("huge") => PageType::Huge,
                    Some("giant") => PageType::Giant,
                    _ => PageType::Normal,
                };
                let (stack, py_stack) = row_stacks(&row);
                Ev::Malloc(Block {
                    allocation_id: attr_u64(&row, "allocation_id", loc, path)?.unwrap_or(0),
                    addr: address(&row, loc, path)?,
                    size: size.unsigned_abs(),
                    device: device_id(row.device),
                    kind,
                    tid: row.tid,
                    ts_ns: row.ts_ns,
                    step: 0,
                    module_id,
                    page_type,
                    stack,
                    py_stack,
                    kernel_index: 0,
                    labels: None,
                })
            }
            "FREE" if is_hal(&row) => Ev::Free {
                addr: address(&row, loc, path)?,
                allocation_id: attr_u64(&row, "allocation_id", loc, path)?,
            },
            _ => return Ok(()),
        };
        evs.push((row.ts_ns, a.rows, row.pid, ev));
        Ok(())
    })?;
    evs.sort_by_key(|(ts, order, _, _)| (*ts, *order));

    #[derive(Default)]
    struct Proc {
        step: u32,
        in_step: bool,
        live: HashMap<u64, Vec<Block>>,
        pool_live: HashMap<(PoolKind, u64), Vec<Block>>,
        segments: PoolSegments,
        totals: Vec<PoolTotals>,
        /// Pool blocks that outlived their step (by allocation order), with the last step end.
        outlived: BTreeMap<(u64, u64, u64), (Block, u32)>,
    }
    /// Removes the block a FREE names: the one with its allocation id (or one without any).
    fn take(blocks: &mut Vec<Block>, allocation_id: Option<u64>) -> Option<Block> {
        let pos = match allocation_id {
            Some(id) => blocks
                .iter()
                .rposition(|b| b.allocation_id == id || b.allocation_id == 0),
            None => blocks.len().checked_sub(1),
        }?;
        Some(blocks.remove(pos))
    }
    fn note_totals(totals: &mut Vec<PoolTotals>, t: Option<PoolTotals>) {
        if let Some(t) = t {
            PoolTotals::record(totals, t);
        }
    }
    let mut procs: BTreeMap<u32, Proc> = BTreeMap::new();
    for (_, _, pid, ev) in evs {
        let p = procs.entry(pid).or_default();
        match ev {
            Ev::Step => {
                p.step += 1;
                p.in_step = true;
            }
            // Any range end inside a step closes it, as msMemScope's step tracker does.
            Ev::StepEnd => {
                if !p.in_step {
                    continue;
                }
                p.in_step = false;
                for b in p.pool_live.values().flatten() {
                    if let BlockKind::Pool(pool) = b.kind
                        && outlives_its_step(pool, b.step, p.step)
                    {
                        p.outlived
                            .entry((b.allocation_id, b.ts_ns, b.addr))
                            .or_insert_with(|| (b.clone(), p.step))
                            .1 = p.step;
                    }
                }
            }
            Ev::Malloc(mut b) => {
                a.mallocs += 1;
                b.step = p.step;
                p.live.entry(b.addr).or_default().push(b);
            }
            Ev::Free {
                addr,
                allocation_id,
            } => match p.live.get_mut(&addr).and_then(|v| take(v, allocation_id)) {
                Some(_) => {
                    a.frees += 1;
                    p.segments.forget(addr);
                }
                None => a.unmatched_frees += 1,
            },
            Ev::PoolMalloc(mut b, totals) => {
                b.step = p.step;
                note_totals(&mut p.totals, totals);
                let BlockKind::Pool(pool) = b.kind else {
                    continue;
                };
                let live = &p.live;
                let addr = b.addr;
                p.segments.note(pool, addr, || {
                    live.values()
                        .flatten()
                        .find(|d| {
                            d.kind == BlockKind::Device && d.addr <= addr && addr < d.addr + d.size
                        })
                        .map(|d| (d.addr, d.size))
                });
                p.pool_live.entry((pool, addr)).or_default().push(b);
            }
            Ev::PoolFree {
                pool,
                addr,
                allocation_id,
                totals,
            } => {
                note_totals(&mut p.totals, totals);
                if let Some(v) = p.pool_live.get_mut(&(pool, addr)) {
                    take(v, allocation_id);
                }
            }
        }
    }
    for (pid, p) in procs {
        let order = |b: &Block| (b.allocation_id, b.ts_ns, b.addr);
        let mut driver: Vec<Block> = p.live.into_values().flatten().collect();
        driver.sort_by_key(order);
        let mut pool: Vec<Block> = p.pool_live.into_values().flatten().collect();
        pool.sort_by_key(order);
        if !driver.is_empty() {
            a.leaks.insert(pid, driver.clone());
        }
        let memory = ExitMemory::classify(
            driver,
            &p.segments,
            pool,
            &p.totals,
            p.outlived.into_values(),
        );
        if !memory.is_empty() {
            a.memory.insert(pid, memory);
        }
    }
    Ok(a)
}

/// `analyze`: runs the analysis, writes the leak files, prints the summary on stderr.
/// Returns the files written.
pub fn run(opts: &super::OfflineSettings, input: &Path) -> Result<Vec<PathBuf>> {
    let a = find_leaks(input)?;
    log::info(&format!(
        "{}: {} row(s); {} HAL allocation(s), {} free(s){}",
        input.display(),
        a.rows,
        a.mallocs,
        a.frees,
        if a.unmatched_frees > 0 {
            format!(
                ", {} free(s) without a matching allocation in the dump",
                a.unmatched_frees
            )
        } else {
            String::new()
        }
    ));
    if a.mallocs == 0 {
        log::warn("the dump has no HAL MALLOC rows: nothing to analyze");
    }
    let config = opts.config_json.clone();
    let mut pool_reports = pool_reports(input)?;
    let mut report = Vec::new();
    let mut written = Vec::new();
    for (pid, memory) in a.memory {
        let mut files = Vec::new();
        if !(memory.tensor_leaks.is_empty() && memory.driver_leaks.is_empty()) {
            let mut out = ProcessOutput::new(&opts.output_dir, pid, config.clone());
            // The end of the dump stands for the end of the process.
            files = leaks::write_leak_files(&mut out, pid, &memory, LeakCause::Exited)?;
            written.extend(files.iter().cloned());
        }
        report.push(ProcessLeaks {
            pid,
            cause: LeakCause::Exited,
            memory,
            files,
            pool_report: pool_reports.remove(&pid).unwrap_or_default(),
        });
    }
    for line in leaks::format_report(&report, 20).lines() {
        log::info(line);
    }
    // Inefficient memory, decompose and OOM rows, replayed from the same dump.
    let replayed = super::analyses::replay(input)?;
    super::analyses::report(&replayed, &opts.output_dir)?;
    // Processes with pool findings but no HAL leak.
    let pool_lines = report
        .iter()
        .map(|p| (p.pid, p.pool_report.clone()))
        .chain(pool_reports);
    for (pid, text) in pool_lines.filter(|(_, t)| !t.is_empty()) {
        log::info(&format!("pid {pid}: framework memory pools"));
        for line in text.lines() {
            log::info(line);
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn analyze_text(name: &str, text: &str) -> Analysis {
        let dir =
            std::env::temp_dir().join(format!("memscope-analyze-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("d.csv");
        std::fs::write(&p, text).unwrap();
        let a = find_leaks(&p).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        a
    }

    const H: &str = crate::output::csv::CSV_HEADER;

    #[test]
    fn matches_by_address_and_allocation_id() {
        let a = analyze_text(
            "ids",
            &format!(
                "{H}\n\
                 0,MSTX,Range_start,\"step start\",1,7,7,0,N/A,,,\n\
                 1,MALLOC,HAL,N/A,10,7,8,0,0x0000000000001000,\"{{allocation_id:1,addr:0x0000000000001000,size:4096,used:4096,page_type:huge,alloc_type:alloc}}\",,\n\
                 2,FREE,HAL,N/A,20,7,8,0,0x0000000000001000,\"{{allocation_id:1,addr:0x0000000000001000,size:4096,used:0}}\",,\n\
                 3,MALLOC,HAL,N/A,30,7,8,0,0x0000000000001000,\"{{allocation_id:2,addr:0x0000000000001000,size:100,used:100,page_type:normal,alloc_type:alloc}}\",,\n\
                 4,MALLOC,HAL,N/A,31,7,9,1,0x0000000000002000,\"{{allocation_id:3,addr:0x0000000000002000,size:5,used:5,page_type:normal,alloc_type:create}}\",,\n\
                 5,FREE,HAL,N/A,40,7,8,0,0x0000000000001000,\"{{allocation_id:9,addr:0x0000000000001000,size:100,used:0}}\",,\n\
                 6,MALLOC,PTA,N/A,41,7,8,0,0x0000000000003000,\"{{allocation_id:4,addr:0x0000000000003000,size:1,used:1,total:1}}\",,\n\
                 7,MALLOC,HOST,N/A,42,7,8,cpu,0x0000000000004000,\"{{allocation_id:5,addr:0x0000000000004000,size:64,pinned:true,used:64}}\",,\n\
                 8,MALLOC,HOST,N/A,43,7,8,cpu,0x0000000000005000,\"{{allocation_id:6,addr:0x0000000000005000,size:64,total:64}}\",,\n"
            ),
        );
        assert_eq!(a.rows, 9);
        assert_eq!(a.mallocs, 4);
        assert_eq!(a.frees, 1);
        assert_eq!(a.unmatched_frees, 1, "allocation_id 9 matches nothing");
        let b = &a.leaks[&7];
        assert_eq!(
            b.iter().map(|b| b.allocation_id).collect::<Vec<_>>(),
            [2, 3, 5]
        );
        assert_eq!(b[0].size, 100);
        assert_eq!(b[0].step, 1);
        assert_eq!(b[0].kind, BlockKind::Device);
        assert_eq!(b[1].kind, BlockKind::Handle);
        assert_eq!(b[1].device, 1);
        assert_eq!(b[1].tid, 9);
        assert_eq!(b[2].kind, BlockKind::PinnedHost);
        assert_eq!(b[2].device, DEVICE_CPU);
    }

    #[test]
    fn old_layout_out_of_order_rows() {
        // msMemScope writes a block's rows when it is freed, so a FREE may come before the
        // MALLOC of an earlier block at the same address; sizes of FREEs were negative.
        let a = analyze_text(
            "old",
            &format!(
                "{H}\n\
                 1,SYSTEM,acl init,N/A,1,5,5,N/A,N/A,,,\n\
                 4,MALLOC,HAL,N/A,40,5,5,0,4096,\"{{addr:4096,size:10,owner:,MID:7}}\",,\n\
                 5,FREE,HAL,N/A,50,5,5,0,4096,\"{{addr:4096,size:-10,owner:,MID:7}}\",,\n\
                 2,MALLOC,HAL,N/A,20,5,5,0,4096,\"{{addr:4096,size:30,owner:,MID:33}}\",,\n\
                 3,FREE,HAL,N/A,30,5,5,0,4096,\"{{addr:4096,size:-30,owner:,MID:33}}\",,\n\
                 6,MALLOC,HAL,N/A,60,5,5,host,8192,\"{{addr:8192,size:20,owner:,MID:255}}\",,\n"
            ),
        );
        assert_eq!((a.mallocs, a.frees, a.unmatched_frees), (3, 2, 0));
        let b = &a.leaks[&5];
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].addr, b[0].size, b[0].device), (8192, 20, DEVICE_CPU));
        assert_eq!(b[0].module_id, 255);
        assert_eq!(b[0].allocation_id, 0);
    }
}
