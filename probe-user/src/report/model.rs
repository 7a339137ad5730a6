//! The run, replayed: every dump of a run read through [`crate::offline::reader`] into compact
//! events, sorted by time, then walked once for the curves (downsampled per pixel column, the
//! minimum and maximum of each column kept exactly), the peaks and the 100 ms maxima, and once
//! more for what was live at the moments worth a snapshot (each peak, each interval maximum,
//! the end, `--at`).
//!
//! Accounting follows `analyze` (offline/analyze.rs): driver memory is the HAL blocks (`HAL`,
//! and `HOST` with `pinned:true`); a FREE closes the live block of the process at that address,
//! the one with its `allocation_id` when it has one. Framework pool regions (PTA, MINDSPORE,
//! ATB, ...) are a second, separate sum: they live inside segments the pools got from the
//! driver, so they are drawn as lines over the driver memory, never stacked onto it.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
};

use anyhow::Result;

use crate::{
    offline::{
        analyze::{address, is_hal},
        reader::{self, DumpRow, Loc},
    },
    output::DeviceKey,
};

/// Pixel columns the curves are reduced to (each keeps its minimum and maximum).
pub const COLUMNS: u64 = 1200;
/// Default interval of the local-maximum timeline, as the driver tool's log has it.
pub const DEFAULT_TIMELINE_MS: u64 = 100;

/// A (process, device) pair: one memory curve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrackKey {
    pub pid: u32,
    pub device: DeviceKey,
}

impl TrackKey {
    pub fn device_label(&self) -> String {
        device_label(self.device)
    }
}

pub fn device_label(d: DeviceKey) -> String {
    match d {
        DeviceKey::Npu(n) => n.to_string(),
        DeviceKey::Cpu => "cpu".to_owned(),
        DeviceKey::NotApplicable => "N/A".to_owned(),
    }
}

/// What a row meant, reduced to what the pictures need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A driver (HAL) allocation; `owner` is the driver owner.
    Malloc,
    Free,
    /// A framework pool region.
    PoolMalloc,
    PoolFree,
    /// An mstx `"step start"` range start.
    Step,
    /// An mstx range start (`name`), its `id` in `addr`.
    RangeStart,
    RangeEnd,
    Mark,
    /// Operator start/end (ATen, ATB), kernel start/end (ATB) and kernel launches (`name`).
    OpStart,
    OpEnd,
    KernelStart,
    KernelEnd,
    KernelLaunch,
    /// An allocation that failed for lack of memory (`OOM_TRIGGER`); `size` is the request.
    Oom,
}

/// One event; 64 bytes, so ten million fit in memory comfortably.
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub ts: u64,
    pub addr: u64,
    pub size: u64,
    /// `allocation_id`, 0 when the row has none.
    pub alloc_id: u64,
    pub pid: u32,
    pub tid: u32,
    /// Owner (memory events) or name (others), an index into [`Model::names`].
    pub name: u32,
    /// Interned `Call Stack(C)`, 0 for none.
    pub stack: u32,
    /// Pool kind (the Event Type, an index into [`Model::names`]) of a pool region; 0 else.
    pub pool: u32,
    pub device: DeviceKey,
    pub kind: Kind,
}

/// A block live at some moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    pub addr: u64,
    pub size: u64,
    pub alloc_id: u64,
    pub ts: u64,
    pub tid: u32,
    pub owner: u32,
    pub stack: u32,
    /// The `"step start"` ranges of the process before the allocation.
    pub step: u32,
}

/// Builds a [`Model`] from rows (any number of files) or events.
#[derive(Default)]
pub struct Builder {
    events: Vec<Event>,
    names: Vec<String>,
    name_ids: HashMap<String, u32>,
    stacks: Vec<String>,
    stack_ids: HashMap<String, u32>,
    /// Rows read, per file.
    pub files: Vec<(PathBuf, u64)>,
    /// Marks copied into every device file of a process are seen once per file: keep the first.
    seen_marks: std::collections::HashSet<(u32, u64, u32, u32)>,
}

fn is_pool(row: &DumpRow) -> bool {
    matches!(
        row.event_type.as_str(),
        "PTA" | "PTA_WORKSPACE" | "MINDSPORE" | "ATB"
    )
}

impl Builder {
    pub fn new() -> Self {
        let mut b = Builder::default();
        b.intern_stack("");
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

    pub fn intern_stack(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.stack_ids.get(s) {
            return i;
        }
        let i = self.stacks.len() as u32;
        self.stacks.push(s.to_owned());
        self.stack_ids.insert(s.to_owned(), i);
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
                    ev.stack = self.intern_stack(&row.c_stack);
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
                    "ATEN_START" | "ATB_START" => Kind::OpStart,
                    "ATEN_END" | "ATB_END" => Kind::OpEnd,
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

/// One point of a downsampled curve: a moment and the bytes of every owner then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Point {
    pub ts: u64,
    pub driver: u64,
    pub pool: u64,
    /// Bytes per owner (index into [`Track::owners`]).
    pub by_owner: Vec<u64>,
}

/// The local maximum of one interval of the timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntervalMax {
    /// Start of the interval, ns after the run's first event.
    pub start_ns: u64,
    /// When the maximum was first reached (absolute ns).
    pub ts: u64,
    pub bytes: u64,
    /// Index of the event that reached it (for the snapshot).
    pub(crate) event: usize,
}

/// The curve and the figures of one (process, device).
#[derive(Clone, Debug, Default)]
pub struct Track {
    /// Owner name ids (into [`Model::names`]) in order of appearance; `driver[i]` says
    /// whether owner i is driver memory (stacked) or a pool (a line).
    pub owners: Vec<u32>,
    pub driver_owner: Vec<bool>,
    pub points: Vec<Point>,
    /// Driver bytes at the peak, when it was first reached, and the event index.
    pub peak: u64,
    pub peak_ts: u64,
    pub(crate) peak_event: Option<usize>,
    pub pool_peak: u64,
    pub mallocs: u64,
    pub frees: u64,
    pub unmatched_frees: u64,
    /// Largest `used` the rows themselves carried (the tracer's own running sum), if any.
    pub timeline: Vec<IntervalMax>,
    /// Driver bytes at the end of the dump.
    pub end_bytes: u64,
}

/// A moment worth a snapshot of the live blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Moment {
    /// After this event index (inclusive).
    AfterEvent(usize),
    /// The last event at or before this absolute time.
    AtTime(u64),
    End,
}

/// The whole run.
pub struct Model {
    pub events: Vec<Event>,
    pub names: Vec<String>,
    pub stacks: Vec<String>,
    pub files: Vec<(PathBuf, u64)>,
    pub tracks: BTreeMap<TrackKey, Track>,
    /// First and last event time (ns).
    pub t0: u64,
    pub t1: u64,
    pub timeline_ms: u64,
    /// Step starts per process (absolute ns).
    pub steps: BTreeMap<u32, Vec<u64>>,
    /// Driver blocks live at the end, per track, in allocation order.
    pub leaks: BTreeMap<TrackKey, Vec<LiveBlock>>,
}

#[derive(Default)]
struct TrackState {
    owner_index: HashMap<u32, usize>,
    values: Vec<u64>,
    driver: u64,
    pool: u64,
    /// Current pixel column and its extremes (by driver bytes, or pool bytes when the track
    /// has no driver memory).
    col: Option<u64>,
    col_min: Option<Point>,
    col_max: Option<Point>,
    /// Current timeline interval and its maximum.
    interval: Option<u64>,
    interval_max: Option<IntervalMax>,
}

impl TrackState {
    fn owner(&mut self, track: &mut Track, name: u32, driver: bool) -> usize {
        *self.owner_index.entry(name).or_insert_with(|| {
            track.owners.push(name);
            track.driver_owner.push(driver);
            self.values.push(0);
            track.owners.len() - 1
        })
    }

    fn point(&self, ts: u64) -> Point {
        Point {
            ts,
            driver: self.driver,
            pool: self.pool,
            by_owner: self.values.clone(),
        }
    }

    fn flush_column(&mut self, track: &mut Track) {
        let (a, b) = (self.col_min.take(), self.col_max.take());
        let mut pts: Vec<Point> = a.into_iter().chain(b).collect();
        pts.sort_by_key(|p| p.ts);
        pts.dedup_by_key(|p| p.ts);
        track.points.extend(pts);
    }
}

/// Key of a live block: process and address (blocks at one address are kept newest last).
type LiveKey = (u32, u64);

impl Model {
    fn build(
        events: Vec<Event>,
        names: Vec<String>,
        stacks: Vec<String>,
        files: Vec<(PathBuf, u64)>,
        timeline_ms: u64,
    ) -> Model {
        let t0 = events.first().map_or(0, |e| e.ts);
        let t1 = events.last().map_or(0, |e| e.ts);
        let span = (t1 - t0).max(1);
        let interval_ns = timeline_ms.max(1) * 1_000_000;
        let mut tracks: BTreeMap<TrackKey, Track> = BTreeMap::new();
        let mut states: HashMap<TrackKey, TrackState> = HashMap::new();
        let mut steps: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        let mut live = LiveSet::default();

        for (i, e) in events.iter().enumerate() {
            let (owner_name, delta_driver, size, sign, key) = match e.kind {
                Kind::Step => {
                    steps.entry(e.pid).or_default().push(e.ts);
                    live.step(e.pid);
                    continue;
                }
                Kind::Malloc | Kind::PoolMalloc => {
                    let driver = e.kind == Kind::Malloc;
                    live.insert(e, driver);
                    let key = TrackKey {
                        pid: e.pid,
                        device: e.device,
                    };
                    (e.name, driver, e.size, 1i8, key)
                }
                Kind::Free | Kind::PoolFree => {
                    let driver = e.kind == Kind::Free;
                    match live.remove(e, driver) {
                        Some((b, device)) => {
                            let key = TrackKey { pid: e.pid, device };
                            let t = tracks.entry(key).or_default();
                            if driver {
                                t.frees += 1;
                            }
                            // The size of the block freed, whatever the FREE row says.
                            (b.owner, driver, b.size, -1, key)
                        }
                        None => {
                            if driver {
                                tracks
                                    .entry(TrackKey {
                                        pid: e.pid,
                                        device: e.device,
                                    })
                                    .or_default()
                                    .unmatched_frees += 1;
                            }
                            continue;
                        }
                    }
                }
                _ => continue,
            };
            let track = tracks.entry(key).or_default();
            let st = states.entry(key).or_default();
            let o = st.owner(track, owner_name, delta_driver);
            if sign > 0 {
                st.values[o] += size;
                if delta_driver {
                    st.driver += size;
                    track.mallocs += 1;
                } else {
                    st.pool += size;
                }
            } else {
                st.values[o] = st.values[o].saturating_sub(size);
                if delta_driver {
                    st.driver = st.driver.saturating_sub(size);
                } else {
                    st.pool = st.pool.saturating_sub(size);
                }
            }
            if st.driver > track.peak || track.peak_event.is_none() && delta_driver {
                track.peak = st.driver;
                track.peak_ts = e.ts;
                track.peak_event = Some(i);
            }
            track.pool_peak = track.pool_peak.max(st.pool);

            // Pixel column extremes.
            let col = (e.ts - t0) as u128 * COLUMNS as u128 / span as u128;
            let col = col as u64;
            if st.col != Some(col) {
                st.flush_column(track);
                st.col = Some(col);
            }
            // Only a new extreme of the column copies the owners' bytes.
            let by_driver = track.mallocs > 0;
            let measure = |p: &Point| if by_driver { p.driver } else { p.pool };
            let m = if by_driver { st.driver } else { st.pool };
            if st.col_max.as_ref().is_none_or(|p| m > measure(p)) {
                st.col_max = Some(st.point(e.ts));
            }
            if st.col_min.as_ref().is_none_or(|p| m < measure(p)) {
                st.col_min = Some(st.point(e.ts));
            }

            // Timeline: local maximum of driver bytes per interval.
            let iv = (e.ts - t0) / interval_ns;
            if st.interval != Some(iv) {
                if let Some(m) = st.interval_max.take() {
                    track.timeline.push(m);
                }
                st.interval = Some(iv);
            }
            if st.interval_max.as_ref().is_none_or(|m| st.driver > m.bytes) {
                st.interval_max = Some(IntervalMax {
                    start_ns: iv * interval_ns,
                    ts: e.ts,
                    bytes: st.driver,
                    event: i,
                });
            }
        }
        for (key, st) in states.iter_mut() {
            let track = tracks.get_mut(key).expect("state without track");
            st.flush_column(track);
            if let Some(m) = st.interval_max.take() {
                track.timeline.push(m);
            }
            track.end_bytes = st.driver;
            // Hold the final value to the end of the run so every curve spans the same time.
            if track.points.last().is_some_and(|p| p.ts < t1) {
                let last = st.point(t1);
                track.points.push(last);
            }
        }
        tracks.retain(|_, t| !t.owners.is_empty() || t.unmatched_frees > 0);

        let mut leaks: BTreeMap<TrackKey, Vec<LiveBlock>> = BTreeMap::new();
        for (pid, device, b) in live.drain_driver() {
            leaks.entry(TrackKey { pid, device }).or_default().push(b);
        }
        for v in leaks.values_mut() {
            v.sort_by_key(|b| (b.ts, b.alloc_id, b.addr));
        }
        Model {
            events,
            names,
            stacks,
            files,
            tracks,
            t0,
            t1,
            timeline_ms,
            steps,
            leaks,
        }
    }

    pub fn name(&self, i: u32) -> &str {
        &self.names[i as usize]
    }

    pub fn stack(&self, i: u32) -> &str {
        &self.stacks[i as usize]
    }

    /// The driver blocks live at each moment, per track. One replay for all moments.
    pub fn snapshots(&self, moments: &[Moment]) -> Vec<BTreeMap<TrackKey, Vec<LiveBlock>>> {
        let mut order: Vec<(usize, usize)> = moments
            .iter()
            .enumerate()
            .map(|(n, m)| {
                let idx = match *m {
                    Moment::AfterEvent(i) => i,
                    Moment::AtTime(t) => match self.events.partition_point(|e| e.ts <= t) {
                        0 => usize::MAX - 1, // before anything: empty
                        p => p - 1,
                    },
                    Moment::End => self.events.len().saturating_sub(1),
                };
                (idx, n)
            })
            .collect();
        order.sort();
        let mut out = vec![BTreeMap::new(); moments.len()];
        let mut live = LiveSet::default();
        let mut next = 0;
        // Moments before every event (or in an empty run) see nothing.
        while next < order.len() && order[next].0 == usize::MAX - 1 {
            next += 1;
        }
        for (i, e) in self.events.iter().enumerate() {
            if next >= order.len() {
                break;
            }
            match e.kind {
                Kind::Step => live.step(e.pid),
                Kind::Malloc => live.insert(e, true),
                Kind::Free => {
                    live.remove(e, true);
                }
                _ => {}
            }
            while next < order.len() && order[next].0 == i {
                out[order[next].1] = live.by_track();
                next += 1;
            }
        }
        out
    }
}

/// Live blocks during a replay.
#[derive(Default)]
struct LiveSet {
    driver: HashMap<LiveKey, Vec<(LiveBlock, DeviceKey)>>,
    pool: HashMap<(u32, u32, u64), Vec<(LiveBlock, DeviceKey)>>,
    steps: HashMap<u32, u32>,
}

impl LiveSet {
    fn step(&mut self, pid: u32) {
        *self.steps.entry(pid).or_default() += 1;
    }

    fn insert(&mut self, e: &Event, driver: bool) {
        let b = LiveBlock {
            addr: e.addr,
            size: e.size,
            alloc_id: e.alloc_id,
            ts: e.ts,
            tid: e.tid,
            owner: e.name,
            stack: e.stack,
            step: self.steps.get(&e.pid).copied().unwrap_or(0),
        };
        if driver {
            self.driver
                .entry((e.pid, e.addr))
                .or_default()
                .push((b, e.device));
        } else {
            self.pool
                .entry((e.pid, e.pool, e.addr))
                .or_default()
                .push((b, e.device));
        }
    }

    /// Closes the block a FREE names; returns it and its device.
    fn remove(&mut self, e: &Event, driver: bool) -> Option<(LiveBlock, DeviceKey)> {
        fn take<K: std::hash::Hash + Eq>(
            map: &mut HashMap<K, Vec<(LiveBlock, DeviceKey)>>,
            key: K,
            alloc_id: u64,
        ) -> Option<(LiveBlock, DeviceKey)> {
            let blocks = map.get_mut(&key)?;
            let pos = if alloc_id != 0 {
                blocks
                    .iter()
                    .rposition(|(b, _)| b.alloc_id == alloc_id || b.alloc_id == 0)
            } else {
                blocks.len().checked_sub(1)
            }?;
            let b = blocks.remove(pos);
            // Addresses are rarely reused in long runs: keep the map to the live blocks.
            if blocks.is_empty() {
                map.remove(&key);
            }
            Some(b)
        }
        if driver {
            take(&mut self.driver, (e.pid, e.addr), e.alloc_id)
        } else {
            take(&mut self.pool, (e.pid, e.pool, e.addr), e.alloc_id)
        }
    }

    fn by_track(&self) -> BTreeMap<TrackKey, Vec<LiveBlock>> {
        let mut m: BTreeMap<TrackKey, Vec<LiveBlock>> = BTreeMap::new();
        for ((pid, _), v) in &self.driver {
            for (b, d) in v {
                m.entry(TrackKey {
                    pid: *pid,
                    device: *d,
                })
                .or_default()
                .push(b.clone());
            }
        }
        for v in m.values_mut() {
            v.sort_by_key(|b| (b.ts, b.alloc_id, b.addr));
        }
        m
    }

    fn drain_driver(&mut self) -> Vec<(u32, DeviceKey, LiveBlock)> {
        let mut out = Vec::new();
        for ((pid, _), v) in self.driver.drain() {
            for (b, d) in v {
                out.push((pid, d, b));
            }
        }
        out
    }
}

/// Every dump under `path` (a run directory: `memscope_dump_*.csv|db` at any depth, symlinks
/// not followed), or `path` itself when it is a file. Sorted, so the order is stable.
pub fn dump_files(path: &Path) -> Result<Vec<PathBuf>> {
    let md = std::fs::symlink_metadata(path)
        .map_err(|e| crate::offline::InputError::file(path, format!("cannot be read: {e}")))?;
    if md.is_file() || md.file_type().is_symlink() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let rd = std::fs::read_dir(&dir).map_err(|e| {
            crate::offline::InputError::file(&dir, format!("cannot be listed: {e}"))
        })?;
        for entry in rd.flatten() {
            let Ok(ft) = entry.file_type() else { continue };
            let p = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file()
                && name.starts_with("memscope_dump_")
                && (name.ends_with(".csv") || name.ends_with(".db"))
            {
                out.push(p);
            }
        }
    }
    out.sort();
    if out.is_empty() {
        return Err(crate::offline::InputError::file(
            path,
            "holds no memscope_dump_*.csv or memscope_dump_*.db file (give a run directory \
             written by --output-path, or a dump file)",
        )
        .into());
    }
    Ok(out)
}

/// Reads every dump of a run (directory or file) into a model.
pub fn load(path: &Path, timeline_ms: u64) -> Result<Model> {
    let mut b = Builder::new();
    for f in dump_files(path)? {
        b.read_file(&f)?;
    }
    Ok(b.finish(timeline_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = crate::output::csv::CSV_HEADER;

    fn model_of(name: &str, text: &str) -> Model {
        let dir =
            std::env::temp_dir().join(format!("memscope-model-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("memscope_dump_1.csv");
        std::fs::write(&p, text).unwrap();
        let m = load(&dir, 100).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        m
    }

    #[test]
    fn replays_like_analyze_with_pools_apart() {
        // 4096 freed by id; 100 freed by a FREE whose id matches nothing (stays live); a PTA
        // region is a pool line, not driver memory; pinned host memory is driver memory on cpu.
        let m = model_of(
            "ours",
            &format!(
                "{H}\n\
                 0,MSTX,Range_start,\"step start\",1,7,7,0,N/A,,,\n\
                 1,MALLOC,HAL,N/A,10,7,8,0,0x0000000000001000,\"{{allocation_id:1,addr:0x0000000000001000,size:4096,used:4096}}\",,\n\
                 2,MALLOC,HAL,N/A,15,7,8,0,0x0000000000009000,\"{{allocation_id:2,addr:0x0000000000009000,size:100,used:4196}}\",,\n\
                 3,FREE,HAL,N/A,20,7,8,0,0x0000000000001000,\"{{allocation_id:1,addr:0x0000000000001000,size:4096,used:100}}\",,\n\
                 4,FREE,HAL,N/A,40,7,8,0,0x0000000000009000,\"{{allocation_id:9,addr:0x0000000000009000,size:100,used:100}}\",,\n\
                 5,MALLOC,PTA,N/A,41,7,8,0,0x0000000000003000,\"{{allocation_id:4,addr:0x0000000000003000,size:50000,used:1,total:1}}\",,\n\
                 6,MALLOC,HOST,N/A,42,7,8,cpu,0x0000000000004000,\"{{allocation_id:5,addr:0x0000000000004000,size:64,pinned:true,used:64}}\",,\n"
            ),
        );
        let d0 = &m.tracks[&TrackKey {
            pid: 7,
            device: DeviceKey::Npu(0),
        }];
        assert_eq!((d0.peak, d0.peak_ts), (4196, 15));
        assert_eq!(d0.pool_peak, 50000);
        assert_eq!((d0.mallocs, d0.frees, d0.unmatched_frees), (2, 1, 1));
        assert_eq!(d0.end_bytes, 100);
        let cpu = &m.tracks[&TrackKey {
            pid: 7,
            device: DeviceKey::Cpu,
        }];
        assert_eq!(cpu.peak, 64);
        let leaks: Vec<(u64, u32)> = m
            .leaks
            .values()
            .flatten()
            .map(|b| (b.size, b.step))
            .collect();
        assert_eq!(leaks, [(100, 1), (64, 1)]);
        // The curve's largest point is the peak, with the pool beside it.
        assert_eq!(d0.points.iter().map(|p| p.driver).max(), Some(4196));
        // What was live at the peak, and at t=12 (only the 4096 block).
        let s = m.snapshots(&[
            Moment::AfterEvent(d0.peak_event.unwrap()),
            Moment::AtTime(12),
        ]);
        let key = TrackKey {
            pid: 7,
            device: DeviceKey::Npu(0),
        };
        assert_eq!(s[0][&key].iter().map(|b| b.size).sum::<u64>(), 4196);
        assert_eq!(
            s[1][&key].iter().map(|b| b.size).collect::<Vec<_>>(),
            [4096]
        );
    }

    #[test]
    fn reads_msmemscope_old_layout_out_of_order() {
        // Rows written at free time (not in time order), negative FREE sizes, decimal Ptr,
        // owner from MID.
        let m = model_of(
            "old",
            &format!(
                "{H}\n\
                 4,MALLOC,HAL,N/A,40,5,5,0,4096,\"{{addr:4096,size:10,owner:,MID:7}}\",,\n\
                 5,FREE,HAL,N/A,50,5,5,0,4096,\"{{addr:4096,size:-10,owner:,MID:7}}\",,\n\
                 2,MALLOC,HAL,N/A,20,5,5,0,4096,\"{{addr:4096,size:30,owner:,MID:33}}\",,\n\
                 3,FREE,HAL,N/A,30,5,5,0,4096,\"{{addr:4096,size:-30,owner:,MID:33}}\",,\n\
                 6,MALLOC,HAL,N/A,60,5,5,0,8192,\"{{addr:8192,size:20,owner:,MID:33}}\",,\n"
            ),
        );
        let t = &m.tracks[&TrackKey {
            pid: 5,
            device: DeviceKey::Npu(0),
        }];
        assert_eq!(t.peak, 30);
        assert_eq!(t.end_bytes, 20);
        let owners: Vec<&str> = t.owners.iter().map(|o| m.name(*o)).collect();
        assert_eq!(owners, ["CANN@33", "CANN@7"]);
        assert_eq!(m.leaks.values().flatten().count(), 1);
        // 100 ms intervals: everything is in the first.
        assert_eq!(t.timeline.len(), 1);
        assert_eq!(t.timeline[0].bytes, 30);
    }
}
