//! `memscope_dump_<ts>.db` (`--format=db`): the same rows as the CSV, in an SQLite table that
//! MindStudio Insight reads.
//!
//! Layout (msMemScope's): table `memscope_dump` with the twelve quoted CSV column names, Attr
//! stored as a JSON object whose values are all strings, WAL journal, 5 s busy timeout.
//!
//! Rows are inserted inside a transaction that is committed every [`COMMIT_EVERY_ROWS`] rows
//! and whenever the owner flushes (the tracing session does that every 100 ms). A committed
//! transaction is in the WAL file, so a tracer killed with SIGKILL leaves a database that
//! SQLite opens normally and that holds every row up to the last commit.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result};
use rusqlite::{Connection, params};

use super::{Row, attr, fsutil};

/// Name of the dump table.
pub const TABLE: &str = "memscope_dump";

/// The columns of [`TABLE`], in order (the CSV header's names).
pub const COLUMNS: [&str; 12] = [
    "ID",
    "Event",
    "Event Type",
    "Name",
    "Timestamp(ns)",
    "Process Id",
    "Thread Id",
    "Device Id",
    "Ptr",
    "Attr",
    "Call Stack(Python)",
    "Call Stack(C)",
];

/// The table definition, exactly as msMemScope creates it.
pub const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS memscope_dump (\"ID\" INTEGER, \
\"Event\" TEXT, \"Event Type\" TEXT, \"Name\" TEXT, \"Timestamp(ns)\" INTEGER, \
\"Process Id\" INTEGER, \"Thread Id\" INTEGER, \"Device Id\" TEXT, \"Ptr\" TEXT, \"Attr\" TEXT, \
\"Call Stack(Python)\" TEXT, \"Call Stack(C)\" TEXT)";

const INSERT: &str =
    "INSERT INTO memscope_dump VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)";

/// A transaction is committed after this many rows even without a flush.
pub const COMMIT_EVERY_ROWS: usize = 4096;

/// Busy timeout set on the connection (msMemScope's `sqlite3_busy_timeout(5000)`).
pub const BUSY_TIMEOUT: Duration = Duration::from_millis(5000);

/// One open dump database.
pub struct DbWriter {
    path: PathBuf,
    /// Keeps open the descriptor SQLite reaches the file (and its -wal) through.
    _dir: fsutil::Dir,
    conn: Connection,
    /// Rows inserted since the last commit (a transaction is open when > 0).
    pending: usize,
    committed: u64,
    /// Rows of transactions that failed (rolled back), not yet taken by the owner.
    lost: u64,
}

impl DbWriter {
    /// Creates the new database file `name` in `dir` (mode 0640, never through a symlink or
    /// over an existing file) with the dump table.
    pub fn create_in(dir: &fsutil::Dir, name: &str) -> Result<Self> {
        let (path, file) = dir.create_file(name)?;
        drop(file);
        // SQLite takes a path: one through our descriptor of `dir` reaches that very
        // directory (and puts the -wal and -shm files next to the db) even if its path
        // has been swapped for a symlink since.
        let conn = Connection::open(dir.fd_path(name))
            .with_context(|| format!("cannot open SQLite database {}", path.display()))?;
        let path = path.as_path();
        let setup = || -> rusqlite::Result<()> {
            conn.busy_timeout(BUSY_TIMEOUT)?;
            let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(rusqlite::Error::InvalidQuery);
            }
            // In WAL mode NORMAL keeps every commit across a crash of this process; only a
            // power loss can take back the last commits.
            conn.execute_batch("PRAGMA synchronous=NORMAL;")?;
            conn.execute_batch(CREATE_TABLE)?;
            Ok(())
        };
        setup().with_context(|| format!("cannot set up SQLite database {}", path.display()))?;
        Ok(DbWriter {
            path: path.to_path_buf(),
            _dir: dir.clone(),
            conn,
            pending: 0,
            committed: 0,
            lost: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Rows committed so far.
    pub fn committed(&self) -> u64 {
        self.committed
    }

    /// Rows lost to failed transactions since the last call.
    pub fn take_lost(&mut self) -> u64 {
        std::mem::take(&mut self.lost)
    }

    /// A write failed: the open transaction (SQLite may have rolled it back already) is
    /// given up and its rows counted as lost; the database keeps every committed row.
    fn abandon(&mut self) {
        let _ = self.conn.execute_batch("ROLLBACK");
        self.lost += self.pending as u64;
        self.pending = 0;
    }

    /// Inserts one row (inside the open transaction; commits every [`COMMIT_EVERY_ROWS`]).
    /// On failure the open transaction's rows are lost (see [`take_lost`](Self::take_lost)).
    pub fn insert(&mut self, id: u64, row: &Row) -> Result<()> {
        let r = self.try_insert(id, row);
        if r.is_err() {
            self.abandon();
        }
        r
    }

    fn try_insert(&mut self, id: u64, row: &Row) -> Result<()> {
        if self.pending == 0 {
            self.conn
                .execute_batch("BEGIN")
                .with_context(|| format!("cannot write {}", self.path.display()))?;
        }
        // Counted before the insert: a failed one is lost with its transaction.
        let ptr = match row.ptr {
            Some(p) => format!("0x{p:016x}"),
            None => "N/A".to_string(),
        };
        let result = self.conn.prepare_cached(INSERT).and_then(|mut st| {
            st.execute(params![
                i64::try_from(id).unwrap_or(i64::MAX),
                row.event,
                row.event_type,
                row.name,
                i64::try_from(row.ts_ns).unwrap_or(i64::MAX),
                i64::from(row.pid),
                i64::from(row.tid),
                row.device.to_string(),
                ptr,
                attr::attr_text_to_json(&row.attr),
                row.py_stack.as_deref().unwrap_or(""),
                row.c_stack.as_deref().unwrap_or(""),
            ])
        });
        self.pending += 1;
        result.with_context(|| format!("cannot write {}", self.path.display()))?;
        if self.pending >= COMMIT_EVERY_ROWS {
            self.try_commit()?;
        }
        Ok(())
    }

    /// Commits the open transaction, if any (its rows are lost when that fails).
    pub fn commit(&mut self) -> Result<()> {
        let r = self.try_commit();
        if r.is_err() {
            self.abandon();
        }
        r
    }

    fn try_commit(&mut self) -> Result<()> {
        if self.pending == 0 {
            return Ok(());
        }
        self.conn
            .execute_batch("COMMIT")
            .with_context(|| format!("cannot commit {}", self.path.display()))?;
        self.committed += self.pending as u64;
        self.pending = 0;
        Ok(())
    }

    /// Commits and folds the WAL back into the database file (msMemScope's
    /// `PRAGMA wal_checkpoint(FULL)` on flush at the end).
    pub fn finish(&mut self) -> Result<()> {
        self.commit()?;
        self.conn
            .query_row("PRAGMA wal_checkpoint(FULL)", [], |_| Ok(()))
            .with_context(|| format!("cannot checkpoint {}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::DeviceKey;

    #[test]
    fn writes_rows_with_json_attr_and_commits_in_batches() {
        let dir = std::env::temp_dir().join(format!("memscope-db-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("memscope_dump_1.db");
        let out = fsutil::Dir::open_root(&dir).unwrap();
        let mut w = DbWriter::create_in(&out, "memscope_dump_1.db").unwrap();
        let row = Row {
            event: "MALLOC",
            event_type: "HAL",
            name: "N/A".into(),
            ts_ns: 1_700_000_000_000_000_000,
            pid: 7,
            tid: 8,
            device: DeviceKey::Npu(0),
            ptr: Some(0x3039),
            size: None,
            attr: "allocation_id:1,addr:0x0000000000003039,size:10".into(),
            c_stack: None,
            py_stack: None,
        };
        for id in 0..(COMMIT_EVERY_ROWS as u64 + 3) {
            w.insert(id, &row).unwrap();
        }
        assert_eq!(w.committed(), COMMIT_EVERY_ROWS as u64);
        // Another connection sees only committed rows.
        let other = Connection::open(&path).unwrap();
        let n: i64 = other
            .query_row("SELECT COUNT(*) FROM memscope_dump", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, COMMIT_EVERY_ROWS as i64);
        w.finish().unwrap();
        let n: i64 = other
            .query_row("SELECT COUNT(*) FROM memscope_dump", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, COMMIT_EVERY_ROWS as i64 + 3);
        let (attr, ptr, dev, ts): (String, String, String, i64) = other
            .query_row(
                "SELECT \"Attr\", \"Ptr\", \"Device Id\", \"Timestamp(ns)\" FROM memscope_dump LIMIT 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap();
        assert_eq!(
            attr,
            r#"{"allocation_id":"1","addr":"0x0000000000003039","size":"10"}"#
        );
        assert_eq!(ptr, "0x0000000000003039");
        assert_eq!(dev, "0");
        assert_eq!(ts, 1_700_000_000_000_000_000);
        let mode: String = other
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let cols: Vec<(String, String)> = other
            .prepare("PRAGMA table_info(memscope_dump)")
            .unwrap()
            .query_map([], |r| Ok((r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let names: Vec<&str> = cols.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(names, COLUMNS);
        assert_eq!(cols[0].1, "INTEGER");
        assert_eq!(cols[4].1, "INTEGER");
        assert_eq!(cols[9].1, "TEXT");
        assert!(
            DbWriter::create_in(&out, "memscope_dump_1.db").is_err(),
            "never reuses a file"
        );
        drop(w);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
