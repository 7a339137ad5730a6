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

/// A CSV file and its write buffer. Rows are formatted straight into the buffer (no
/// per-row line copy, as a `BufWriter` would need); the buffer is written out when it passes
/// [`CSV_BUFFER`], on `flush`, and (errors ignored, like `BufWriter`) on drop.
struct CsvFile {
    file: File,
    buf: Vec<u8>,
}

impl CsvFile {
    fn new(file: File) -> Self {
        CsvFile {
            file,
            buf: Vec::with_capacity(CSV_BUFFER + 1024),
        }
    }

    fn write_out(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            let r = self.file.write_all(&self.buf);
            self.buf.clear();
            r?;
        }
        Ok(())
    }
}

impl Drop for CsvFile {
    fn drop(&mut self) {
        let _ = self.write_out();
    }
}

/// Where one device's rows go.
enum Sink {
    Csv(CsvFile),
    Db(DbWriter),
}

impl Sink {
    fn write(&mut self, id: u64, row: &Row) -> Result<()> {
        match self {
            Sink::Csv(out) => {
                row.format_into(id, &mut out.buf);
                if out.buf.len() >= CSV_BUFFER {
                    out.write_out()?;
                }
                Ok(())
            }
            Sink::Db(db) => db.insert(id, row),
        }
    }

    /// CSV: write the buffer out; db: commit the open transaction.
    fn flush(&mut self) -> Result<()> {
        match self {
            Sink::Csv(out) => Ok(out.write_out()?),
            Sink::Db(db) => db.commit(),
        }
    }

    fn finish(&mut self) -> Result<()> {
        match self {
            Sink::Csv(out) => Ok(out.write_out()?),
            Sink::Db(db) => db.finish(),
        }
    }
}

struct DeviceFile {
    path: PathBuf,
    sink: Sink,
}

/// Everything written for one traced process.
pub struct ProcessOutput {
    output_root: PathBuf,
    process_dir: PathBuf,
    config_json: String,
    format: DataFormat,
    /// msMemScope stamps every db of a process with one timestamp.
    db_stamp: String,
    created: bool,
    /// Sorted by device; a handful at most, so a scan beats a map on every row.
    files: Vec<(DeviceKey, DeviceFile)>,
    /// Rows not tied to a device, copied into each device file (also ones created later).
    na_rows: Vec<(u64, Row)>,
    next_id: u64,
    rows_written: u64,
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
        let process_dir = output_root.join(format!("msmemscope_{pid}_{stamp}_ascend"));
        ProcessOutput {
            output_root: output_root.to_path_buf(),
            process_dir,
            config_json,
            format,
            db_stamp: stamp,
            created: false,
            files: Vec::new(),
            na_rows: Vec::new(),
            next_id: 0,
            rows_written: 0,
        }
    }

    pub fn process_dir(&self) -> &Path {
        &self.process_dir
    }

    pub fn rows_written(&self) -> u64 {
        self.rows_written
    }

    /// The dump files created so far, by device.
    pub fn dump_files(&self) -> Vec<PathBuf> {
        self.files.iter().map(|(_, f)| f.path.clone()).collect()
    }

    fn ensure_process_dir(&mut self) -> Result<()> {
        if self.created {
            return Ok(());
        }
        fsutil::create_dir_secure(&self.output_root, &self.process_dir)?;
        let mut cfg = fsutil::create_file_secure(&self.process_dir.join("config.json"))?;
        cfg.write_all(self.config_json.as_bytes())?;
        self.created = true;
        Ok(())
    }

    /// `<process dir>/<rel>`, created on demand (with the process directory and config.json).
    /// The process directory, created (with config.json) if needed.
    pub fn ensure_dir(&mut self) -> Result<PathBuf> {
        self.ensure_process_dir()?;
        Ok(self.process_dir.clone())
    }

    pub fn subdir(&mut self, rel: &str) -> Result<PathBuf> {
        self.ensure_process_dir()?;
        let dir = self.process_dir.join(rel);
        fsutil::create_dir_secure(&self.output_root, &dir)?;
        Ok(dir)
    }

    /// Opens a new dump file in `dir` in the configured format and writes `rows` into it.
    fn open_dump(&self, dir: &Path, rows: &[(u64, Row)]) -> Result<DeviceFile> {
        let (path, mut sink) = match self.format {
            DataFormat::Csv => {
                let path = dir.join(format!("memscope_dump_{}.csv", local_timestamp()));
                let file = fsutil::create_file_secure(&path)?;
                let mut out = CsvFile::new(file);
                out.buf.extend_from_slice(CSV_HEADER.as_bytes());
                out.buf.push(b'\n');
                (path, Sink::Csv(out))
            }
            DataFormat::Db => {
                let path = dir.join(format!("memscope_dump_{}.db", self.db_stamp));
                let db = DbWriter::create(&path)?;
                (path, Sink::Db(db))
            }
        };
        for (id, row) in rows {
            sink.write(*id, row)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        Ok(DeviceFile { path, sink })
    }

    /// A directory for per-device side files (leak reports), created on demand.
    pub fn device_dump_dir(&mut self, device: DeviceKey) -> Result<PathBuf> {
        self.ensure_process_dir()?;
        let name = device
            .dir_name()
            .unwrap_or_else(|| "device_N-A".to_string());
        let dir = self.process_dir.join(name).join("dump");
        fsutil::create_dir_secure(&self.output_root, &dir)?;
        Ok(dir)
    }

    fn file_for(&mut self, device: DeviceKey) -> Result<&mut DeviceFile> {
        let at = match self.files.iter().position(|(k, _)| *k == device) {
            Some(at) => at,
            None => {
                let dir = self.device_dump_dir(device)?;
                // Device-less rows seen so far come first, with the ids they were given: they
                // happened before this device's first event, so the file stays in time order.
                let file = self.open_dump(&dir, &self.na_rows)?;
                let at = self.files.partition_point(|(k, _)| *k < device);
                self.files.insert(at, (device, file));
                at
            }
        };
        Ok(&mut self.files[at].1)
    }

    /// Writes a row: to its device file, or for device-less rows to every device file.
    pub fn write(&mut self, row: Row) -> Result<()> {
        if row.device == DeviceKey::NotApplicable {
            return self.write_na(row);
        }
        self.write_ref(&row)
    }

    /// [`write`](Self::write) without taking the row (device-less rows, which are kept, are
    /// cloned): the caller can reuse its row vector.
    pub fn write_ref(&mut self, row: &Row) -> Result<()> {
        if row.device == DeviceKey::NotApplicable {
            return self.write_na(row.clone());
        }
        let id = self.next_id;
        self.next_id += 1;
        self.rows_written += 1;
        let f = self.file_for(row.device)?;
        f.sink
            .write(id, row)
            .with_context(|| format!("cannot write {}", f.path.display()))
    }

    fn write_na(&mut self, row: Row) -> Result<()> {
        let id = self.next_id;
        self.next_id += 1;
        self.rows_written += 1;
        for (_, f) in &mut self.files {
            f.sink
                .write(id, &row)
                .with_context(|| format!("cannot write {}", f.path.display()))?;
        }
        self.na_rows.push((id, row));
        Ok(())
    }

    pub fn flush(&mut self) -> Result<()> {
        for (_, f) in &mut self.files {
            f.sink
                .flush()
                .with_context(|| format!("cannot write {}", f.path.display()))?;
        }
        Ok(())
    }

    /// Rows not tied to a device that no device file received (the process never touched a
    /// device): written to `device_N-A` so nothing is lost.
    pub fn finish(&mut self) -> Result<()> {
        if self.files.is_empty() && !self.na_rows.is_empty() {
            let dir = self.device_dump_dir(DeviceKey::NotApplicable)?;
            let file = self.open_dump(&dir, &self.na_rows)?;
            self.files.push((DeviceKey::NotApplicable, file));
        }
        for (_, f) in &mut self.files {
            f.sink
                .finish()
                .with_context(|| format!("cannot write {}", f.path.display()))?;
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
