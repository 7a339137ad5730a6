//! Reading `memscope_dump` files back: ours or msMemScope's, CSV or SQLite.
//!
//! * CSV: the header must be exactly [`CSV_HEADER`] (after trimming whitespace, CR and a BOM).
//!   Fields may be quoted, with `""` for a quote; a quoted field may span lines (msMemScope's C
//!   call stacks do). Every record must have 12 fields.
//! * SQLite: a `memscope_dump` table with the twelve CSV column names; Attr is a JSON object.
//!   The database is opened read-only.
//! * Older msMemScope output (2025-04) is accepted too: `acl init`/`acl fini` event types
//!   (returned as `ACL_INIT`/`ACL_FINI`), decimal `Ptr` and `addr` values, `host` as a device,
//!   and Attr keys such as `owner:` and `MID:` without `allocation_id`.
//!
//! * msMemScope's own quirks, read as msMemScope meant them: the FREE row with `shadow:true`
//!   it writes at exit for every block still live says what was live, it frees nothing, so
//!   [`for_each_row`] leaves it out (the block stays live to the end of the replay); and a
//!   Name its CSV writer wrapped in quotes once per device file it was copied to
//!   (`""step start""` in the second) is read back as the name (`step start`).
//!
//! Anything malformed is an [`InputError`] naming the file and the line (CSV) or row (db).

use std::{
    fmt,
    fs::File,
    io::{BufRead, BufReader, Read},
    os::unix::fs::OpenOptionsExt,
    path::Path,
};

use anyhow::Result;
use rusqlite::{Connection, OpenFlags, types::ValueRef};

use super::{InputError, check_input_file, excerpt};

mod records;
use crate::output::{
    DeviceKey, attr,
    csv::CSV_HEADER,
    db::{BUSY_TIMEOUT, COLUMNS, TABLE},
};
use records::Records;

/// Which kind of file a dump is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpKind {
    Csv,
    Db,
}

/// One row of a dump, with its columns parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpRow {
    pub id: u64,
    pub event: String,
    /// As written, except the old `acl init`/`acl fini`, given as `ACL_INIT`/`ACL_FINI`.
    pub event_type: String,
    /// Without the CSV quoting (an MSTX message `"step start"` is `step start`).
    pub name: String,
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    /// `N/A` and 9999 are `NotApplicable`; `cpu`, `host` and 10000 are `Cpu`.
    pub device: DeviceKey,
    /// `None` for `N/A`; `0x…` hex or (old layout) decimal otherwise.
    pub ptr: Option<u64>,
    /// The Attr pairs in the order written.
    pub attr: Vec<(String, String)>,
    pub python_stack: String,
    pub c_stack: String,
}

impl DumpRow {
    /// msMemScope's FREE of a block that was still live when the process exited (or when
    /// its tracing stopped): written with `shadow:true`, it marks the block live, not freed.
    pub fn is_shadow_free(&self) -> bool {
        self.event == "FREE" && self.attr("shadow") == Some("true")
    }

    /// The value of Attr key `key`, if present.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attr
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Where a row came from: a CSV line (the first line of the record) or a db row number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    pub kind: DumpKind,
    pub n: u64,
}

impl Loc {
    /// An [`InputError`] at this place in `path`.
    pub fn error(&self, path: &Path, message: impl Into<String>) -> InputError {
        match self.kind {
            DumpKind::Csv => InputError::line(path, self.n, message),
            DumpKind::Db => InputError::at(path, format!("row {}", self.n), message),
        }
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            DumpKind::Csv => write!(f, "line {}", self.n),
            DumpKind::Db => write!(f, "row {}", self.n),
        }
    }
}

const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// The longest CSV line (and record, a quoted field spanning lines included) we read: memory
/// stays bounded whatever the input (a 200-frame C stack is ~40 KiB). Longer is an input error.
pub const MAX_RECORD_BYTES: usize = 16 << 20;

/// `read_until(b'\n')` that stops after `cap` bytes in `buf`; `Ok((n, false))` when the line
/// was cut there.
fn read_line_capped(
    r: &mut impl BufRead,
    buf: &mut Vec<u8>,
    cap: usize,
) -> std::io::Result<(usize, bool)> {
    let mut total = 0;
    loop {
        let avail = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return Ok((total, true));
        }
        let room = cap.saturating_sub(buf.len());
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) if i < room => (i + 1, true),
            _ if avail.len() <= room => (avail.len(), false),
            _ => {
                buf.extend_from_slice(&avail[..room]);
                r.consume(room);
                return Ok((total + room, false));
            }
        };
        buf.extend_from_slice(&avail[..take]);
        r.consume(take);
        total += take;
        if done {
            return Ok((total, true));
        }
    }
}

/// Checks the input rules and tells CSV from SQLite by the file's first bytes.
pub fn detect_kind(path: &Path) -> Result<DumpKind, InputError> {
    check_input_file(path)?;
    let mut f = open_nofollow(path)?;
    let mut head = [0u8; 16];
    let mut got = 0;
    while got < head.len() {
        match f.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(InputError::file(path, format!("cannot be read: {e}"))),
        }
    }
    Ok(if got == 16 && &head == SQLITE_MAGIC {
        DumpKind::Db
    } else {
        DumpKind::Csv
    })
}

fn open_nofollow(path: &Path) -> Result<File, InputError> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| InputError::file(path, format!("cannot be opened: {e}")))
}

/// Calls `f` for every row of the dump at `path`, in file order. Stops at the first error
/// (an [`InputError`] for a bad input, or whatever `f` returned).
pub fn for_each_row<F>(path: &Path, mut f: F) -> Result<DumpKind>
where
    F: FnMut(Loc, DumpRow) -> Result<()>,
{
    let kind = detect_kind(path)?;
    let mut real = |loc: Loc, row: DumpRow| {
        if row.is_shadow_free() {
            return Ok(());
        }
        f(loc, row)
    };
    match kind {
        DumpKind::Csv => read_csv(path, &mut real)?,
        DumpKind::Db => read_db(path, &mut real)?,
    }
    Ok(kind)
}

/// Every row of the dump at `path`.
pub fn read_rows(path: &Path) -> Result<Vec<DumpRow>> {
    let mut rows = Vec::new();
    for_each_row(path, |_, r| {
        rows.push(r);
        Ok(())
    })?;
    Ok(rows)
}

// ---------------------------------------------------------------------------------------------
// CSV
// ---------------------------------------------------------------------------------------------

fn read_csv(path: &Path, f: &mut dyn FnMut(Loc, DumpRow) -> Result<()>) -> Result<()> {
    let io_err = |e: std::io::Error| InputError::file(path, format!("cannot be read: {e}"));
    let mut r = BufReader::with_capacity(1 << 20, open_nofollow(path)?);
    let mut buf = Vec::new();
    let too_long = |line: u64| {
        InputError::line(
            path,
            line,
            format!(
                "longer than {} MiB without a line end: not a memscope_dump CSV, or a field far \
                 longer than any dump holds",
                MAX_RECORD_BYTES >> 20
            ),
        )
    };
    // The header is short: a first line past a few KiB (an 8 GiB file of zeros) is not one.
    let (n, whole) = read_line_capped(&mut r, &mut buf, 64 << 10).map_err(io_err)?;
    if !whole {
        return Err(InputError::line(
            path,
            1,
            format!("not a memscope_dump CSV: no header line (`{CSV_HEADER}`) in its first 64 KiB"),
        )
        .into());
    }
    if n == 0 {
        return Err(InputError::file(
            path,
            format!("is empty; a memscope_dump CSV starts with the header `{CSV_HEADER}`"),
        )
        .into());
    }
    let header = String::from_utf8_lossy(&buf);
    let header = header.trim_start_matches('\u{feff}').trim();
    if header != CSV_HEADER {
        return Err(InputError::line(
            path,
            1,
            format!(
                "not a memscope_dump CSV: the header must be `{CSV_HEADER}`, found `{}`",
                excerpt(header, 200)
            ),
        )
        .into());
    }
    let mut line_no: u64 = 1;
    let mut start_line: u64 = 0;
    let mut rec = Records::new();
    loop {
        buf.clear();
        let cap = MAX_RECORD_BYTES.saturating_sub(rec.pending_bytes());
        let (n, whole) = read_line_capped(&mut r, &mut buf, cap).map_err(io_err)?;
        if !whole {
            return Err(too_long(if rec.open { start_line } else { line_no + 1 }).into());
        }
        if n == 0 {
            if rec.open {
                return Err(InputError::line(
                    path,
                    start_line,
                    "a quoted field is never closed (the file ends inside it)",
                )
                .into());
            }
            return Ok(());
        }
        line_no += 1;
        let mut line = buf.as_slice();
        if let Some(l) = line.strip_suffix(b"\n") {
            line = l;
        }
        if let Some(l) = line.strip_suffix(b"\r") {
            line = l;
        }
        if !rec.open {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue; // blank line (a trailing newline, say)
            }
            start_line = line_no;
        }
        let done = rec
            .feed(line)
            .map_err(|m| InputError::line(path, start_line, m))?;
        if !done {
            continue;
        }
        let loc = Loc {
            kind: DumpKind::Csv,
            n: start_line,
        };
        let mut fields = Vec::with_capacity(12);
        for (i, raw) in rec.take().into_iter().enumerate() {
            match String::from_utf8(raw) {
                Ok(s) => fields.push(s),
                Err(_) => {
                    return Err(loc
                        .error(
                            path,
                            format!("column {} is not valid UTF-8", column_name(i)),
                        )
                        .into());
                }
            }
        }
        let row = parse_fields(fields, DumpKind::Csv).map_err(|m| loc.error(path, m))?;
        f(loc, row)?;
    }
}

fn column_name(i: usize) -> String {
    match COLUMNS.get(i) {
        Some(c) => format!("\"{c}\""),
        None => format!("{}", i + 1),
    }
}

// ---------------------------------------------------------------------------------------------
// SQLite
// ---------------------------------------------------------------------------------------------

fn read_db(path: &Path, f: &mut dyn FnMut(Loc, DumpRow) -> Result<()>) -> Result<()> {
    let sql_err = |e: rusqlite::Error| {
        InputError::file(path, format!("cannot be read as a SQLite dump: {e}"))
    };
    let conn = open_db_read_only(path).map_err(sql_err)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(sql_err)?;
    let cols: Vec<String> = conn
        .prepare(&format!("PRAGMA table_info({TABLE})"))
        .and_then(|mut st| {
            st.query_map([], |r| r.get::<_, String>(1))?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(sql_err)?;
    if cols.is_empty() {
        return Err(InputError::file(
            path,
            format!("is a SQLite database without a `{TABLE}` table, not a memscope dump"),
        )
        .into());
    }
    if cols != COLUMNS {
        return Err(InputError::file(
            path,
            format!(
                "table `{TABLE}` has the columns {:?}; expected {:?}",
                cols, COLUMNS
            ),
        )
        .into());
    }
    let mut st = conn
        .prepare(&format!("SELECT * FROM {TABLE} ORDER BY rowid"))
        .map_err(sql_err)?;
    let mut rows = st.query([]).map_err(sql_err)?;
    let mut n: u64 = 0;
    while let Some(r) = rows.next().map_err(sql_err)? {
        n += 1;
        let loc = Loc {
            kind: DumpKind::Db,
            n,
        };
        let mut fields = Vec::with_capacity(12);
        for i in 0..COLUMNS.len() {
            let v = r.get_ref(i).map_err(sql_err)?;
            let s = match v {
                ValueRef::Null => String::new(),
                ValueRef::Integer(x) => x.to_string(),
                ValueRef::Real(x) => x.to_string(),
                ValueRef::Text(t) => match std::str::from_utf8(t) {
                    Ok(s) => s.to_string(),
                    Err(_) => {
                        return Err(loc
                            .error(
                                path,
                                format!("column {} is not valid UTF-8", column_name(i)),
                            )
                            .into());
                    }
                },
                ValueRef::Blob(_) => {
                    return Err(loc
                        .error(
                            path,
                            format!("column {} holds a blob, not text", column_name(i)),
                        )
                        .into());
                }
            };
            fields.push(s);
        }
        let row = parse_fields(fields, DumpKind::Db).map_err(|m| loc.error(path, m))?;
        f(loc, row)?;
    }
    Ok(())
}

/// Opens a dump db without changing anything beside it. With a `-wal` file (a writer still
/// running, or killed), SQLite must read it to see the committed rows, so the db is opened
/// read-only the normal way. Without one, it is opened `immutable`, so that SQLite creates no
/// `-wal`/`-shm` files next to the user's input.
fn open_db_read_only(path: &Path) -> rusqlite::Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut wal = path.as_os_str().to_os_string();
    wal.push("-wal");
    if std::fs::symlink_metadata(&wal).is_ok() {
        return Connection::open_with_flags(path, flags);
    }
    let mut uri = String::from("file:");
    for &b in path.as_os_str().as_encoded_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_' | b'.' | b'~') {
            uri.push(b as char);
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push_str("?immutable=1");
    Connection::open_with_flags(uri, flags | OpenFlags::SQLITE_OPEN_URI)
}

// ---------------------------------------------------------------------------------------------
// Columns
// ---------------------------------------------------------------------------------------------

fn parse_fields(fields: Vec<String>, kind: DumpKind) -> Result<DumpRow, String> {
    let found = fields.len();
    let [
        id,
        event,
        event_type,
        name,
        ts,
        pid,
        tid,
        device,
        ptr,
        attr_text,
        python_stack,
        c_stack,
    ]: [String; 12] = fields.try_into().map_err(|_| {
        format!("expected 12 comma-separated fields, found {found} (an unquoted comma or a missing field?)")
    })?;
    if event.is_empty() {
        return Err("the Event column is empty".into());
    }
    let event_type = match event_type.as_str() {
        "acl init" => "ACL_INIT".to_string(),
        "acl fini" => "ACL_FINI".to_string(),
        _ => event_type,
    };
    let name = match kind {
        DumpKind::Db => unquote(&name),
        // msMemScope wraps a name in quotes again for each device file it copies it to: the
        // CSV layer took one pair, or (an even count) none; what is left is all wrapping.
        DumpKind::Csv if name.len() >= 2 && name.starts_with('"') && name.ends_with('"') => {
            name.trim_matches('"').to_string()
        }
        DumpKind::Csv => name,
    };
    Ok(DumpRow {
        id: number(&id, "ID")?,
        event,
        event_type,
        name,
        ts_ns: number(&ts, "Timestamp(ns)")?,
        pid: number(&pid, "Process Id")?,
        tid: number(&tid, "Thread Id")?,
        device: parse_device(&device)?,
        ptr: parse_ptr(&ptr)?,
        attr: parse_attr(&attr_text, kind)?,
        python_stack,
        c_stack,
    })
}

fn number<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(v) = t.parse() {
            return Ok(v);
        }
        return Err(format!("{what} '{}' is out of range", excerpt(s, 40)));
    }
    Err(format!(
        "{what} '{}' is not a non-negative integer",
        excerpt(s, 40)
    ))
}

/// The db holds the Name as msMemScope formats it, an MSTX message in `"…"`.
fn unquote(s: &str) -> String {
    match s.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        Some(inner) if s.len() >= 2 => inner.replace("\"\"", "\""),
        _ => s.to_string(),
    }
}

fn parse_device(s: &str) -> Result<DeviceKey, String> {
    match s.trim() {
        "N/A" => Ok(DeviceKey::NotApplicable),
        "cpu" | "host" => Ok(DeviceKey::Cpu),
        t if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => match t.parse::<u32>() {
            Ok(crate::settings::UNKNOWN_DEVICE_ID) => Ok(DeviceKey::NotApplicable),
            Ok(crate::events::hal::DEVICE_CPU) => Ok(DeviceKey::Cpu),
            Ok(n) => Ok(DeviceKey::Npu(n)),
            Err(_) => Err(format!("Device Id '{}' is out of range", excerpt(s, 40))),
        },
        _ => Err(format!(
            "Device Id '{}' is not N/A, cpu, host or a device number",
            excerpt(s, 40)
        )),
    }
}

/// `N/A`, `0x<hex>`, or a decimal address (2025-04 layout).
pub fn parse_ptr(s: &str) -> Result<Option<u64>, String> {
    let t = s.trim();
    if t == "N/A" {
        return Ok(None);
    }
    let bad = || {
        format!(
            "Ptr '{}' is not N/A, 0x<hex> or a decimal address",
            excerpt(s, 40)
        )
    };
    if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        return u64::from_str_radix(hex, 16).map(Some).map_err(|_| bad());
    }
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t.parse().map(Some).map_err(|_| bad());
    }
    Err(bad())
}

fn parse_attr(s: &str, kind: DumpKind) -> Result<Vec<(String, String)>, String> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    let braces = |s: &str| -> Option<Vec<(String, String)>> {
        s.strip_prefix('{')
            .and_then(|r| r.strip_suffix('}'))
            .map(attr::split_attr)
    };
    match kind {
        DumpKind::Csv => braces(s).ok_or_else(|| {
            format!(
                "Attr '{}' is neither empty nor {{key:value,...}}",
                excerpt(s, 80)
            )
        }),
        DumpKind::Db => match attr::parse_json_object(s) {
            Ok(pairs) => Ok(pairs),
            // Not JSON: accept the CSV spelling too, as a db written by hand might use it.
            Err(e) => match braces(s) {
                Some(pairs) if !s.starts_with("{\"") => Ok(pairs),
                _ => Err(format!(
                    "Attr '{}' is not a JSON object: {e}",
                    excerpt(s, 80)
                )),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::records::tests::records;
    use super::*;

    /// msMemScope wraps a name in one more pair of quotes per device file it copies it to.
    #[test]
    fn names_quoted_again_and_again_read_as_the_name() {
        for k in 1..=5 {
            let q = "\"".repeat(k);
            let line = format!("2,MSTX,Range_start,{q}step start{q},1,7,7,N/A,N/A,,,");
            let rec = records(&[&line]).unwrap_or_else(|e| panic!("{k} pairs: {e}"));
            let fields: Vec<String> = rec[0].clone();
            assert_eq!(fields.len(), 12, "{k} pairs: {fields:?}");
            let row = parse_fields(fields, DumpKind::Csv).unwrap();
            assert_eq!(row.name, "step start", "{k} pairs");
        }
        // Standard CSV is read as before: empty, a quote, quotes inside.
        assert_eq!(records(&["\"\",x"]).unwrap(), vec![vec!["", "x"]]);
        assert_eq!(records(&["\"\"\"\",x"]).unwrap(), vec![vec!["\"", "x"]]);
        assert_eq!(
            records(&["\"\"\"a\"\" b\",x"]).unwrap(),
            vec![vec!["\"a\" b", "x"]]
        );
    }

    fn fields(line: &str) -> Vec<String> {
        records(&[line]).unwrap().remove(0)
    }

    #[test]
    fn parses_current_and_old_layouts() {
        let r = parse_fields(
            fields(
                "3,MALLOC,PTA,N/A,3,123,1234,0,0x0000000000003039,\"{allocation_id:1,addr:0x0000000000003039,size:10,used:10,total:10}\",,",
            ),
            DumpKind::Csv,
        )
        .unwrap();
        assert_eq!(r.id, 3);
        assert_eq!(r.device, DeviceKey::Npu(0));
        assert_eq!(r.ptr, Some(0x3039));
        assert_eq!(r.attr("size"), Some("10"));
        assert_eq!(r.attr("nope"), None);
        let old = parse_fields(
            fields("1,SYSTEM,acl init,N/A,1746006014162153,2523740,2523740,N/A,N/A,,,"),
            DumpKind::Csv,
        )
        .unwrap();
        assert_eq!(old.event_type, "ACL_INIT");
        assert_eq!(old.device, DeviceKey::NotApplicable);
        let old = parse_fields(
            fields(
                "5,MALLOC,HAL,N/A,1746006014362653,2523740,2523740,host,20617990504448,\"{addr:20617990504448,size:6356992,owner:,MID:7}\",,",
            ),
            DumpKind::Csv,
        )
        .unwrap();
        assert_eq!(old.device, DeviceKey::Cpu);
        assert_eq!(old.ptr, Some(20617990504448));
        assert_eq!(old.attr("MID"), Some("7"));
        assert_eq!(old.attr("owner"), Some(""));
    }

    #[test]
    fn column_errors_say_what_is_wrong() {
        let base = [
            "1", "MALLOC", "HAL", "N/A", "5", "7", "8", "0", "0x10", "", "", "",
        ];
        let with = |i: usize, v: &str| {
            let mut f: Vec<String> = base.iter().map(|s| s.to_string()).collect();
            f[i] = v.to_string();
            parse_fields(f, DumpKind::Csv).unwrap_err()
        };
        assert!(with(0, "x1").contains("ID 'x1'"));
        assert!(with(0, "-1").contains("non-negative"));
        assert!(with(1, "").contains("Event column is empty"));
        assert!(with(4, "1.5").contains("Timestamp(ns) '1.5'"));
        assert!(with(5, "99999999999").contains("Process Id '99999999999' is out of range"));
        assert!(with(6, "").contains("Thread Id"));
        assert!(with(7, "gpu").contains("Device Id 'gpu'"));
        assert!(with(8, "0xZZ").contains("Ptr '0xZZ'"));
        assert!(with(8, "").contains("Ptr ''"));
        assert!(with(9, "size:1").contains("Attr 'size:1'"));
        let short: Vec<String> = base[..11].iter().map(|s| s.to_string()).collect();
        assert!(
            parse_fields(short, DumpKind::Csv)
                .unwrap_err()
                .contains("expected 12 comma-separated fields, found 11")
        );
        assert_eq!(parse_device("9999").unwrap(), DeviceKey::NotApplicable);
        assert_eq!(parse_device("10000").unwrap(), DeviceKey::Cpu);
        assert_eq!(parse_device("cpu").unwrap(), DeviceKey::Cpu);
        assert_eq!(parse_ptr("0X1f").unwrap(), Some(0x1f));
    }

    #[test]
    fn db_names_and_attrs() {
        assert_eq!(unquote("\"step start\""), "step start");
        assert_eq!(unquote("\"a\"\"b\""), "a\"b");
        assert_eq!(unquote("\""), "\"");
        assert_eq!(unquote("N/A"), "N/A");
        assert_eq!(
            parse_attr(r#"{"size":"10","owner":""}"#, DumpKind::Db).unwrap(),
            vec![
                ("size".to_string(), "10".to_string()),
                ("owner".to_string(), String::new())
            ]
        );
        assert_eq!(parse_attr("{}", DumpKind::Db).unwrap(), vec![]);
        assert_eq!(
            parse_attr("{size:10}", DumpKind::Db).unwrap(),
            vec![("size".to_string(), "10".to_string())]
        );
        assert!(parse_attr(r#"{"size":}"#, DumpKind::Db).is_err());
        assert!(parse_attr("size", DumpKind::Db).is_err());
    }
}
