//! Decompose owners: label marks pushed by threads and relabelling live pool blocks.

use super::{ProcessState, TrackOptions};
use crate::events::labels;
use crate::events::pools::PoolKind;

impl ProcessState {
    /// A `memscope-label-*` mark (labels.rs). Bad marks are reported, never rows.
    pub(super) fn label_mark(&mut self, text: &str, tid: u32, opts: &TrackOptions) {
        if !opts.decompose {
            return;
        }
        match labels::parse_mark(text) {
            Ok(labels::LabelMark::Push { level, label }) => {
                if let Err(e) = self
                    .thread_labels
                    .entry(tid)
                    .or_default()
                    .push(level, &label)
                {
                    self.messages
                        .push(format!("pid {} tid {tid}: {e}", self.pid));
                }
            }
            Ok(labels::LabelMark::Pop { level, label }) => {
                if let Some(t) = self.thread_labels.get_mut(&tid) {
                    t.pop(level, &label);
                }
            }
            Ok(labels::LabelMark::Addr { ptr, level, label }) => {
                let key = self
                    .pta_by_addr
                    .range(..=ptr)
                    .next_back()
                    .map(|(_, k)| (PoolKind::PtaCaching, *k))
                    .filter(|k| {
                        self.pool_blocks
                            .get(k)
                            .is_some_and(|b| ptr < b.addr + b.size)
                    });
                match key {
                    Some(key) => self.relabel(key, level, &label, false, opts),
                    None => self.messages.push(format!(
                        "pid {}: {text:?}: no live PTA block holds 0x{ptr:x}",
                        self.pid
                    )),
                }
            }
            Err(e) => self
                .messages
                .push(format!("pid {}: ignored {text:?}: {e}", self.pid)),
        }
    }

    /// Sets one label level of a live pool block and moves its bytes to the new owner.
    /// `weak`: only when that level is empty (the `ops` tag of accesses).
    pub(super) fn relabel(
        &mut self,
        key: (PoolKind, u64),
        level: usize,
        label: &str,
        weak: bool,
        opts: &TrackOptions,
    ) {
        if !opts.decompose {
            return;
        }
        let Some(b) = self.pool_blocks.get_mut(&key) else {
            return;
        };
        let slot = &b.labels.as_ref().and_then(|l| l[level - 1].clone());
        if slot.as_deref() == Some(label) || (weak && slot.is_some()) {
            return;
        }
        let old = b.owner();
        b.labels.get_or_insert_with(Default::default)[level - 1] = Some(label.into());
        let new = b.owner();
        self.decompose.on_free(&old, b.size);
        self.decompose.on_alloc(&new, b.size);
    }
}
