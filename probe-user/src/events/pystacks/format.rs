//! Python frames as text: `file(line): function` lines, the markers for what could not be
//! read, and the mixed C/Python view.

use std::sync::Arc;

/// A resolved Python frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PyFrame {
    Code {
        file: Arc<str>,
        line: Option<i32>,
        function: Arc<str>,
        /// The first frame of a `_PyEval_EvalFrameDefault` call (3.11 `is_entry`; 3.12+: the
        /// frame right above a C-stack shim frame).
        entry: bool,
    },
    /// The code object could not be read (freed, or not a code object).
    Unreadable { entry: bool },
}

impl PyFrame {
    /// msMemScope's line for this frame, without the newline.
    pub fn text(&self) -> String {
        match self {
            PyFrame::Code {
                file,
                line,
                function,
                ..
            } => match line {
                Some(l) => format!("{file}({l}): {function}"),
                None => format!("{file}(?): {function}"),
            },
            PyFrame::Unreadable { .. } => "[python: code object unreadable]".into(),
        }
    }

    fn is_entry(&self) -> bool {
        match self {
            PyFrame::Code { entry, .. } | PyFrame::Unreadable { entry } => *entry,
        }
    }

    /// The frame as a line of the mixed C column (`--call-stack=mixed`), at `address`.
    fn mixed_line(&self, address: u64) -> String {
        match self {
            PyFrame::Code {
                file,
                line,
                function,
                ..
            } => format!(
                "0x{address:016x} {PYTHON_MARKER} {function} at {file}:{}",
                line.unwrap_or(0)
            ),
            PyFrame::Unreadable { .. } => {
                format!("0x{address:016x} {PYTHON_MARKER} [python: code object unreadable]")
            }
        }
    }
}

/// Marks the Python frames in the mixed C column.
pub const PYTHON_MARKER: &str = "[python]";
/// The interpreter loop whose C frames the mixed view replaces.
pub const EVAL_LOOP: &str = "_PyEval_EvalFrameDefault";

/// The mixed view (`--call-stack=mixed`): the C stack `frames` (innermost first) with each
/// real (not inlined) `_PyEval_EvalFrameDefault` frame replaced by the Python frames that
/// call of the loop was running, innermost first, at the loop frame's address: the frames
/// down to the next entry frame. A loop frame left without Python frames (the Python stack
/// was cut at its depth) stays as it is.
pub fn mix(frames: &[memscope_symbols::Frame], py: &PyStack, truncated: bool) -> String {
    let mut lines = Vec::with_capacity(frames.len() + py.frames.len());
    let mut next = 0;
    for f in frames {
        let is_loop = !f.inlined && f.function.as_deref() == Some(EVAL_LOOP);
        if is_loop && next < py.frames.len() {
            while next < py.frames.len() {
                let p = &py.frames[next];
                lines.push(p.mixed_line(f.address));
                next += 1;
                if p.is_entry() {
                    break;
                }
            }
            continue;
        }
        lines.push(memscope_symbols::format_frame(f));
    }
    if truncated {
        lines.push(memscope_symbols::format::TRUNCATED_MARKER.to_string());
    }
    lines.join("\n")
}

/// A resolved Python stack: frames innermost first and what ended it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PyStack {
    pub frames: Vec<PyFrame>,
    /// A marker line after the frames (`[truncated]`, `[python: ...]`), if any.
    pub end: Option<&'static str>,
}

impl PyStack {
    pub(super) fn marker(m: &'static str) -> Self {
        PyStack {
            frames: Vec::new(),
            end: Some(m),
        }
    }

    /// The `Call Stack(Python)` text: one line per frame, each ending in `\n`.
    pub fn text(&self) -> String {
        let mut s = String::new();
        for f in &self.frames {
            s.push_str(&f.text());
            s.push('\n');
        }
        if let Some(m) = self.end {
            s.push_str(m);
            s.push('\n');
        }
        s
    }
}

pub const NO_INTERPRETER: &str = "[python: no interpreter]";
pub const NO_THREAD_STATE: &str = "[python: no thread state]";
pub const NO_FRAMES: &str = "[python: no frames]";
pub const CHAIN_UNREADABLE: &str = "[python: frame chain unreadable]";
pub const TRUNCATED: &str = "[truncated]";
