//! The current device of each thread and the `--device` filter.

use super::{ProcessState, TrackOptions};
use crate::events::hal::DEVICE_CPU;

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
        if id == DEVICE_CPU {
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

impl std::fmt::Display for DeviceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceKey::Npu(n) => write!(f, "{n}"),
            DeviceKey::Cpu => f.write_str("cpu"),
            DeviceKey::NotApplicable => f.write_str("N/A"),
        }
    }
}

impl ProcessState {
    pub(super) fn wants_device(&self, opts: &TrackOptions, device: u32) -> bool {
        if device == DEVICE_CPU {
            opts.devices.wants_cpu()
        } else {
            opts.devices.wants_npu(device)
        }
    }
}

impl ProcessState {
    /// The device an mstx row is written on: the thread's current device (aclrtSetDevice),
    /// or `None` when `--device` leaves that device out.
    pub(super) fn mstx_device(&mut self, tid: u32, opts: &TrackOptions) -> Option<DeviceKey> {
        match self.thread_device.get(&tid) {
            Some(d) if !opts.devices.wants_npu(*d) => {
                self.stats.filtered += 1;
                None
            }
            Some(d) => Some(DeviceKey::Npu(*d)),
            None => Some(DeviceKey::NotApplicable),
        }
    }
}

impl ProcessState {
    /// The device of a framework pool call that names none: the thread's current device, else
    /// the lowest device any thread of the process set (MindSpore allocates from its own
    /// threads, which may never call aclrtSetDevice), else 0.
    pub(super) fn pool_device(&self, tid: u32) -> u32 {
        self.thread_device
            .get(&tid)
            .or_else(|| self.thread_device.values().min())
            .copied()
            .unwrap_or(0)
    }

    /// Counts the driver memory mapped before the attach on `device`, the pool's, once.
    pub(super) fn take_driver_before(&mut self, device: u32) {
        let before = std::mem::take(&mut self.driver_before);
        if before > 0 {
            *self.used.entry(device).or_default() += before;
        }
    }

    /// Counts the driver memory MindSpore's pool took before a `--pid` attach without VMM,
    /// once: its own reserved bytes (read at this call's return, after the driver calls it
    /// made on the way were seen) less the driver memory seen on `device`.
    pub(super) fn take_pool_reserved(&mut self, device: u32, pool_reserved: Option<u64>) {
        if let Some(reserved) = pool_reserved.filter(|_| self.pool_reserved_unseen) {
            self.pool_reserved_unseen = false;
            let unseen = reserved.saturating_sub(self.driver_bytes(device));
            if unseen > 0 {
                *self.used.entry(device).or_default() += unseen;
            }
        }
    }

    /// The driver memory the process holds on `device` (HAL blocks and physical handles).
    pub(super) fn driver_bytes(&self, device: u32) -> u64 {
        self.used.get(&device).copied().unwrap_or(0)
    }
}
