//! Output files in msMemScope's layout:
//! `<out>/msmemscope_<pid>_<ts>_ascend/{config.json, device_<id>/dump/memscope_dump_<ts>.csv}`
//! (`.db` with `--format=db`).

pub mod attr;
pub mod config_json;
pub mod csv;
pub mod db;
pub mod fsutil;

pub use csv::{ProcessOutput, Row};

use std::fmt;

/// The "Device Id" of a row, and which `device_*` directory it lands in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceKey {
    Npu(u32),
    Cpu,
    /// Not tied to a device (SYSTEM rows, marks on a thread that never set a device):
    /// copied into every device file of the process.
    NotApplicable,
}

impl DeviceKey {
    pub fn from_id(id: u32) -> Self {
        if id == crate::events::hal::DEVICE_CPU {
            DeviceKey::Cpu
        } else {
            DeviceKey::Npu(id)
        }
    }

    /// Directory name under the process directory.
    pub fn dir_name(&self) -> Option<String> {
        match self {
            DeviceKey::Npu(n) => Some(format!("device_{n}")),
            DeviceKey::Cpu => Some("device_cpu".to_string()),
            DeviceKey::NotApplicable => None,
        }
    }
}

impl fmt::Display for DeviceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceKey::Npu(n) => write!(f, "{n}"),
            DeviceKey::Cpu => f.write_str("cpu"),
            DeviceKey::NotApplicable => f.write_str("N/A"),
        }
    }
}

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
