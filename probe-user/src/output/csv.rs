//! `memscope_dump_<ts>.csv` (or `.db` with `--format=db`), written row by row as events arrive
//! (time order), one file per device of each traced process.
//!
//! Here: one process's files (rotation, failures, flushes); `csv/format.rs` turns a row into
//! its CSV line, `csv/file.rs` buffers whole lines into one file.

mod file;
mod format;
#[cfg(test)]
mod tests;

pub use crate::digits::{push_hex16, push_u64};
pub use crate::state::{Row, quote_text};
pub use file::MAX_WAITING_BYTES;

use super::db::DbWriter;
use super::{DeviceKey, fsutil, local_timestamp};
use crate::settings::DataFormat;
use anyhow::{Context, Result};
use file::{CSV_BUFFER, CsvFile};
use std::io::Write;
use std::path::{Path, PathBuf};

pub const CSV_HEADER: &str = "ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,Ptr,Attr,Call Stack(Python),Call Stack(C)";

/// Where one device's rows go.
enum Sink {
    Csv(CsvFile),
    Db(DbWriter),
}

struct DeviceFile {
    /// Where the file is, or (not created yet) will be.
    path: PathBuf,
    sink: Sink,
    /// Writes to this file are failing (reported once, until they work again).
    failing: bool,
    /// Names of this device's earlier dump files still on disk (rotation), oldest first.
    older: std::collections::VecDeque<String>,
    /// The stem and `_<n>` suffix of the last file created: the next one of the same second
    /// takes a higher n even when rotation deleted the lower ones, so name order stays time
    /// order.
    last_name: Option<(String, u32)>,
}

/// What could not be written: counted, reported once, and summed up at the end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteLoss {
    /// Rows that never reached a file.
    pub rows_lost: u64,
    /// Write attempts that failed (including ones retried successfully later).
    pub failed_writes: u64,
    /// Report files (leaks, decompose, ...) not written.
    pub reports_lost: u64,
    /// The first error, for the summary.
    pub first_error: Option<String>,
}

impl WriteLoss {
    fn record(&mut self, what: &str, e: &dyn std::fmt::Display) {
        self.failed_writes += 1;
        if self.first_error.is_none() {
            self.first_error = Some(format!("{what}: {e}"));
        }
    }

    pub fn anything_lost(&self) -> bool {
        self.rows_lost > 0 || self.reports_lost > 0
    }

    pub fn add(&mut self, other: &WriteLoss) {
        self.rows_lost += other.rows_lost;
        self.reports_lost += other.reports_lost;
        self.failed_writes += other.failed_writes;
        if self.first_error.is_none() {
            self.first_error = other.first_error.clone();
        }
    }
}

/// Everything written for one traced process.
pub struct ProcessOutput {
    output_root: PathBuf,
    /// `msmemscope_<pid>_<ts>`; `_ascend` (after a `_<n>` when the name is taken) completes it.
    dir_stem: String,
    /// The process directory once created (the path it was created at, for messages,
    /// before that).
    process_dir: PathBuf,
    dir: Option<fsutil::Dir>,
    /// `device_<d>/dump` directories opened so far.
    dump_dirs: Vec<(DeviceKey, fsutil::Dir)>,
    config_json: String,
    format: DataFormat,
    /// msMemScope stamps every db of a process with one timestamp.
    db_stamp: String,
    /// Sorted by device; a handful at most, so a scan beats a map on every row.
    files: Vec<(DeviceKey, DeviceFile)>,
    /// Rows not tied to a device, copied into each device file (also ones created later).
    na_rows: Vec<(u64, Row)>,
    next_id: u64,
    rows_written: u64,
    loss: WriteLoss,
    /// `--max-file-mib` in bytes and `--max-files`.
    rotation: Option<(u64, Option<u32>)>,
}

impl ProcessOutput {
    /// CSV output.
    pub fn new(output_root: &Path, pid: u32, config_json: String) -> Self {
        Self::with_format(output_root, pid, config_json, DataFormat::Csv)
    }

    /// CSV or SQLite output.
    pub fn with_format(
        output_root: &Path,
        pid: u32,
        config_json: String,
        format: DataFormat,
    ) -> Self {
        let stamp = local_timestamp();
        let dir_stem = format!("msmemscope_{pid}_{stamp}");
        ProcessOutput {
            output_root: output_root.to_path_buf(),
            process_dir: output_root.join(format!("{dir_stem}_ascend")),
            dir_stem,
            dir: None,
            dump_dirs: Vec::new(),
            config_json,
            format,
            db_stamp: stamp,
            files: Vec::new(),
            na_rows: Vec::new(),
            next_id: 0,
            rows_written: 0,
            loss: WriteLoss::default(),
            rotation: None,
        }
    }

    /// Where the process directory is (once created; where it would go before).
    pub fn process_dir(&self) -> &Path {
        &self.process_dir
    }

    /// Rows in the dump files (rows that could not be written are not counted).
    pub fn rows_written(&self) -> u64 {
        self.rows_written - self.loss.rows_lost
    }

    /// What could not be written so far.
    pub fn loss(&self) -> &WriteLoss {
        &self.loss
    }

    /// Rotating CSV dumps: a device's file is closed once it holds `max_bytes` (give or take
    /// one write buffer) and a new one, with its own header, takes the next rows; with
    /// `max_files`, the oldest files beyond that many are deleted.
    pub fn rotate(&mut self, max_bytes: u64, max_files: Option<u32>) {
        self.rotation = Some((max_bytes.max(1), max_files));
    }

    /// After a write: starts the next file of `at` if this one is full (rotation).
    fn rotate_if_full(&mut self, at: usize) {
        let Some((max_bytes, max_files)) = self.rotation else {
            return;
        };
        let device = self.files[at].0;
        let f = &mut self.files[at].1;
        let Sink::Csv(c) = &mut f.sink else {
            return;
        };
        if c.file.is_none() || c.written < max_bytes {
            return;
        }
        if let Some(name) = f.path.file_name() {
            f.older.push_back(name.to_string_lossy().into_owned());
        }
        f.sink = Sink::Csv(CsvFile::new());
        let Some(keep) = max_files else {
            return;
        };
        // The next file counts too.
        let mut doomed = Vec::new();
        while f.older.len() + 1 > keep as usize {
            doomed.extend(f.older.pop_front());
        }
        if doomed.is_empty() {
            return;
        }
        match self.device_dump_dir(device) {
            Ok(dir) => {
                for name in doomed {
                    match dir.remove_file(&name) {
                        Ok(()) => crate::log::debug(&format!(
                            "rotation: deleted {}",
                            dir.path().join(&name).display()
                        )),
                        Err(e) => crate::log::warn(&format!("rotation: {e:#}")),
                    }
                }
            }
            Err(e) => crate::log::warn(&format!("rotation: {e:#}")),
        }
    }

    /// A side file (leak report, ...) that could not be written: counted with the rows.
    pub fn note_failure(&mut self, e: &anyhow::Error) {
        self.loss.record("report file", &format!("{e:#}"));
        self.loss.reports_lost += 1;
    }

    /// The dump files created so far, by device.
    pub fn dump_files(&self) -> Vec<PathBuf> {
        self.files
            .iter()
            .filter(|(_, f)| !matches!(&f.sink, Sink::Csv(c) if c.file.is_none()))
            .map(|(_, f)| f.path.clone())
            .collect()
    }

    /// The process directory, created (under a name no other run has, with config.json) if
    /// needed.
    pub fn ensure_dir(&mut self) -> Result<fsutil::Dir> {
        if let Some(d) = &self.dir {
            return Ok(d.clone());
        }
        let root = fsutil::Dir::open_root(&self.output_root)?;
        let dir = root.create_unique_dir(&self.dir_stem, "_ascend")?;
        let config = dir.create_file("config.json").and_then(|(path, mut cfg)| {
            cfg.write_all(self.config_json.as_bytes())
                .with_context(|| format!("cannot write {}", path.display()))
        });
        if let Err(e) = config {
            // No half-made directory (an empty config.json) left behind: the next try
            // (space may come back) makes a new one.
            let _ = dir.remove_file("config.json");
            if let Some(name) = dir.path().file_name() {
                let _ = root.remove_dir(&name.to_string_lossy());
            }
            return Err(e);
        }
        self.process_dir = dir.path().to_path_buf();
        self.dir = Some(dir.clone());
        Ok(dir)
    }

    /// `<process dir>/<rel>` (one name), created on demand (with the process directory).
    pub fn subdir(&mut self, rel: &str) -> Result<fsutil::Dir> {
        self.ensure_dir()?.open_or_create_dir(rel)
    }

    /// A new dump file for `device` in the configured format, holding `rows`. A CSV file is
    /// created on its first write; a db right away.
    fn new_dump(&mut self, device: DeviceKey, rows: &[(u64, Row)]) -> Result<DeviceFile> {
        let dir_name = device
            .dir_name()
            .unwrap_or_else(|| "device_N-A".to_string());
        match self.format {
            DataFormat::Csv => {
                let mut out = CsvFile::new();
                for (id, row) in rows {
                    out.push(*id, row);
                }
                let path = self
                    .process_dir
                    .join(dir_name)
                    .join("dump")
                    .join(format!("memscope_dump_{}.csv", local_timestamp()));
                Ok(DeviceFile {
                    path,
                    sink: Sink::Csv(out),
                    failing: false,
                    older: Default::default(),
                    last_name: None,
                })
            }
            DataFormat::Db => {
                let dir = self.device_dump_dir(device)?;
                let name = format!("memscope_dump_{}.db", self.db_stamp);
                let mut db = DbWriter::create_in(&dir, &name)?;
                let path = db.path().to_path_buf();
                for (id, row) in rows {
                    db.insert(*id, row)
                        .with_context(|| format!("cannot write {}", path.display()))?;
                }
                Ok(DeviceFile {
                    path,
                    sink: Sink::Db(db),
                    failing: false,
                    older: Default::default(),
                    last_name: None,
                })
            }
        }
    }

    /// Writes out the rows waiting for file `at` (creating the file first if needed).
    /// Failures are counted and reported once per episode; rows wait in memory up to
    /// [`MAX_WAITING_BYTES`] and are dropped (counted as lost) beyond.
    fn write_out(&mut self, at: usize, finishing: bool) {
        let device = self.files[at].0;
        let created = match &self.files[at].1.sink {
            Sink::Csv(c) => c.file.is_some(),
            Sink::Db(_) => true,
        };
        if let Sink::Csv(c) = &self.files[at].1.sink
            && !created
            && c.buf_rows == 0
            && !self.files[at].1.older.is_empty()
        {
            // Rotated, and nothing for the next file yet: no file with only a header.
            return;
        }
        let mut result: Result<()> = Ok(());
        if !created {
            let stem = format!("memscope_dump_{}", local_timestamp());
            let first = match &self.files[at].1.last_name {
                Some((last, n)) if *last == stem => n + 1,
                _ => 0,
            };
            match self
                .device_dump_dir(device)
                .and_then(|d| d.create_unique_file_from(&stem, ".csv", first))
            {
                Ok((path, file, n)) => {
                    let f = &mut self.files[at].1;
                    f.path = path;
                    f.last_name = Some((stem, n));
                    if let Sink::Csv(c) = &mut f.sink {
                        c.file = Some(file);
                    }
                }
                Err(e) => result = Err(e),
            }
        }
        let f = &mut self.files[at].1;
        if result.is_ok() {
            result = match &mut f.sink {
                Sink::Csv(c) => c
                    .write_out()
                    .with_context(|| format!("cannot write {}", f.path.display())),
                Sink::Db(db) => {
                    let r = if finishing { db.finish() } else { db.commit() };
                    self.loss.rows_lost += db.take_lost();
                    r
                }
            };
        }
        match result {
            Ok(()) => {
                if f.failing {
                    f.failing = false;
                    crate::log::info(&format!(
                        "{}: writing again (after {} failed attempt(s) in all)",
                        f.path.display(),
                        self.loss.failed_writes
                    ));
                }
                if !finishing {
                    self.rotate_if_full(at);
                }
            }
            Err(e) => {
                self.loss
                    .record(&f.path.display().to_string(), &format!("{e:#}"));
                if !f.failing {
                    f.failing = true;
                    crate::log::error(&format!(
                        "{e:#}; rows wait in memory (up to {} MiB per file) and are written \
                         when it works again",
                        MAX_WAITING_BYTES >> 20
                    ));
                }
                if let Sink::Csv(c) = &mut f.sink
                    && (finishing || c.buf.len() > MAX_WAITING_BYTES)
                {
                    self.loss.rows_lost += c.drop_waiting();
                }
            }
        }
    }

    /// A directory for per-device side files (leak reports), created on demand.
    pub fn device_dump_dir(&mut self, device: DeviceKey) -> Result<fsutil::Dir> {
        if let Some((_, d)) = self.dump_dirs.iter().find(|(k, _)| *k == device) {
            return Ok(d.clone());
        }
        let name = device
            .dir_name()
            .unwrap_or_else(|| "device_N-A".to_string());
        let dir = self
            .ensure_dir()?
            .open_or_create_dir(&name)?
            .open_or_create_dir("dump")?;
        self.dump_dirs.push((device, dir.clone()));
        Ok(dir)
    }

    fn file_for(&mut self, device: DeviceKey) -> Result<usize> {
        let at = match self.files.iter().position(|(k, _)| *k == device) {
            Some(at) => at,
            None => {
                // Device-less rows seen so far come first, with the ids they were given: they
                // happened before this device's first event, so the file stays in time order.
                let na_rows = std::mem::take(&mut self.na_rows);
                let file = self.new_dump(device, &na_rows);
                self.na_rows = na_rows;
                let file = file?;
                let at = self.files.partition_point(|(k, _)| *k < device);
                self.files.insert(at, (device, file));
                at
            }
        };
        Ok(at)
    }

    /// Writes a row: to its device file, or for device-less rows to every device file.
    pub fn write(&mut self, row: Row) -> Result<()> {
        if row.device == DeviceKey::NotApplicable {
            return self.write_na(row);
        }
        self.write_ref(&row)
    }

    /// [`write`](Self::write) without taking the row (device-less rows, which are kept, are
    /// cloned): the caller can reuse its row vector. A row that cannot be written is counted
    /// (see [`loss`](Self::loss)), not an error.
    pub fn write_ref(&mut self, row: &Row) -> Result<()> {
        if row.device == DeviceKey::NotApplicable {
            return self.write_na(row.clone());
        }
        let id = self.next_id;
        self.next_id += 1;
        self.rows_written += 1;
        match self.file_for(row.device) {
            Ok(at) => self.put(at, id, row),
            Err(e) => {
                // A db that cannot be created: the row is lost.
                self.loss.rows_lost += 1;
                self.loss
                    .record(&self.process_dir.display().to_string(), &format!("{e:#}"));
                if self.loss.failed_writes == 1 {
                    crate::log::error(&format!("{e:#}"));
                }
            }
        }
        Ok(())
    }

    fn put(&mut self, at: usize, id: u64, row: &Row) {
        let f = &mut self.files[at].1;
        match &mut f.sink {
            Sink::Csv(c) => {
                c.push(id, row);
                // While failing, retries wait for the next flush (or for the waiting rows to
                // pass their cap).
                if (c.buf.len() >= CSV_BUFFER && !f.failing) || c.buf.len() > MAX_WAITING_BYTES {
                    self.write_out(at, false);
                }
            }
            Sink::Db(db) => {
                if let Err(e) = db.insert(id, row) {
                    self.loss.rows_lost += db.take_lost();
                    self.loss
                        .record(&f.path.display().to_string(), &format!("{e:#}"));
                    if !f.failing {
                        f.failing = true;
                        crate::log::error(&format!("{e:#}"));
                    }
                } else if f.failing {
                    f.failing = false;
                    crate::log::info(&format!("{}: writing again", f.path.display()));
                }
            }
        }
    }

    fn write_na(&mut self, row: Row) -> Result<()> {
        let id = self.next_id;
        self.next_id += 1;
        self.rows_written += 1;
        for at in 0..self.files.len() {
            self.put(at, id, &row);
        }
        self.na_rows.push((id, row));
        Ok(())
    }

    /// Writes out what waits in memory (CSV) or commits (db); failures are counted.
    pub fn flush(&mut self) -> Result<()> {
        for at in 0..self.files.len() {
            self.write_out(at, false);
        }
        Ok(())
    }

    /// Rows not tied to a device that no device file received (the process never touched a
    /// device): written to `device_N-A` so nothing is lost. Then a last try to write
    /// everything; what still cannot be written is counted as lost.
    pub fn finish(&mut self) -> Result<()> {
        if self.files.is_empty() && !self.na_rows.is_empty() {
            let na_rows = std::mem::take(&mut self.na_rows);
            match self.new_dump(DeviceKey::NotApplicable, &na_rows) {
                Ok(file) => self.files.push((DeviceKey::NotApplicable, file)),
                Err(e) => {
                    self.loss.rows_lost += na_rows.len() as u64;
                    self.loss
                        .record(&self.process_dir.display().to_string(), &format!("{e:#}"));
                    crate::log::error(&format!("{e:#}"));
                }
            }
            self.na_rows = na_rows;
        }
        for at in 0..self.files.len() {
            self.write_out(at, true);
        }
        Ok(())
    }
}
