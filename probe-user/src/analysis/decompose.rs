//! Memory decomposition (`--analysis=decompose`, spec §2.7): every block is labelled with its
//! owner — `CANN@<module>` for driver (HAL) blocks by the module in the allocation flag,
//! `PTA`, `PTA_WORKSPACE`, `MINDSPORE`, `ATB` for framework pool regions — and the current and
//! peak bytes of each owner are kept, with a snapshot at the end of every mstx step.
//!
//! Driver blocks and pool regions are two layers of the same memory (a pool's regions live in
//! segments the pool got from the driver), so each layer adds up on its own: the `CANN@*`
//! owners to the live driver memory, the pool owners to the memory the pools handed out.

use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnerBytes {
    pub current: u64,
    pub peak: u64,
}

#[derive(Debug, Default)]
pub struct Decompose {
    owners: BTreeMap<String, OwnerBytes>,
    /// (step, owner -> bytes live at the end of that step).
    steps: Vec<(u32, BTreeMap<String, u64>)>,
}

impl Decompose {
    pub fn on_alloc(&mut self, owner: &str, size: u64) {
        let o = self.owners.entry(owner.to_string()).or_default();
        o.current += size;
        o.peak = o.peak.max(o.current);
    }

    pub fn on_free(&mut self, owner: &str, size: u64) {
        if let Some(o) = self.owners.get_mut(owner) {
            o.current = o.current.saturating_sub(size);
        }
    }

    pub fn on_step_end(&mut self, step: u32) {
        let snapshot = self
            .owners
            .iter()
            .map(|(k, v)| (k.clone(), v.current))
            .collect();
        self.steps.push((step, snapshot));
    }

    /// The bytes of each owner at the end of every step so far.
    pub fn step_snapshots(&self) -> &[(u32, BTreeMap<String, u64>)] {
        &self.steps
    }

    pub fn owners(&self) -> &BTreeMap<String, OwnerBytes> {
        &self.owners
    }

    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    /// The summary table: owner, current and peak bytes.
    pub fn report(&self) -> String {
        let mut s = format!(
            "{:<24}{:>18}{:>18}\n",
            "Owner", "Current(byte)", "Peak(byte)"
        );
        for (owner, b) in &self.owners {
            s.push_str(&format!("{owner:<24}{:>18}{:>18}\n", b.current, b.peak));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_current_and_peak_per_owner_and_step_snapshots() {
        let mut d = Decompose::default();
        d.on_alloc("CANN@APP", 100);
        d.on_alloc("CANN@APP", 50);
        d.on_alloc("PTA", 30);
        d.on_free("CANN@APP", 100);
        d.on_step_end(1);
        d.on_free("PTA", 30);
        d.on_free("unknown", 5);
        assert_eq!(
            d.owners()["CANN@APP"],
            OwnerBytes {
                current: 50,
                peak: 150
            }
        );
        assert_eq!(
            d.owners()["PTA"],
            OwnerBytes {
                current: 0,
                peak: 30
            }
        );
        assert_eq!(
            d.steps,
            vec![(
                1,
                BTreeMap::from([("CANN@APP".to_string(), 50), ("PTA".to_string(), 30)])
            )]
        );
        assert!(d.report().contains("CANN@APP"));
    }
}
