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
//!
//! Here: the model and the walk over it; `model/build.rs` reads the dumps into events,
//! `model/live.rs` keeps what is live during the walk.

mod build;
mod live;
#[cfg(test)]
mod tests;

pub use build::Builder;

use crate::output::DeviceKey;
use crate::output::leaks::ExitMemory;
use anyhow::Result;
use live::LiveSet;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

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
    /// Interned stacks (`Call Stack(C)` and `Call Stack(Python)`), 0 for none.
    pub stack: u32,
    /// Pool kind (the Event Type, an index into [`Model::names`]) of a pool region; 0 else.
    pub pool: u32,
    pub device: DeviceKey,
    pub kind: Kind,
}

/// The stacks of a row: its C column and its Python column, either possibly empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Stacks {
    pub c: String,
    pub python: String,
}

impl Stacks {
    /// The stacks a block (of the leak analysis) was allocated with.
    pub fn of_block(b: &crate::output::leaks::Block) -> Stacks {
        Stacks {
            c: b.stack.as_deref().unwrap_or("").to_owned(),
            python: b.py_stack.as_deref().unwrap_or("").to_owned(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.c.trim().is_empty() && self.python.trim().is_empty()
    }

    /// The user's site (`analysis::sites`): the program's own line that asked for the memory.
    pub fn site(&self) -> String {
        crate::analysis::sites::user_site(&self.c, &self.python)
    }

    /// Both stacks as one text: the Python frames first (they name the program's lines), then
    /// the C frames; the C column alone when it holds the Python frames already (`mixed`).
    pub fn text(&self) -> String {
        let python = self.python.trim_end();
        if python.is_empty() || self.c.contains("[python] ") {
            return self.c.clone();
        }
        if self.c.trim().is_empty() {
            return python.to_owned();
        }
        format!("{python}\n{}", self.c)
    }
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
    pub stacks: Vec<Stacks>,
    pub files: Vec<(PathBuf, u64)>,
    pub tracks: BTreeMap<TrackKey, Track>,
    /// First and last event time (ns).
    pub t0: u64,
    pub t1: u64,
    pub timeline_ms: u64,
    /// Step starts per process (absolute ns).
    pub steps: BTreeMap<u32, Vec<u64>>,
    /// Driver blocks live at the end, per track, in allocation order: once the run's end is
    /// sorted ([`Model::set_exit`]), only those no framework pool owns (leaks).
    pub leaks: BTreeMap<TrackKey, Vec<LiveBlock>>,
    /// Each process's end as the leak report tells it (leaked tensors, driver blocks no pool
    /// owns, what the pools keep cached), from `offline::analyze`.
    pub exit: BTreeMap<u32, ExitMemory>,
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

impl Model {
    fn build(
        events: Vec<Event>,
        names: Vec<String>,
        stacks: Vec<Stacks>,
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
            exit: BTreeMap::new(),
        }
    }

    /// Takes the run's end as the leak analysis sorted it: the driver blocks a pool keeps
    /// (its cached segments) are no leaks.
    pub fn set_exit(&mut self, exit: BTreeMap<u32, ExitMemory>) {
        for (key, blocks) in self.leaks.iter_mut() {
            let leaked: std::collections::HashSet<(u64, u64)> = exit
                .get(&key.pid)
                .map(|m| {
                    m.driver_leaks
                        .iter()
                        .map(|b| (b.addr, b.allocation_id))
                        .collect()
                })
                .unwrap_or_default();
            blocks.retain(|b| leaked.contains(&(b.addr, b.alloc_id)));
        }
        self.leaks.retain(|_, v| !v.is_empty());
        self.exit = exit;
    }

    pub fn name(&self, i: u32) -> &str {
        &self.names[i as usize]
    }

    pub fn stack(&self, i: u32) -> &Stacks {
        &self.stacks[i as usize]
    }

    /// What was live at each moment, per track: the tensors (pool blocks) of a track whose
    /// process had framework pools there, which say what the program's code holds; the
    /// driver blocks of the others. One replay for all moments.
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
        let pool_tracks: std::collections::HashSet<TrackKey> = self
            .tracks
            .iter()
            .filter(|(_, t)| t.pool_peak > 0)
            .map(|(k, _)| *k)
            .collect();
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
                Kind::PoolMalloc => live.insert(e, false),
                Kind::PoolFree => {
                    live.remove(e, false);
                }
                _ => {}
            }
            while next < order.len() && order[next].0 == i {
                out[order[next].1] = live.by_track(&pool_tracks);
                next += 1;
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
    let mut exit: BTreeMap<u32, ExitMemory> = BTreeMap::new();
    for f in dump_files(path)? {
        b.read_file(&f)?;
        // One file per device: each process's parts add up.
        for (pid, m) in crate::offline::analyze::find_leaks(&f)?.memory {
            let e = exit.entry(pid).or_default();
            e.driver_leaks.extend(m.driver_leaks);
            e.tensor_leaks.extend(m.tensor_leaks);
            e.pools.extend(m.pools);
        }
    }
    let mut model = b.finish(timeline_ms);
    model.set_exit(exit);
    Ok(model)
}
