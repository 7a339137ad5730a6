//! The current device of each thread and the `--device` filter.

use super::{ProcessState, TrackOptions};
use crate::events::hal::DEVICE_CPU;
use crate::output::DeviceKey;

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
