//! Reading a run's dumps into compact events: each row classified (driver block, pool
//! region, step mark), interned and sorted by time.

use super::{Event, Kind, Model, Stacks};
use crate::offline::analyze::{address, is_hal};
use crate::offline::reader;
use crate::offline::reader::{DumpRow, Loc};
use anyhow::Result;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Builds a [`Model`] from rows (any number of files) or events.
#[derive(Default)]
pub struct Builder {
    events: Vec<Event>,
    names: Vec<String>,
    name_ids: HashMap<String, u32>,
    stacks: Vec<Stacks>,
    stack_ids: HashMap<Stacks, u32>,
    /// Rows read, per file.
    pub files: Vec<(PathBuf, u64)>,
    /// Marks copied into every device file of a process are seen once per file: keep the first.
    seen_marks: std::collections::HashSet<(u32, u64, u32, u32)>,
}

pub(super) fn is_pool(row: &DumpRow) -> bool {
    matches!(
        row.event_type.as_str(),
        "PTA" | "PTA_WORKSPACE" | "MINDSPORE" | "ATB"
    )
}

impl Builder {
    pub fn new() -> Self {
        let mut b = Builder::default();
        b.intern_stack("", "");
        b
    }

    pub fn intern(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.name_ids.get(s) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(s.to_owned());
        self.name_ids.insert(s.to_owned(), i);
        i
    }

    /// Interns a row's C and Python stacks as one pair.
    pub fn intern_stack(&mut self, c: &str, python: &str) -> u32 {
        let key = Stacks {
            c: c.to_owned(),
            python: python.to_owned(),
        };
        if let Some(&i) = self.stack_ids.get(&key) {
            return i;
        }
        let i = self.stacks.len() as u32;
        self.stacks.push(key.clone());
        self.stack_ids.insert(key, i);
        i
    }

    pub fn push(&mut self, ev: Event) {
        self.events.push(ev);
    }

    /// Reads one dump file (ours or msMemScope's, CSV or db).
    pub fn read_file(&mut self, path: &Path) -> Result<()> {
        let mut n = 0u64;
        reader::for_each_row(path, |loc, row| {
            n += 1;
            self.add_row(path, loc, &row)
        })?;
        self.files.push((path.to_path_buf(), n));
        Ok(())
    }

    /// Adds one row; rows that draw nothing are skipped.
    pub fn add_row(&mut self, path: &Path, loc: Loc, row: &DumpRow) -> Result<()> {
        let attr_u64 = |key: &str| -> Result<u64> {
            match row.attr(key) {
                None => Ok(0),
                Some(v) => v.trim().parse::<i64>().map(i64::unsigned_abs).map_err(|_| {
                    loc.error(
                        path,
                        format!(
                            "Attr {key} '{}' is not an integer",
                            crate::offline::excerpt(v, 40)
                        ),
                    )
                    .into()
                }),
            }
        };
        let mut ev = Event {
            ts: row.ts_ns,
            addr: 0,
            size: 0,
            alloc_id: 0,
            pid: row.pid,
            tid: row.tid,
            name: 0,
            stack: 0,
            pool: 0,
            device: row.device,
            kind: Kind::Mark,
        };
        match (row.event.as_str(), row.event_type.as_str()) {
            ("MALLOC" | "FREE", _) if is_hal(row) || is_pool(row) => {
                let malloc = row.event == "MALLOC";
                let hal = is_hal(row);
                ev.kind = match (hal, malloc) {
                    (true, true) => Kind::Malloc,
                    (true, false) => Kind::Free,
                    (false, true) => Kind::PoolMalloc,
                    (false, false) => Kind::PoolFree,
                };
                ev.addr = address(row, loc, path)?;
                ev.size = attr_u64("size")?;
                ev.alloc_id = attr_u64("allocation_id")?;
                if !hal {
                    // A PTA free must not close an ATB region at the same address.
                    ev.pool = self.intern(&row.event_type);
                }
                if malloc {
                    let owner = match row.attr("owner") {
                        Some(o) if !o.is_empty() => o.to_owned(),
                        _ if hal && row.event_type == "HOST" => "HOST(pinned)".to_owned(),
                        _ if hal => match row.attr("MID") {
                            Some(m) => format!("CANN@{m}"),
                            None => "CANN".to_owned(),
                        },
                        _ => row.event_type.clone(),
                    };
                    ev.name = self.intern(&owner);
                    ev.stack = self.intern_stack(&row.c_stack, &row.python_stack);
                }
            }
            ("MSTX", "Range_start") => {
                ev.kind = if row.name == "step start" {
                    Kind::Step
                } else {
                    Kind::RangeStart
                };
                ev.name = self.intern(&row.name);
                if !self.first_sighting(row, ev.name) {
                    return Ok(());
                }
            }
            ("MSTX", "Range_end") => {
                ev.kind = Kind::RangeEnd;
                ev.name = self.intern(&row.name);
                // "Range end from id <id>"
                ev.addr = row
                    .name
                    .rsplit(' ')
                    .next()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                if !self.first_sighting(row, ev.name) {
                    return Ok(());
                }
            }
            ("MSTX", "Mark") => {
                ev.kind = Kind::Mark;
                ev.name = self.intern(&row.name);
                if !self.first_sighting(row, ev.name) {
                    return Ok(());
                }
            }
            ("OP_LAUNCH", t) | ("KERNEL_LAUNCH", t) => {
                ev.kind = match t {
                    // ACLNN_*: the op API calls of an unmodified torch_npu process.
                    "ATEN_START" | "ATB_START" | "ACLNN_START" => Kind::OpStart,
                    "ATEN_END" | "ATB_END" | "ACLNN_END" => Kind::OpEnd,
                    "KERNEL_START" => Kind::KernelStart,
                    "KERNEL_END" => Kind::KernelEnd,
                    "KERNEL_LAUNCH" => Kind::KernelLaunch,
                    _ => return Ok(()),
                };
                ev.name = self.intern(&row.name);
            }
            ("OOM_DETAIL", "OOM_TRIGGER") => {
                ev.kind = Kind::Oom;
                ev.size = attr_u64("req_size")?;
                ev.name = self.intern(row.attr("func").unwrap_or("allocation"));
            }
            _ => return Ok(()),
        }
        self.events.push(ev);
        Ok(())
    }

    fn first_sighting(&mut self, row: &DumpRow, name: u32) -> bool {
        self.seen_marks.insert((row.pid, row.ts_ns, row.tid, name))
    }

    /// Sorts the events by time (ties keep the order they were added in) and walks them.
    pub fn finish(mut self, timeline_ms: u64) -> Model {
        self.events.sort_by_key(|e| e.ts);
        Model::build(
            self.events,
            self.names,
            self.stacks,
            self.files,
            timeline_ms,
        )
    }
}
