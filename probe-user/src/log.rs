//! Console messages on stderr (stdout belongs to the traced program), with a level filter.

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
        eprintln!("[memscope-bpf] {tag}{msg}");
    }
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
