//! `memscope_dump_<ts>.csv` (or `.db` with `--format=db`), written row by row as events arrive
//! (time order), one file per device of each traced process.

use std::{
    fs::File,
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use super::{DeviceKey, db::DbWriter, fsutil, local_timestamp};
use crate::cli::DataFormat;

pub const CSV_HEADER: &str = "ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,Ptr,Attr,Call Stack(Python),Call Stack(C)";

/// One output row; `id` is assigned by the writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub event: &'static str,
    pub event_type: &'static str,
    /// Already formatted (`N/A`, or a quoted MSTX message); borrowed when constant.
    pub name: std::borrow::Cow<'static, str>,
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub device: DeviceKey,
    pub ptr: Option<u64>,
    /// The inside of the braces, e.g. `allocation_id:1,addr:0x...`; empty for no Attr.
    pub attr: String,
    /// The `Call Stack(C)` text (docs/call-stacks.md), when stacks are collected.
    pub c_stack: Option<std::sync::Arc<str>>,
    /// The `Call Stack(Python)` text (`file(line): function` lines, `--call-stack=python`).
    pub py_stack: Option<std::sync::Arc<str>>,
}

impl Row {
    /// The CSV line for this row with ID `id`, newline included.
    pub fn format(&self, id: u64) -> String {
        let mut line = Vec::with_capacity(160);
        self.format_into(id, &mut line);
        String::from_utf8(line).expect("rows are UTF-8")
    }

    /// Appends the CSV line to `out` without temporaries (the hot path of every row).
    pub fn format_into(&self, id: u64, out: &mut Vec<u8>) {
        push_u64(out, id);
        out.push(b',');
        out.extend_from_slice(self.event.as_bytes());
        out.push(b',');
        out.extend_from_slice(self.event_type.as_bytes());
        out.push(b',');
        out.extend_from_slice(self.name.as_bytes());
        out.push(b',');
        push_u64(out, self.ts_ns);
        out.push(b',');
        push_u64(out, self.pid as u64);
        out.push(b',');
        push_u64(out, self.tid as u64);
        out.push(b',');
        match self.device {
            DeviceKey::Npu(n) => push_u64(out, n as u64),
            DeviceKey::Cpu => out.extend_from_slice(b"cpu"),
            DeviceKey::NotApplicable => out.extend_from_slice(b"N/A"),
        }
        out.push(b',');
        match self.ptr {
            Some(p) => push_hex16(out, p),
            None => out.extend_from_slice(b"N/A"),
        }
        out.push(b',');
        if !self.attr.is_empty() {
            out.extend_from_slice(b"\"{");
            out.extend_from_slice(self.attr.as_bytes());
            out.extend_from_slice(b"}\"");
        }
        out.push(b',');
        push_quoted(out, self.py_stack.as_deref());
        out.push(b',');
        push_quoted(out, self.c_stack.as_deref());
        out.push(b'\n');
    }
}

/// A stack column: quoted (it holds newlines), quotes doubled; nothing when there is none.
fn push_quoted(out: &mut Vec<u8>, text: Option<&str>) {
    if let Some(st) = text {
        out.push(b'"');
        for part in st.split('"').enumerate() {
            if part.0 > 0 {
                out.extend_from_slice(b"\"\"");
            }
            out.extend_from_slice(part.1.as_bytes());
        }
        out.push(b'"');
    }
}

/// "00" to "99": two decimal digits per table lookup.
const DEC_PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Decimal digits of `v`, written straight into `out`'s spare capacity (the digit count is
/// known up front, so the digits go to their final place, two per step, with no temporary
/// buffer and no `memcpy` call).
#[inline]
pub fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    let n = v.checked_ilog10().unwrap_or(0) as usize + 1;
    out.reserve(n);
    // SAFETY: `n` bytes are reserved past `len`; the loop writes exactly the `n` digits of
    // `v` into them, from the last one back, before `set_len` exposes them.
    unsafe {
        let start = out.as_mut_ptr().add(out.len());
        let mut end = start.add(n);
        while v >= 100 {
            let d = (v % 100) as usize * 2;
            v /= 100;
            end = end.sub(2);
            std::ptr::copy_nonoverlapping(DEC_PAIRS.as_ptr().add(d), end, 2);
        }
        if v >= 10 {
            end = end.sub(2);
            std::ptr::copy_nonoverlapping(DEC_PAIRS.as_ptr().add(v as usize * 2), end, 2);
        } else {
            end = end.sub(1);
            *end = b'0' + v as u8;
        }
        debug_assert_eq!(end, start);
        out.set_len(out.len() + n);
    }
}

/// Each byte value as two lowercase hex digits.
const HEX_PAIRS: [[u8; 2]; 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut t = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = [HEX[i >> 4], HEX[i & 0xf]];
        i += 1;
    }
    t
};

/// `0x` and 16 lowercase hex digits.
#[inline]
pub fn push_hex16(out: &mut Vec<u8>, v: u64) {
    let mut buf = *b"0x0000000000000000";
    for (k, b) in v.to_be_bytes().iter().enumerate() {
        let pair = HEX_PAIRS[*b as usize];
        buf[2 + 2 * k] = pair[0];
        buf[3 + 2 * k] = pair[1];
    }
    out.extend_from_slice(&buf);
}

/// Quotes a free-text field (an MSTX message) the way msMemScope does, `"..."`, doubling any
/// quote inside so CSV readers still split the row correctly.
pub fn quote_text(s: &str) -> String {
    let clean: String = s
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    format!("\"{}\"", clean.replace('"', "\"\""))
}

/// Bytes of formatted rows kept before they are written to the file.
const CSV_BUFFER: usize = 256 * 1024;

/// Bytes of rows one CSV file keeps in memory while its writes fail (a full disk): written
/// when space returns; past this the oldest waiting rows are dropped, counted as lost.
pub const MAX_WAITING_BYTES: usize = 64 << 20;

/// A CSV file (created on its first write) and its write buffer. Rows are formatted straight
/// into the buffer (no per-row line copy, as a `BufWriter` would need); the buffer is written
/// out when it passes [`CSV_BUFFER`] and on `flush`. The file only ever holds whole rows: a
/// write cut short (no space left) is truncated back to the last complete row and the rows
/// stay in the buffer for the next try.
struct CsvFile {
    file: Option<File>,
    /// Bytes of whole rows in the file.
    written: u64,
    /// The header (while not yet in the file), then rows.
    buf: Vec<u8>,
    /// Rows in `buf`.
    buf_rows: u64,
    /// Length of the header at the start of `buf` (0 once written).
    header_len: usize,
}

impl CsvFile {
    fn new() -> Self {
        let mut buf = Vec::with_capacity(CSV_BUFFER + 1024);
        buf.extend_from_slice(CSV_HEADER.as_bytes());
        buf.push(b'\n');
        CsvFile {
            file: None,
            written: 0,
            header_len: buf.len(),
            buf,
            buf_rows: 0,
        }
    }

    fn push(&mut self, id: u64, row: &Row) {
        row.format_into(id, &mut self.buf);
        self.buf_rows += 1;
    }

    /// Writes the buffer after the whole rows already in the file. A write cut short keeps
    /// the complete rows it got out, cuts the file back to them, and leaves the rest waiting.
    fn write_out(&mut self) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let Some(file) = &self.file else {
            return Err(std::io::Error::other("not created"));
        };
        let mut done = 0;
        let mut failure = None;
        while done < self.buf.len() {
            match file.write_at(&self.buf[done..], self.written + done as u64) {
                Ok(0) => {
                    failure = Some(std::io::Error::from(std::io::ErrorKind::WriteZero));
                    break;
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let (keep, lines) = if failure.is_none() {
            (self.buf.len(), None)
        } else {
            let (keep, lines) = whole_lines(&self.buf[..done]);
            // Best effort: shrinking needs no space.
            let _ = file.set_len(self.written + keep as u64);
            (keep, Some(lines))
        };
        if keep > 0 {
            let rows = match lines {
                None => self.buf_rows,
                // The header is a line but no row.
                Some(n) => n - u64::from(self.header_len > 0),
            };
            self.written += keep as u64;
            self.buf.drain(..keep);
            self.buf_rows -= rows;
            self.header_len = 0;
        }
        match failure {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// Drops the rows waiting in the buffer (the header stays); returns how many.
    fn drop_waiting(&mut self) -> u64 {
        self.buf.truncate(self.header_len);
        std::mem::take(&mut self.buf_rows)
    }
}

impl Drop for CsvFile {
    /// A last try for an output dropped without `finish` (an error path).
    fn drop(&mut self) {
        if self.file.is_some() {
            let _ = self.write_out();
        }
    }
}

/// The length of the complete CSV records at the start of `bytes` (a newline inside a quoted
/// field, as in a call stack, ends no record) and how many there are.
fn whole_lines(bytes: &[u8]) -> (usize, u64) {
    let mut quoted = false;
    let mut end = 0;
    let mut lines = 0;
    for (i, b) in bytes.iter().enumerate() {
        match b {
            b'"' => quoted = !quoted,
            b'\n' if !quoted => {
                end = i + 1;
                lines += 1;
            }
            _ => {}
        }
    }
    (end, lines)
}

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
            match self
                .device_dump_dir(device)
                .and_then(|d| d.create_unique_file(&stem, ".csv"))
            {
                Ok((path, file)) => {
                    let f = &mut self.files[at].1;
                    f.path = path;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(device: DeviceKey, event: &'static str) -> Row {
        Row {
            event,
            event_type: "HAL",
            name: "N/A".into(),
            ts_ns: 5,
            pid: 7,
            tid: 8,
            device,
            ptr: Some(0x3039),
            attr: "allocation_id:1,addr:0x0000000000003039,size:10,used:10".into(),
            c_stack: None,
            py_stack: None,
        }
    }

    #[test]
    fn row_format_matches_msmemscope() {
        let mut r = row(DeviceKey::Npu(0), "MALLOC");
        r.event_type = "PTA";
        r.ts_ns = 3;
        r.pid = 123;
        r.tid = 1234;
        r.attr = "allocation_id:1,addr:0x0000000000003039,size:10,used:10,total:10".into();
        assert_eq!(
            r.format(3),
            "3,MALLOC,PTA,N/A,3,123,1234,0,0x0000000000003039,\"{allocation_id:1,addr:0x0000000000003039,size:10,used:10,total:10}\",,\n"
        );
        let mut sys = row(DeviceKey::NotApplicable, "SYSTEM");
        sys.ptr = None;
        sys.attr.clear();
        sys.event_type = "ACL_INIT";
        assert_eq!(sys.format(0), "0,SYSTEM,ACL_INIT,N/A,5,7,8,N/A,N/A,,,\n");
        assert_eq!(quote_text("a\"b\nc"), "\"a\"\"b c\"");
    }

    #[test]
    fn digits_match_std_formatting() {
        let mut vals = vec![
            0,
            1,
            9,
            10,
            11,
            99,
            100,
            101,
            999,
            1000,
            u64::MAX,
            u64::MAX - 1,
        ];
        for k in 0..20 {
            let p = 10u64.pow(k);
            vals.extend([p - 1, p, p + 1]);
        }
        for v in vals {
            let mut out = b"x".to_vec();
            push_u64(&mut out, v);
            assert_eq!(out, format!("x{v}").as_bytes());
            let mut out = Vec::new();
            push_hex16(&mut out, v);
            assert_eq!(out, format!("0x{v:016x}").as_bytes());
        }
    }

    #[test]
    fn whole_lines_skip_newlines_inside_quotes() {
        let text = b"h\n1,\"a\nb\"\n2,\"\"\"x\n";
        assert_eq!(whole_lines(text), (10, 2));
        assert_eq!(whole_lines(b"partial"), (0, 0));
    }

    #[test]
    fn device_less_rows_reach_every_device_file() {
        let root = std::env::temp_dir().join(format!("memscope-csv-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mut out = ProcessOutput::new(&root, 7, "{}".into());
        let mut na = row(DeviceKey::NotApplicable, "SYSTEM");
        na.ptr = None;
        na.attr.clear();
        out.write(na.clone()).unwrap(); // id 0, before any device file
        out.write(row(DeviceKey::Npu(0), "MALLOC")).unwrap(); // id 1
        out.write(row(DeviceKey::Npu(1), "MALLOC")).unwrap(); // id 2
        out.write(na).unwrap(); // id 3, into both
        out.finish().unwrap();
        let files = out.dump_files();
        assert_eq!(files.len(), 2);
        let d0 = std::fs::read_to_string(&files[0]).unwrap();
        let d1 = std::fs::read_to_string(&files[1]).unwrap();
        let ids = |s: &str| -> Vec<String> {
            s.lines()
                .skip(1)
                .map(|l| l.split(',').next().unwrap().to_string())
                .collect()
        };
        assert_eq!(d0.lines().next().unwrap(), CSV_HEADER);
        assert_eq!(ids(&d0), ["0", "1", "3"]);
        assert_eq!(ids(&d1), ["0", "2", "3"]);
        assert!(d0.contains("0,SYSTEM,HAL,N/A,5,7,8,N/A,N/A,,,"));
        assert!(out.process_dir().join("config.json").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
