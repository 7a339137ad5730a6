//! Building the output rows of memory events (MALLOC/FREE, pool rows) with their running
//! `used` totals.

use super::{Block, BlockKind, DeviceKey, ProcessState, TrackOptions};
use crate::events::pools::RegionChange;

/// One output row; `id` is assigned by the writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub event: &'static str,
    pub event_type: &'static str,
    /// Already formatted (`N/A`, or a quoted MSTX message); borrowed when constant.
    pub name: std::borrow::Cow<'static, str>,
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub device: DeviceKey,
    pub ptr: Option<u64>,
    /// The block's size on MALLOC and FREE rows (driver blocks, handles, pool regions): the
    /// Attr's `size:`, as a number for the node agent. None on other rows.
    pub size: Option<u64>,
    /// The inside of the braces, e.g. `allocation_id:1,addr:0x...`; empty for no Attr, and
    /// on MALLOC and FREE rows without `TrackOptions::row_attrs` (the node agent).
    pub attr: String,
    /// The `Call Stack(C)` text (docs/call-stacks.md), when stacks are collected.
    pub c_stack: Option<std::sync::Arc<str>>,
    /// The `Call Stack(Python)` text (`file(line): function` lines, `--call-stack=python`).
    pub py_stack: Option<std::sync::Arc<str>>,
}

/// Quotes a free-text field (an MSTX message) the way msMemScope does, `"..."`, doubling any
/// quote inside so CSV readers still split the row correctly.
pub fn quote_text(s: &str) -> String {
    let clean: String = s
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    format!("\"{}\"", clean.replace('"', "\"\""))
}

impl ProcessState {
    pub(super) fn pool_row(
        &self,
        event: &'static str,
        b: &Block,
        tid: u32,
        ts_ns: u64,
        c: RegionChange,
        opts: &TrackOptions,
    ) -> Row {
        let attr = if opts.row_attrs {
            format!(
                "allocation_id:{},addr:0x{:016x},size:{},used:{},total:{}",
                b.allocation_id, b.addr, b.size, c.allocated, c.reserved
            )
        } else {
            String::new()
        };
        self.block_row(event, b, tid, ts_ns, attr)
    }
}

impl ProcessState {
    pub(super) fn free_row(
        &mut self,
        block: &Block,
        tid: u32,
        ts_ns: u64,
        opts: &TrackOptions,
        rows: &mut Vec<Row>,
    ) {
        let used = self.used.entry(block.device).or_default();
        *used = used.saturating_sub(block.size);
        if matches!(block.kind, BlockKind::Device | BlockKind::Handle) {
            self.forget_pool_segment(block.addr);
        }
        if opts.decompose {
            self.decompose.on_free(&block.owner(), block.size);
        }
        if opts.dump.free {
            rows.push(self.memory_row("FREE", block, tid, ts_ns, false, opts));
        }
    }

    pub(super) fn memory_row(
        &self,
        event: &'static str,
        b: &Block,
        tid: u32,
        ts_ns: u64,
        is_malloc: bool,
        opts: &TrackOptions,
    ) -> Row {
        let attr = if opts.row_attrs {
            self.memory_attr(b, is_malloc)
        } else {
            String::new()
        };
        self.block_row(event, b, tid, ts_ns, attr)
    }

    /// The MALLOC or FREE row of block `b`, with its Attr text already made.
    fn block_row(&self, event: &'static str, b: &Block, tid: u32, ts_ns: u64, attr: String) -> Row {
        Row {
            event,
            event_type: b.event_type(),
            name: "N/A".into(),
            ts_ns,
            pid: self.pid,
            tid,
            device: DeviceKey::from_id(b.device),
            ptr: Some(b.addr),
            size: Some(b.size),
            attr,
            c_stack: None,
            py_stack: None,
        }
    }

    /// The Attr of a driver block's (or handle's) MALLOC or FREE row.
    fn memory_attr(&self, b: &Block, is_malloc: bool) -> String {
        let used = self.used.get(&b.device).copied().unwrap_or(0);
        // Hot path (every MALLOC/FREE row): one allocation, no `format!` temporaries.
        use crate::digits::{push_hex16, push_u64};
        let mut attr = Vec::with_capacity(128);
        attr.extend_from_slice(b"allocation_id:");
        push_u64(&mut attr, b.allocation_id);
        attr.extend_from_slice(b",addr:");
        push_hex16(&mut attr, b.addr);
        attr.extend_from_slice(b",size:");
        push_u64(&mut attr, b.size);
        match b.kind {
            BlockKind::PinnedHost => {
                attr.extend_from_slice(b",pinned:true,used:");
                push_u64(&mut attr, used);
            }
            // Pool rows are built by `pool_row`; kept total for exhaustiveness.
            BlockKind::Pool(_) => {
                attr.extend_from_slice(b",used:");
                push_u64(&mut attr, used);
            }
            BlockKind::Device | BlockKind::Handle => {
                attr.extend_from_slice(b",used:");
                push_u64(&mut attr, used);
                if is_malloc {
                    attr.extend_from_slice(b",page_type:");
                    attr.extend_from_slice(b.page_type.as_str().as_bytes());
                    attr.extend_from_slice(if b.kind == BlockKind::Handle {
                        b",alloc_type:create"
                    } else {
                        b",alloc_type:alloc"
                    });
                }
            }
        }
        // SAFETY: only ASCII went in (digits, hex digits, ASCII literals, page type names).
        unsafe { String::from_utf8_unchecked(attr) }
    }
}
