//! Vendor libraries that need more than a symbol lookup: the op-API libraries (every
//! operator function through one link) and torch_npu (its hidden allocator function).

use super::Planner;
use super::files::FileId;
use crate::trace::aclnn;
use crate::trace::bpf::Bpf;
use crate::trace::placement;
use crate::trace::probes::{PROBES, ProbeId};
use crate::trace::torch_npu;
use memscope_symbols::ElfObject;
use std::path::Path;

impl Planner {
    /// Probes every operator function the op library `host` exports, through one link for
    /// all of them; returns how many.
    pub(super) fn attach_op_api(
        &mut self,
        bpf: &mut Bpf,
        host: &Path,
        shown: &Path,
        obj: &ElfObject,
    ) -> usize {
        let mut points = Vec::new();
        let mut moved = Vec::new();
        for name in obj.exported.iter().filter(|n| aclnn::is_op_function(n)) {
            let (Some(sym), Some(index)) = (obj.function(name), aclnn::register(name)) else {
                continue;
            };
            let cookie = ProbeId::AclnnOp as u64 | (index as u64) << probe_common::COOKIE_HI_SHIFT;
            // Placed like the vendor functions: an operator function that opens with an
            // instruction the kernel single-steps (`test` in the simulated `aclnnAdd`) would
            // cost ~10 µs a call on the thread that runs the operators, ~1 µs once moved.
            let place = placement::choose(host, sym.file_offset, sym.size);
            if place.moved() {
                moved.push(format!("{name} {}", place.describe()));
            }
            points.push((sym.file_offset + place.offset, cookie));
        }
        if points.is_empty() {
            return 0;
        }
        match bpf.attach_many(host, &points, true, self.scope) {
            Ok(()) => {
                self.debug.push(format!(
                    "probe {} operator functions (aclnn*) of {}, {} of them moved{}{}{}",
                    points.len(),
                    shown.display(),
                    moved.len(),
                    if moved.is_empty() { "" } else { ": " },
                    moved[..moved.len().min(4)].join("; "),
                    if moved.len() > 4 { "; ..." } else { "" }
                ));
                points.len()
            }
            Err(e) => {
                self.warnings.push(format!("{e:#}"));
                0
            }
        }
    }

    /// Probes torch_npu's allocator report in `host` when the code is recognised; otherwise
    /// says why, once per file, and leaves the library alone (HAL is still traced).
    pub(super) fn attach_torch_npu(
        &mut self,
        bpf: &mut Bpf,
        host: &Path,
        shown: &Path,
        identity: FileId,
    ) -> Option<&'static str> {
        if !self.torch_npu_sites.contains_key(&identity) {
            let site = torch_npu::locate_cached(
                host,
                (identity.dev, identity.ino, identity.size, identity.mtime_ns),
            )
            .map_err(|e| format!("{e:#}"));
            match &site {
                Ok(s) => self.debug.push(format!(
                    "torch_npu {} at {}: allocator report at +{:#x} ({}, {} callers), probed {}",
                    s.version.as_deref().unwrap_or("(version unknown)"),
                    shown.display(),
                    s.file_offset,
                    s.layout,
                    s.callers,
                    match &s.probes {
                        torch_npu::Probes::Entry => "at its entry".to_owned(),
                        torch_npu::Probes::CallSites { sites, block_free } => format!(
                            "at {} call sites ({block_free} BLOCK_FREE-only left out)",
                            sites.len()
                        ),
                    }
                )),
                Err(why) => self.warn_once(format!(
                    "{}: torch_npu's caching allocator not recognised ({why}); its blocks \
                     (PTA rows) will not be traced, HAL still is",
                    shown.display()
                )),
            }
            self.torch_npu_sites.insert(identity, site);
        }
        let site = self.torch_npu_sites.get(&identity)?.as_ref().ok()?.clone();
        let id = match site.layout {
            torch_npu::UsageLayout::Original => ProbeId::PtaUsageOriginal,
            torch_npu::UsageLayout::WithComponent => ProbeId::PtaUsageWithComponent,
        };
        let def = PROBES.iter().find(|p| p.id == id)?;
        // At the call sites that may report a MALLOC or FREE (the BLOCK_FREE ones never trap),
        // else at the entry.
        let points: Vec<(u64, u64)> = match &site.probes {
            torch_npu::Probes::CallSites { sites, .. } => {
                torch_npu::register_call_sites(identity.ino, sites, site.file_offset);
                sites.iter().map(|at| (*at, id as u64)).collect()
            }
            torch_npu::Probes::Entry => vec![(site.file_offset, id as u64)],
        };
        match bpf.attach_many(host, &points, false, self.scope) {
            Ok(()) => Some(def.symbol),
            Err(e) => {
                self.warnings.push(format!("{e:#}"));
                None
            }
        }
    }
}
