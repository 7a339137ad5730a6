//! Step-based analyses of the framework pools (spec §6.1 and §6.3): blocks that outlive the
//! step after the one they were allocated in, and how much a pool's allocated memory swings
//! within a step ("gap").

use std::collections::BTreeMap;

use crate::events::pools::PoolKind;

const MIB: f64 = 1024.0 * 1024.0;

/// A pool block live at the end of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    pub pool: PoolKind,
    pub device: u32,
    pub addr: u64,
    pub size: u64,
    pub alloc_step: u32,
    /// Kernel launches seen before the allocation (0 until launches are traced).
    pub kernel_index: u64,
}

/// Blocks allocated in step k >= 2 and still live at the end of a step S > k. The table is
/// cumulative, as msMemScope's: a block reported once stays reported even if freed later.
#[derive(Debug, Default)]
pub struct StepLeaks {
    found: BTreeMap<(u32, u32, u64, PoolKind), LiveBlock>,
}

/// The step-leak rule (msMemScope's): a block of an analysed pool allocated in step k >= 2
/// that is still live at the end of a step after k. Step 1 warms the caches up; a block must
/// have survived a whole later step.
pub fn outlives_its_step(pool: PoolKind, alloc_step: u32, ended: u32) -> bool {
    pool.analysed() && alloc_step > 1 && ended > alloc_step
}

impl StepLeaks {
    /// Checks the live blocks at the end of step `ended`; returns one message per finding.
    pub fn on_step_end(&mut self, ended: u32, live: &[LiveBlock]) -> Vec<String> {
        let mut msgs = Vec::new();
        for b in live {
            if !outlives_its_step(b.pool, b.alloc_step, ended) {
                continue;
            }
            msgs.push(format!(
                "[npu {}][step {ended}]: ptr: 0x{:x} has last for {} steps. Please check if there is leaks in {}.",
                b.device,
                b.addr,
                ended - b.alloc_step,
                b.pool.display_name()
            ));
            self.found
                .insert((b.device, b.alloc_step, b.addr, b.pool), *b);
        }
        msgs
    }

    pub fn is_empty(&self) -> bool {
        self.found.is_empty()
    }

    pub fn blocks(&self) -> impl Iterator<Item = &LiveBlock> {
        self.found.values()
    }

    /// The exit report, per device, by allocation step (msMemScope's wording).
    pub fn report(&self) -> String {
        let mut by_device: BTreeMap<u32, Vec<&LiveBlock>> = BTreeMap::new();
        for b in self.found.values() {
            by_device.entry(b.device).or_default().push(b);
        }
        let mut s = String::new();
        for (device, blocks) in by_device {
            s.push_str(&format!(
                "====== ERROR: Detected memory leaks on device {device} ======\n"
            ));
            let mut total = 0u64;
            for b in &blocks {
                total += b.size;
                s.push_str(&format!(
                    "Direct {} leak of {:.6} Mb(s) at 0x{:x} in kernel_{} at step {}.\n",
                    b.pool.display_name(),
                    b.size as f64 / MIB,
                    b.addr,
                    b.kernel_index,
                    b.alloc_step
                ));
            }
            s.push_str(&format!(
                "====== SUMMARY: {:.6} Mb(s) leaked in {} allocation(s) ======\n",
                total as f64 / MIB,
                blocks.len()
            ));
        }
        s
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct GapRecord {
    ratio: f64,
    min_alloc: u64,
    step: u32,
}

#[derive(Debug, Default)]
struct GapState {
    current: u64,
    start_value: u64,
    step_min: Option<u64>,
    step_max: u64,
    min_gap: Option<GapRecord>,
    max_gap: Option<GapRecord>,
}

/// Per device and pool: the smallest and largest min/max ratio of allocated memory within a
/// step (steps after the first).
#[derive(Debug, Default)]
pub struct Gaps {
    state: BTreeMap<(u32, PoolKind), GapState>,
    step: u32,
}

impl Gaps {
    pub fn on_update(&mut self, pool: PoolKind, device: u32, allocated: u64) {
        if !pool.analysed() {
            return;
        }
        let step = self.step;
        let g = self.state.entry((device, pool)).or_default();
        g.current = allocated;
        if step > 1 {
            g.step_min = Some(g.step_min.map_or(allocated, |m| m.min(allocated)));
            g.step_max = g.step_max.max(allocated);
        }
    }

    pub fn on_step_start(&mut self, step: u32) {
        self.step = step;
        for g in self.state.values_mut() {
            g.start_value = g.current;
            g.step_min = None;
            g.step_max = 0;
        }
    }

    /// Returns a message per pool whose allocated memory at the end of the step differs from
    /// its start (steps after the first).
    pub fn on_step_end(&mut self, step: u32) -> Vec<String> {
        let mut msgs = Vec::new();
        for ((device, pool), g) in &mut self.state {
            if step > 1 && g.start_value != g.current {
                msgs.push(format!(
                    "[npu {device}][step {step}]: allocated memory of {} went from {} to {} bytes",
                    pool.display_name(),
                    g.start_value,
                    g.current
                ));
            }
            if step <= 1 || g.step_max == 0 {
                continue;
            }
            let min = g.step_min.unwrap_or(0);
            let rec = GapRecord {
                ratio: min as f64 / g.step_max as f64,
                min_alloc: min,
                step,
            };
            if g.min_gap.is_none_or(|m| rec.ratio < m.ratio) {
                g.min_gap = Some(rec);
            }
            if g.max_gap.is_none_or(|m| rec.ratio > m.ratio) {
                g.max_gap = Some(rec);
            }
        }
        msgs
    }

    /// The exit table, per device and pool.
    pub fn report(&self) -> String {
        let mut s = String::new();
        for ((device, pool), g) in &self.state {
            let (Some(min), Some(max)) = (g.min_gap, g.max_gap) else {
                continue;
            };
            s.push_str(&format!(
                "======= {} Gap Analysis of Device {device} =======\n",
                pool.display_name()
            ));
            s.push_str(&format!(
                "{:<10}{:<25}{:<25}{:<25}\n",
                "", "MinAlloc/MaxAlloc(%)", "MinAllocMem(MB)", "StepId"
            ));
            for (label, r) in [("MinGap", min), ("MaxGap", max)] {
                s.push_str(&format!(
                    "{:<10}{:<25}{:<25}{:<25}\n",
                    label,
                    format!("{:.4}", r.ratio * 100.0),
                    format!("{:.4}", r.min_alloc as f64 / MIB),
                    r.step
                ));
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(addr: u64, alloc_step: u32) -> LiveBlock {
        LiveBlock {
            pool: PoolKind::PtaCaching,
            device: 0,
            addr,
            size: 1 << 20,
            alloc_step,
            kernel_index: 0,
        }
    }

    #[test]
    fn step_leaks_follow_the_spec_arithmetic() {
        let mut l = StepLeaks::default();
        // End of step 2: a step-2 block has not outlived a step yet; step-1 blocks never count.
        assert!(l.on_step_end(2, &[block(1, 1), block(2, 2)]).is_empty());
        // End of step 3: the step-2 block has.
        let msgs = l.on_step_end(3, &[block(1, 1), block(2, 2), block(3, 3)]);
        assert_eq!(msgs.len(), 1);
        assert!(msgs[0].contains("ptr: 0x2 has last for 1 steps"));
        // Cumulative: still listed after it is freed.
        l.on_step_end(4, &[]);
        let mut ws = block(9, 2);
        ws.pool = PoolKind::PtaWorkspace;
        assert!(
            l.on_step_end(5, &[ws]).is_empty(),
            "workspace is not analysed"
        );
        assert_eq!(
            l.report(),
            "====== ERROR: Detected memory leaks on device 0 ======\n\
             Direct Pytorch Caching memory pool leak of 1.000000 Mb(s) at 0x2 in kernel_0 at step 2.\n\
             ====== SUMMARY: 1.000000 Mb(s) leaked in 1 allocation(s) ======\n"
        );
    }

    #[test]
    fn gaps_track_min_and_max_ratio_after_step_one() {
        let mut g = Gaps::default();
        let p = PoolKind::Atb;
        g.on_step_start(1);
        g.on_update(p, 0, 100);
        g.on_step_end(1);
        g.on_step_start(2);
        g.on_update(p, 0, 400);
        g.on_update(p, 0, 200);
        assert_eq!(g.on_step_end(2).len(), 1);
        g.on_step_start(3);
        g.on_update(p, 0, 300);
        g.on_update(p, 0, 200);
        g.on_step_end(3);
        let r = g.report();
        assert!(
            r.contains("ATB memory pool Gap Analysis of Device 0"),
            "{r}"
        );
        // Step 2: 200/400 = 50%; step 3: 200/300 = 66.67%.
        assert!(
            r.lines().any(|l| l.starts_with("MinGap")
                && l.contains("50.0000")
                && l.trim_end().ends_with('2')),
            "{r}"
        );
        assert!(
            r.lines().any(|l| l.starts_with("MaxGap")
                && l.contains("66.6667")
                && l.trim_end().ends_with('3')),
            "{r}"
        );
    }
}
