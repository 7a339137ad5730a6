//! One CSV file written through a buffer of whole lines: what cannot be written yet waits
//! (bounded), so a failing disk loses whole rows, never half of one.

use super::CSV_HEADER;
use crate::state::Row;
use std::fs::File;

/// Bytes of formatted rows kept before they are written to the file.
pub(super) const CSV_BUFFER: usize = 256 * 1024;

/// Bytes of rows one CSV file keeps in memory while its writes fail (a full disk): written
/// when space returns; past this the oldest waiting rows are dropped, counted as lost.
pub const MAX_WAITING_BYTES: usize = 64 << 20;

/// A CSV file (created on its first write) and its write buffer. Rows are formatted straight
/// into the buffer (no per-row line copy, as a `BufWriter` would need); the buffer is written
/// out when it passes [`CSV_BUFFER`] and on `flush`. The file only ever holds whole rows: a
/// write cut short (no space left) is truncated back to the last complete row and the rows
/// stay in the buffer for the next try.
pub(super) struct CsvFile {
    pub(super) file: Option<File>,
    /// Bytes of whole rows in the file.
    pub(super) written: u64,
    /// The header (while not yet in the file), then rows.
    pub(super) buf: Vec<u8>,
    /// Rows in `buf`.
    pub(super) buf_rows: u64,
    /// Length of the header at the start of `buf` (0 once written).
    pub(super) header_len: usize,
}

impl CsvFile {
    pub(super) fn new() -> Self {
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

    pub(super) fn push(&mut self, id: u64, row: &Row) {
        row.format_into(id, &mut self.buf);
        self.buf_rows += 1;
    }

    /// Writes the buffer after the whole rows already in the file. A write cut short keeps
    /// the complete rows it got out, cuts the file back to them, and leaves the rest waiting.
    pub(super) fn write_out(&mut self) -> std::io::Result<()> {
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
    pub(super) fn drop_waiting(&mut self) -> u64 {
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
pub(super) fn whole_lines(bytes: &[u8]) -> (usize, u64) {
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
