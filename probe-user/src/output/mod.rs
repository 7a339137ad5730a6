//! Output files in msMemScope's layout:
//! `<out>/msmemscope_<pid>_<ts>_ascend/{config.json, device_<id>/dump/memscope_dump_<ts>.csv}`
//! (`.db` with `--format=db`).
//!
//! Stage 5, the writers: rows (`state::Row`, re-exported here) to CSV ([`csv`]) or SQLite
//! ([`db`]), the Attr text as JSON ([`attr`]), files created without clobbering ([`fsutil`]),
//! the leak report of the blocks still live when a process ends ([`leaks`]), and the files of
//! the analyses (`decompose.rs`: `Decompose::write_csv`), and msMemScope's rules for output
//! paths, checked when the command line is read ([`paths`]), and PyTorch memory snapshots of
//! the rows written ([`snapshot`]).
//!
//! Uses `state` (rows, live blocks), `analysis` (what to write), `settings`, `digits` and `log`.
//! Never `trace`, `events`, `session`, `report`, `agent`, nor the front end `cli`: config.json
//! records the options `cli` hands it as a [`config_json::Recorded`] (tests/layout.rs checks it).

pub mod attr;
pub mod config_json;
pub mod csv;
pub mod db;
mod decompose;
pub mod fsutil;
pub mod leaks;
pub mod paths;
pub mod snapshot;

pub use crate::state::{DeviceKey, Row};
pub use csv::ProcessOutput;

/// `%Y%m%d%H%M%S` in local time, as msMemScope names files and directories.
pub fn local_timestamp() -> String {
    // SAFETY: time(NULL) and localtime_r with valid out-pointers.
    unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&now, &mut tm);
        format!(
            "{:04}{:02}{:02}{:02}{:02}{:02}",
            tm.tm_year + 1900,
            tm.tm_mon + 1,
            tm.tm_mday,
            tm.tm_hour,
            tm.tm_min,
            tm.tm_sec
        )
    }
}
