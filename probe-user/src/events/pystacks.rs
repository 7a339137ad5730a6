//! Python call stacks (`--call-stack=python[:D]`), read from outside the process.
//!
//! For a traced process that runs CPython, user space finds `_PyRuntime` in the symbol table
//! of `libpython3.X.so` (or of a statically linked `python`), reads the version from
//! `Py_Version`, and hands the BPF side the structure offsets of that version
//! ([`layout_for`]; checked against the interpreters' own headers by tests/python_stacks.rs).
//! At each traced call BPF sends the thread's frame chain: code object and instruction
//! pointer per frame; a code object seen for the first time in the process comes whole just
//! before (names, first line, line table: [`CodeRecord`], copied at the call while it is surely
//! alive). Code objects are kept by address and identity for the life of the process; one with
//! no record is read from `/proc/PID/mem` (read only). The instruction offset is turned into a
//! line with the location table format of 3.11+ (PEP 626/657).
//!
//! The text is msMemScope's: `file(line): function`, one frame per line, innermost first, each
//! line ending in `\n`. What cannot be read is said in the stack, never guessed:
//! `[python: unknown version 3.10]`, `[python: no interpreter]`, `[python: no thread state]`,
//! `[python: code object unreadable]`, `[python: frame chain unreadable]`, `[truncated]`.
//!
//! Here: per-process state and resolving a sample; `pystacks/layouts.rs` holds the version
//! tables and finds CPython, `pystacks/memory.rs` takes code objects from BPF's records or reads
//! them from the process, `pystacks/format.rs` writes frames, markers and the mixed C/Python
//! view.

mod format;
mod layouts;
mod memory;
#[cfg(test)]
mod tests;

pub use format::CHAIN_UNREADABLE;
pub use format::EVAL_LOOP;
pub use format::NO_FRAMES;
pub use format::NO_INTERPRETER;
pub use format::NO_THREAD_STATE;
pub use format::PYTHON_MARKER;
pub use format::PyFrame;
pub use format::PyStack;
pub use format::TRUNCATED;
pub use format::mix;
pub use layouts::CodeLayout;
pub use layouts::Interpreter;
pub use layouts::PyLayout;
pub use layouts::find_interpreter;
pub use layouts::layout_for;
pub use layouts::layout_from_debug_offsets;
pub use memory::CodeInfo;
pub use memory::CodeRecord;
pub use memory::code_record_from_bytes;
pub use memory::line_for_offset;
pub use memory::read_code;

use anyhow::Context;
use anyhow::Result;
use layouts::{DEBUG_OFFSETS_WORDS, FRAME_OWNED_BY_CSTACK};
use memory::read_at;
use probe_common::{
    PY_FRAME_HAS_IDS, PY_MAX_FRAMES, PY_STACK_HEADER, PYSTACK_KIND, PyFrameRecord, PyProcess,
    PyStackEvent, py_flags,
};
use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;

/// One Python sample as BPF sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PySample {
    pub pid: u32,
    pub tid: u32,
    /// The `ts_ns` of the call it was taken for (its record has the same).
    pub ts_ns: u64,
    pub flags: u16,
    pub frames: Vec<PyFrameRecord>,
}

/// Parses a PYSTACK record; `None` for anything else.
pub fn sample_from_bytes(bytes: &[u8]) -> Option<PySample> {
    if bytes.len() < PY_STACK_HEADER || u16::from_ne_bytes([bytes[0], bytes[1]]) != PYSTACK_KIND {
        return None;
    }
    let u16_at = |o: usize| u16::from_ne_bytes([bytes[o], bytes[o + 1]]);
    let u32_at = |o: usize| u32::from_ne_bytes(bytes[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_ne_bytes(bytes[o..o + 8].try_into().unwrap());
    let flags = u16_at(std::mem::offset_of!(PyStackEvent, flags));
    let n = (u16_at(std::mem::offset_of!(PyStackEvent, nframes)) as usize)
        .min(PY_MAX_FRAMES)
        .min((bytes.len() - PY_STACK_HEADER) / std::mem::size_of::<PyFrameRecord>());
    let frames = (0..n)
        .map(|k| {
            let o = PY_STACK_HEADER + k * std::mem::size_of::<PyFrameRecord>();
            PyFrameRecord {
                code: u64_at(o),
                instr: u64_at(o + 8),
                meta: u64_at(o + 16),
            }
        })
        .collect();
    Some(PySample {
        pid: u32_at(std::mem::offset_of!(PyStackEvent, pid)),
        tid: u32_at(std::mem::offset_of!(PyStackEvent, tid)),
        ts_ns: u64_at(std::mem::offset_of!(PyStackEvent, ts_ns)),
        flags,
        frames,
    })
}

enum ProcState {
    /// Known CPython: BPF walks its frames.
    Python(Box<PyProc>),
    /// CPython of a version we have no layout for (the marker names it).
    Unknown(&'static str),
    /// No `_PyRuntime` in its mappings when last looked.
    NotPython,
}

struct PyProc {
    pid: u32,
    mem: File,
    layout: PyLayout,
    code_type: u64,
    /// (address, identity) -> the code object.
    codes: HashMap<(u64, u64), Arc<CodeEntry>>,
    /// (code address, identity, instruction) -> its line: a loop's frames come back at the
    /// same few instructions, and decoding a long location table from its start for each was
    /// the tracer's largest cost per Python stack (15% of its CPU on the torch bench).
    lines: HashMap<(u64, u64, u64), Option<i32>>,
    /// Stacks already resolved, by the frames BPF read (see [`PyStacks::resolve_text`]).
    stacks: HashMap<StackKey, ResolvedStack>,
}

/// A sample's flags and, per frame, its code object, instruction and `meta` (which holds the
/// code object's identity).
type StackKey = (u16, Vec<[u64; 3]>);
/// A resolved stack and its `Call Stack(Python)` text.
pub type ResolvedStack = (Arc<PyStack>, Arc<str>);

/// `PyTypeObject.tp_dealloc` (after `ob_refcnt`, `ob_type`, `ob_size`, `tp_name`,
/// `tp_basicsize`, `tp_itemsize`; 64-bit, every version).
const TP_DEALLOC: u64 = 48;

/// Stacks remembered per process before the memo starts over.
const STACKS_KEPT: usize = 1 << 14;

struct CodeEntry {
    info: CodeInfo,
    file: Arc<str>,
    function: Arc<str>,
    /// The whole line table (not the start of it BPF had room for).
    complete: bool,
}

/// Per-process Python state of a session: which processes run which CPython, and their code
/// objects.
pub struct PyStacks {
    depth: usize,
    procs: HashMap<u32, ProcState>,
    /// The process `enable` last looked at (calls come in runs from one process: the next
    /// look without `again` there changes nothing, and this saves it two map lookups).
    last_looked: Option<u32>,
    /// Counts configurations: BPF keys the code objects it has sent by it (`PyProcess`).
    generation: u32,
    /// BPF walks at the calls that allocate only (the default line): a call of a Python
    /// process without a sample was left unwalked on purpose, and its column stays empty.
    pub allocations_only: bool,
    /// The stack of a sample taken on a thread without a Python state.
    no_thread_state: Option<ResolvedStack>,
}

/// What [`PyStacks::configure`] found, for the caller to hand to BPF.
pub enum Configured {
    /// Walk this process's frames with these offsets.
    Walk(PyProcess),
    /// Nothing (more) to tell BPF.
    Nothing,
}

impl PyStacks {
    /// `depth`: most frames per stack (`--call-stack=python:D`).
    pub fn new(depth: usize) -> Self {
        PyStacks {
            depth,
            procs: HashMap::new(),
            last_looked: None,
            generation: 0,
            allocations_only: false,
            no_thread_state: None,
        }
    }

    /// True once `pid` is known to run CPython (of any version).
    pub fn is_known(&self, pid: u32) -> bool {
        matches!(
            self.procs.get(&pid),
            Some(ProcState::Python(_) | ProcState::Unknown(_))
        )
    }

    /// True once `pid`'s mappings were searched (whatever was found).
    fn was_looked_at(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }

    /// Looks for CPython in `pid`'s mappings unless it was found already. Call again later
    /// (after an exec, a library load) when it was not found.
    pub fn configure(&mut self, pid: u32) -> Result<Configured> {
        if self.is_known(pid) {
            return Ok(Configured::Nothing);
        }
        let Some(interp) = find_interpreter(pid)? else {
            self.procs.insert(pid, ProcState::NotPython);
            return Ok(Configured::Nothing);
        };
        let mem = File::open(format!("/proc/{pid}/mem"))
            .with_context(|| format!("cannot open /proc/{pid}/mem"))?;
        // The interpreter's own offsets where it publishes them (3.13), else our table.
        let published = read_at(&mem, interp.runtime, DEBUG_OFFSETS_WORDS * 8)
            .ok()
            .and_then(|b| layout_from_debug_offsets(&b));
        let layout = published.or_else(|| interp.version.and_then(|(a, b)| layout_for(a, b)));
        let Some(layout) = layout else {
            let marker: &'static str = match interp.version {
                Some((a, b)) => {
                    Box::leak(format!("[python: unknown version {a}.{b}]").into_boxed_str())
                }
                None => "[python: unknown version]",
            };
            self.procs.insert(pid, ProcState::Unknown(marker));
            return Ok(Configured::Nothing);
        };
        let mut walk = layout.walk;
        walk.runtime = interp.runtime;
        walk.code_ids = layout.code.ids_offset();
        walk.code_firstlineno = layout.code.firstlineno as u32;
        walk.str_ascii_data = layout.ascii_size as u32;
        walk.str_compact_data = layout.compact_size as u32;
        self.generation = self.generation.wrapping_add(1);
        walk.generation = self.generation;
        self.procs.insert(
            pid,
            ProcState::Python(Box::new(PyProc {
                pid,
                mem,
                layout,
                code_type: interp.code_type,
                codes: HashMap::new(),
                lines: HashMap::new(),
                stacks: HashMap::new(),
            })),
        );
        Ok(Configured::Walk(walk))
    }

    /// [`configure`](Self::configure) and hand the result to BPF. `again`: look again in a
    /// process where no interpreter was found before (it may have loaded libpython since).
    pub fn enable(&mut self, bpf: &mut crate::trace::bpf::Bpf, pid: u32, again: bool) {
        if !again && self.last_looked == Some(pid) {
            return;
        }
        self.look(bpf, pid, again);
        if !again && self.was_looked_at(pid) {
            self.last_looked = Some(pid);
        }
    }

    fn look(&mut self, bpf: &mut crate::trace::bpf::Bpf, pid: u32, again: bool) {
        if self.is_known(pid) || (!again && self.was_looked_at(pid)) {
            return;
        }
        match self.configure(pid) {
            Ok(Configured::Walk(mut layout)) => {
                layout.code_gone = self.watch_code_deaths(bpf, pid) as u32;
                crate::log::debug(&format!(
                    "pid {pid}: CPython runtime at 0x{:x}: Python stacks on",
                    layout.runtime
                ));
                if let Err(e) = bpf.set_python_process(pid, &layout) {
                    crate::log::warn(&format!("pid {pid}: no Python stacks: {e:#}"));
                    self.forget(pid);
                }
            }
            Ok(Configured::Nothing) => {}
            Err(e) => crate::log::debug(&format!("pid {pid}: no Python stacks: {e:#}")),
        }
    }

    /// Puts `py_code_gone` on `pid`'s `code_dealloc` (found as `PyCode_Type.tp_dealloc`, so
    /// without symbols): BPF may then name a code object by its address until it is freed
    /// instead of reading its identity at every frame. False (said at debug level) where it
    /// cannot: BPF reads the identity each time, as before.
    fn watch_code_deaths(&self, bpf: &mut crate::trace::bpf::Bpf, pid: u32) -> bool {
        let Some(ProcState::Python(p)) = self.procs.get(&pid) else {
            return false;
        };
        let watched = (|| -> Result<u64> {
            let bytes = read_at(&p.mem, p.code_type + TP_DEALLOC, 8)?;
            let dealloc = u64::from_le_bytes(bytes[..8].try_into()?);
            let maps = memscope_symbols::read_maps(pid)?;
            let Some((m, offset)) = maps
                .iter()
                .filter(|m| m.is_executable())
                .find_map(|m| m.file_offset_of(dealloc).map(|offset| (m, offset)))
            else {
                anyhow::bail!("code_dealloc at 0x{dealloc:x} is in no executable mapping");
            };
            bpf.watch_code_deaths(pid, &m.map_files_path(pid), offset)?;
            Ok(dealloc)
        })();
        match watched {
            Ok(at) => {
                crate::log::debug(&format!("pid {pid}: code_dealloc at 0x{at:x} probed"));
                true
            }
            Err(e) => {
                crate::log::debug(&format!(
                    "pid {pid}: code objects' identities read at each frame: {e:#}"
                ));
                false
            }
        }
    }

    /// The process exited or exec'd: its code objects and interpreter are gone.
    pub fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
        if self.last_looked == Some(pid) {
            self.last_looked = None;
        }
    }

    /// A code object BPF sent at its first sight in `pid`, before the samples that name it.
    pub fn learn(&mut self, record: CodeRecord) {
        if let Some(ProcState::Python(p)) = self.procs.get_mut(&record.pid) {
            p.learn(record);
        }
    }

    /// The text for a call of `pid` that came without a Python sample (None: no text, a call
    /// the default line does not walk).
    pub fn without_sample(&self, pid: u32) -> Option<Arc<str>> {
        let marker = match self.procs.get(&pid) {
            Some(ProcState::Unknown(m)) => PyStack::marker(m),
            Some(ProcState::Python(_)) if self.allocations_only => return None,
            // A known interpreter whose BPF walk did not run (configured after the call).
            Some(ProcState::Python(_)) => PyStack::marker(NO_THREAD_STATE),
            _ => PyStack::marker(NO_INTERPRETER),
        };
        Some(Arc::from(marker.text()))
    }

    /// [`resolve`](Self::resolve) and the stack's text, remembered: a loop makes the same few
    /// stacks over and over, and naming and formatting each again was most of the tracer's
    /// CPU per Python stack. Only a stack whose every frame came with its code object's
    /// identity (so the same key is the same code) and resolved to a named line is kept.
    pub fn resolve_text(&mut self, s: &PySample) -> ResolvedStack {
        // A thread without a Python state (torch_npu's task queue: at every operator) gets
        // the one marker, made once.
        if s.flags & py_flags::NO_THREAD_STATE != 0
            && matches!(self.procs.get(&s.pid), Some(ProcState::Python(_)))
        {
            return self
                .no_thread_state
                .get_or_insert_with(|| {
                    let stack = PyStack::marker(NO_THREAD_STATE);
                    let text = Arc::from(stack.text());
                    (Arc::new(stack), text)
                })
                .clone();
        }
        // Only a stack whose frames all carry their identity is ever kept, so only such a
        // stack is looked up.
        let keyed = !s.frames.is_empty() && s.frames.iter().all(|f| f.meta & PY_FRAME_HAS_IDS != 0);
        let key = match self.procs.get(&s.pid) {
            Some(ProcState::Python(p)) if keyed => {
                let key: StackKey = (
                    s.flags,
                    s.frames.iter().map(|f| [f.code, f.instr, f.meta]).collect(),
                );
                if let Some(hit) = p.stacks.get(&key) {
                    return hit.clone();
                }
                Some(key)
            }
            _ => None,
        };
        let stack = self.resolve(s);
        let text: Arc<str> = Arc::from(stack.text());
        let resolved = (Arc::new(stack), text);
        let named = resolved
            .0
            .frames
            .iter()
            .all(|f| matches!(f, PyFrame::Code { line: Some(_), .. }));
        if let Some(key) = key
            && named
            && let Some(ProcState::Python(p)) = self.procs.get_mut(&s.pid)
        {
            if p.stacks.len() >= STACKS_KEPT {
                p.stacks.clear();
            }
            p.stacks.insert(key, resolved.clone());
        }
        resolved
    }

    /// Resolves a sample now, while the process is alive to read its code objects.
    pub fn resolve(&mut self, s: &PySample) -> PyStack {
        let depth = self.depth;
        let Some(ProcState::Python(p)) = self.procs.get_mut(&s.pid) else {
            return PyStack::marker(NO_INTERPRETER);
        };
        if s.flags & py_flags::NO_THREAD_STATE != 0 {
            return PyStack::marker(NO_THREAD_STATE);
        }
        let mut out = PyStack::default();
        // Which frames start an evaluation loop (`_PyEval_EvalFrameDefault` call): 3.11 marks
        // them (`is_entry`); 3.12+ pushes a shim frame under each, so the frame listed just
        // before a shim (innermost first) is one.
        let mut entries = vec![false; s.frames.len()];
        for (k, f) in s.frames.iter().enumerate() {
            if f.meta & 0x100 != 0 {
                entries[k] = true;
            }
            if p.layout.minor >= 12 && f.meta & 0xff == FRAME_OWNED_BY_CSTACK && k > 0 {
                entries[k - 1] = true;
            }
        }
        for (k, f) in s.frames.iter().enumerate() {
            if p.layout.minor >= 12 && f.meta & 0xff == FRAME_OWNED_BY_CSTACK {
                continue;
            }
            if out.frames.len() >= depth {
                out.end = Some(TRUNCATED);
                return out;
            }
            let ids = (f.meta & PY_FRAME_HAS_IDS != 0).then_some(f.meta >> 32);
            let frame = match p.code(f.code, ids) {
                Some(c) => PyFrame::Code {
                    file: c.file.clone(),
                    line: p.line(&c, f.code, f.instr),
                    function: c.function.clone(),
                    entry: entries[k],
                },
                None => PyFrame::Unreadable { entry: entries[k] },
            };
            out.frames.push(frame);
        }
        if s.flags & (py_flags::READ_FAULT | py_flags::CHAIN_LOOP) != 0 {
            out.end = Some(CHAIN_UNREADABLE);
        } else if s.flags & py_flags::TRUNCATED != 0 {
            out.end = Some(TRUNCATED);
        } else if out.frames.is_empty() {
            out.end = Some(NO_FRAMES);
        }
        out
    }
}
