//! Console messages on stderr (stdout belongs to the traced program), with a level filter.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::settings::LogLevel;

static LEVEL: AtomicU8 = AtomicU8::new(1);

fn rank(level: LogLevel) -> u8 {
    match level {
        LogLevel::Debug => 0,
        LogLevel::Info => 1,
        LogLevel::Warning => 2,
        LogLevel::Error => 3,
    }
}

pub fn set_level(level: LogLevel) {
    LEVEL.store(rank(level), Ordering::Relaxed);
}

pub fn enabled(level: LogLevel) -> bool {
    rank(level) >= LEVEL.load(Ordering::Relaxed)
}

fn emit(level: LogLevel, tag: &str, msg: &str) {
    if enabled(level) {
        line(&format!("[memscope-bpf] {tag}{msg}"));
    }
}

/// Writes one line to stderr, or nothing when stderr is gone (a closed pipe or terminal, a
/// full device): a message must never stop the tracer (`eprintln!` panics then), and the
/// run's files are written whatever happened to the console.
pub fn line(text: &str) {
    use std::io::Write;
    let mut buf = String::with_capacity(text.len() + 1);
    buf.push_str(text);
    buf.push('\n');
    let _ = std::io::stderr().lock().write_all(buf.as_bytes());
}

/// [`line`] on stdout (help text): a reader that went away is no error of ours.
pub fn stdout_line(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

pub fn debug(msg: &str) {
    emit(LogLevel::Debug, "debug: ", msg);
}

pub fn info(msg: &str) {
    emit(LogLevel::Info, "", msg);
}

pub fn warn(msg: &str) {
    emit(LogLevel::Warning, "warning: ", msg);
}

pub fn error(msg: &str) {
    emit(LogLevel::Error, "error: ", msg);
}

/// A user's text for a one-line message: control characters escaped, bytes that are not UTF-8
/// as `\xNN`.
pub fn shown_os(s: &OsStr) -> String {
    let mut out = String::new();
    for chunk in s.as_bytes().utf8_chunks() {
        for c in chunk.valid().chars() {
            match c.is_control() {
                true => out.extend(c.escape_default()),
                false => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

pub fn shown(s: &str) -> String {
    shown_os(OsStr::new(s))
}
