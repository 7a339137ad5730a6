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

/// A byte count as people read it, exact bytes first: `12582912 bytes (12.00 MiB)`; under
/// 1 KiB the count alone (`512 bytes`).
pub fn bytes(n: u64) -> String {
    match human_units(n) {
        Some(h) => format!("{n} bytes ({h})"),
        None => format!("{n} bytes"),
    }
}

/// A signed difference in bytes, the sign always written: `+3072 bytes (+3.00 KiB)`,
/// `-512 bytes`, `0 bytes`.
pub fn signed_bytes(n: i64) -> String {
    let sign = match n {
        1.. => "+",
        0 => "",
        _ => "-",
    };
    let abs = n.unsigned_abs();
    match human_units(abs) {
        Some(h) => format!("{sign}{abs} bytes ({sign}{h})"),
        None => format!("{sign}{abs} bytes"),
    }
}

/// `n` in KiB, MiB, GiB or TiB with two decimals; `None` under 1 KiB.
fn human_units(n: u64) -> Option<String> {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = None;
    for u in UNITS {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = Some(u);
    }
    unit.map(|u| format!("{v:.2} {u}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_carry_exact_count_and_human_units() {
        assert_eq!(bytes(0), "0 bytes");
        assert_eq!(bytes(1023), "1023 bytes");
        assert_eq!(bytes(1024), "1024 bytes (1.00 KiB)");
        assert_eq!(bytes(12_582_912), "12582912 bytes (12.00 MiB)");
        assert_eq!(bytes(27_262_976), "27262976 bytes (26.00 MiB)");
        assert_eq!(bytes(3 << 30), "3221225472 bytes (3.00 GiB)");
        assert_eq!(bytes(5 << 40), "5497558138880 bytes (5.00 TiB)");
        assert_eq!(bytes(5 << 50), "5629499534213120 bytes (5120.00 TiB)");
        assert_eq!(signed_bytes(3072), "+3072 bytes (+3.00 KiB)");
        assert_eq!(signed_bytes(-524_800), "-524800 bytes (-512.50 KiB)");
        assert_eq!(signed_bytes(-7), "-7 bytes");
        assert_eq!(signed_bytes(0), "0 bytes");
        assert_eq!(
            signed_bytes(i64::MIN),
            "-9223372036854775808 bytes (-8388608.00 TiB)"
        );
    }
}
