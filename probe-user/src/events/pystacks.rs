//! Python call stacks (`--call-stack=python[:D]`), read from outside the process.
//!
//! For a traced process that runs CPython, user space finds `_PyRuntime` in the symbol table
//! of `libpython3.X.so` (or of a statically linked `python`), reads the version from
//! `Py_Version`, and hands the BPF side the structure offsets of that version
//! ([`layout_for`]; checked against the interpreters' own headers by tests/python_stacks.rs).
//! At each traced call BPF sends the thread's frame chain: code object and instruction
//! pointer per frame. Here each code object is read once from `/proc/PID/mem` (read only:
//! name, file, first line, line table) and cached by address, and the instruction offset is
//! turned into a line with the location table format of 3.11+ (PEP 626/657).
//!
//! The text is msMemScope's: `file(line): function`, one frame per line, innermost first, each
//! line ending in `\n`. What cannot be read is said in the stack, never guessed:
//! `[python: unknown version 3.10]`, `[python: no interpreter]`, `[python: no thread state]`,
//! `[python: code object unreadable]`, `[python: frame chain unreadable]`, `[truncated]`.

use std::{
    collections::HashMap,
    fs::File,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context, Result, bail};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
use probe_common::{
    PY_MAX_FRAMES, PY_NO_OFFSET, PY_STACK_HEADER, PYSTACK_KIND, PyFrameRecord, PyProcess,
    PyStackEvent, py_flags,
};

/// Structure offsets of one CPython version: what BPF walks and what user space reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PyLayout {
    pub major: u8,
    pub minor: u8,
    /// Offsets for the BPF walk (`runtime` left 0).
    pub walk: PyProcess,
    pub code: CodeLayout,
    /// `sizeof(PyASCIIObject)` and `sizeof(PyCompactUnicodeObject)`: where a compact
    /// string's characters start.
    pub ascii_size: u64,
    pub compact_size: u64,
}

/// `PyCodeObject` field offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    pub filename: u64,
    pub name: u64,
    pub qualname: u64,
    pub firstlineno: u64,
    pub linetable: u64,
    /// `co_code_adaptive`: the instructions, which frames' instruction pointers point into.
    pub code_adaptive: u64,
}

/// `_PyInterpreterFrame.owner` of the C-stack shim frames of 3.12+ (not Python code).
const FRAME_OWNED_BY_CSTACK: u64 = 3;
/// `PyObject.ob_type`, `PyVarObject.ob_size`, `PyBytesObject.ob_sval`,
/// `PyASCIIObject.length` and `.state`: the same in 3.11 to 3.13 (64-bit).
const OB_TYPE: u64 = 8;
const OB_SIZE: u64 = 16;
const BYTES_DATA: u64 = 32;
const STR_LENGTH: u64 = 16;
const STR_STATE: u64 = 32;

/// The offsets of the CPython versions we know, x86-64 and aarch64 (LP64, same layout).
pub fn layout_for(major: u8, minor: u8) -> Option<PyLayout> {
    let code = |firstlineno, code_adaptive| CodeLayout {
        filename: 112,
        name: 120,
        qualname: 128,
        firstlineno,
        linetable: 136,
        code_adaptive,
    };
    let walk = |interpreters_head,
                interp_next,
                interp_threads_head,
                tstate_native_thread_id,
                tstate_frame,
                cframe_current_frame,
                frame_code,
                frame_previous,
                frame_instr,
                frame_owner,
                frame_is_entry| PyProcess {
        runtime: 0,
        interpreters_head,
        interp_next,
        interp_threads_head,
        tstate_next: 8,
        tstate_native_thread_id,
        tstate_frame,
        cframe_current_frame,
        frame_code,
        frame_previous,
        frame_instr,
        frame_owner,
        frame_is_entry,
        _pad: 0,
    };
    let (walk, code, ascii_size, compact_size) = match (major, minor) {
        (3, 11) => (
            walk(40, 0, 16, 160, 56, 8, 32, 48, 56, 69, 68),
            code(72, 184),
            48,
            72,
        ),
        (3, 12) => (
            walk(40, 0, 72, 144, 56, 0, 0, 8, 56, 70, PY_NO_OFFSET),
            code(68, 192),
            40,
            56,
        ),
        (3, 13) => (
            walk(
                632,
                7264,
                7344,
                160,
                72,
                PY_NO_OFFSET,
                0,
                8,
                56,
                70,
                PY_NO_OFFSET,
            ),
            code(68, 200),
            40,
            56,
        ),
        _ => return None,
    };
    Some(PyLayout {
        major,
        minor,
        walk,
        code,
        ascii_size,
        compact_size,
    })
}

/// The interpreter's own description of its structures (`_Py_DebugOffsets`, the first field
/// of `_PyRuntime` from 3.13 on): the layout of 3.13, read from `runtime` (the bytes of
/// `_PyRuntime`, at least 44 words). `None` when there is no such table, the build is
/// free-threaded (another object layout), or an offset is out of what BPF can read.
pub fn layout_from_debug_offsets(runtime: &[u8]) -> Option<PyLayout> {
    let word = |i: usize| -> Option<u64> {
        Some(u64::from_le_bytes(
            runtime.get(i * 8..i * 8 + 8)?.try_into().ok()?,
        ))
    };
    if runtime.get(..8)? != b"xdebugpy" || word(2)? != 0 {
        return None;
    }
    let version = word(1)?;
    let (major, minor) = (
        ((version >> 24) & 0xff) as u8,
        ((version >> 16) & 0xff) as u8,
    );
    // The table's layout is only promised within one minor version: 3.13's is read here.
    if (major, minor) != (3, 13) {
        return None;
    }
    let small = |i: usize| -> Option<u32> { u32::try_from(word(i)?).ok() };
    let frame_field = |i: usize| -> Option<u32> {
        small(i).filter(|o| (*o as usize) + 8 <= probe_common::PY_FRAME_READ)
    };
    let base = layout_for(3, 13)?;
    Some(PyLayout {
        major,
        minor,
        walk: PyProcess {
            runtime: 0,
            interpreters_head: small(5)?,
            interp_next: small(8)?,
            interp_threads_head: small(9)?,
            tstate_next: small(21)?,
            tstate_native_thread_id: small(25)?,
            tstate_frame: small(23)?,
            cframe_current_frame: PY_NO_OFFSET,
            frame_code: frame_field(30)?,
            frame_previous: frame_field(29)?,
            frame_instr: frame_field(31)?,
            frame_owner: frame_field(33)?,
            frame_is_entry: PY_NO_OFFSET,
            _pad: 0,
        },
        code: CodeLayout {
            filename: word(35)?,
            name: word(36)?,
            qualname: word(37)?,
            linetable: word(38)?,
            firstlineno: word(39)?,
            code_adaptive: word(43)?,
        },
        ..base
    })
}

/// Words of `_Py_DebugOffsets` that [`layout_from_debug_offsets`] reads.
const DEBUG_OFFSETS_WORDS: usize = 44;

/// What the symbol table of a process's CPython says, before it is matched with a layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interpreter {
    /// The object holding `_PyRuntime` (libpython or the python binary).
    pub path: PathBuf,
    /// Run-time addresses of `_PyRuntime` and `PyCode_Type`.
    pub runtime: u64,
    pub code_type: u64,
    /// (major, minor) from `Py_Version`, or from the file name where there is none (< 3.11).
    pub version: Option<(u8, u8)>,
}

/// Finds the CPython runtime in a process's mappings: the first mapped object that defines
/// `_PyRuntime`. `Ok(None)`: no CPython in this process (yet).
pub fn find_interpreter(pid: u32) -> Result<Option<Interpreter>> {
    let maps = memscope_symbols::read_maps(pid)?;
    let mut tried: Vec<&Path> = Vec::new();
    for m in &maps {
        let Some(path) = m.path.as_deref() else {
            continue;
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        if !(name.starts_with("libpython") || name.starts_with("python")) || tried.contains(&path) {
            continue;
        }
        tried.push(path);
        // The process's view of the file (its mount namespace, or a deleted file).
        let file = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
        let data = match std::fs::read(&file) {
            Ok(d) => d,
            Err(_) => match std::fs::read(path) {
                Ok(d) => d,
                Err(_) => continue,
            },
        };
        let Some(syms) = runtime_symbols(&data)? else {
            continue;
        };
        // Load bias: the mapping of file offset 0 against the segment at file offset 0.
        let Some(base) = maps
            .iter()
            .find(|e| e.path.as_deref() == Some(path) && e.offset == 0)
            .map(|e| e.start)
        else {
            continue;
        };
        let bias = base.wrapping_sub(syms.first_vaddr & !0xfff);
        let version = syms
            .version
            .map(|v| (((v >> 24) & 0xff) as u8, ((v >> 16) & 0xff) as u8))
            .or_else(|| version_from_name(&name));
        return Ok(Some(Interpreter {
            path: path.to_path_buf(),
            runtime: syms.runtime.wrapping_add(bias),
            code_type: syms.code_type.wrapping_add(bias),
            version,
        }));
    }
    Ok(None)
}

struct RuntimeSymbols {
    runtime: u64,
    code_type: u64,
    version: Option<u64>,
    /// Virtual address of the segment that starts at file offset 0.
    first_vaddr: u64,
}

/// `_PyRuntime`, `PyCode_Type` and the value of `Py_Version` in an ELF image; `None` when it
/// does not define `_PyRuntime`.
fn runtime_symbols(data: &[u8]) -> Result<Option<RuntimeSymbols>> {
    let Ok(file) = object::File::parse(data) else {
        return Ok(None);
    };
    let mut runtime = None;
    let mut code_type = None;
    let mut version_sym = None;
    for sym in file.dynamic_symbols().chain(file.symbols()) {
        if sym.is_undefined() || sym.address() == 0 {
            continue;
        }
        match sym.name() {
            Ok("_PyRuntime") => runtime = runtime.or(Some(sym.address())),
            Ok("PyCode_Type") => code_type = code_type.or(Some(sym.address())),
            Ok("Py_Version") => version_sym = version_sym.or(Some(sym.address())),
            _ => {}
        }
    }
    let Some(runtime) = runtime else {
        return Ok(None);
    };
    let Some(code_type) = code_type else {
        bail!("defines _PyRuntime but not PyCode_Type");
    };
    let version = version_sym.and_then(|addr| {
        file.sections().find_map(|s| {
            let (start, size) = (s.address(), s.size());
            if addr < start || addr + 8 > start + size {
                return None;
            }
            let bytes = s.data().ok()?;
            let at = (addr - start) as usize;
            let b: [u8; 8] = bytes.get(at..at + 8)?.try_into().ok()?;
            Some(u64::from_le_bytes(b))
        })
    });
    let first_vaddr = file
        .segments()
        .find(|s| s.file_range().0 == 0)
        .map(|s| s.address())
        .unwrap_or(0);
    Ok(Some(RuntimeSymbols {
        runtime,
        code_type,
        version,
        first_vaddr,
    }))
}

/// `libpython3.10.so.1.0` or `python3.10` -> (3, 10).
fn version_from_name(name: &str) -> Option<(u8, u8)> {
    let rest = name
        .strip_prefix("libpython")
        .or_else(|| name.strip_prefix("python"))?;
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// A code object as read from the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeInfo {
    pub filename: String,
    pub name: String,
    pub qualname: String,
    pub firstlineno: i32,
    pub linetable: Vec<u8>,
    /// Address of the first instruction.
    pub code_start: u64,
}

impl CodeInfo {
    /// The source line of the instruction at `instr` (an address into this code object's
    /// instructions), as `PyCode_Addr2Line` computes it; `None` for "no line".
    pub fn line_at(&self, instr: u64) -> Option<i32> {
        if instr < self.code_start {
            return Some(self.firstlineno);
        }
        line_for_offset(&self.linetable, self.firstlineno, instr - self.code_start)
    }
}

/// The line of byte offset `offset` into the instructions, from a 3.11+ location table: a
/// sequence of entries, each starting with a byte `1 CCCC LLL` (code, length - 1 in code
/// units), followed by code-specific varints; codes 13 and 14 carry a signed line delta,
/// 10-12 a delta of 0-2, 15 means "no line", 0-9 the same line.
pub fn line_for_offset(table: &[u8], firstlineno: i32, offset: u64) -> Option<i32> {
    let mut line = firstlineno as i64;
    let mut end: u64 = 0;
    let mut i = 0;
    while i < table.len() {
        let head = table[i];
        if head & 0x80 == 0 {
            // Not an entry start: a corrupt table (or one we misread).
            return None;
        }
        let code = (head >> 3) & 15;
        let units = (head & 7) as u64 + 1;
        let delta = match code {
            13 | 14 => signed_varint(table.get(i + 1..)?)?,
            10..=12 => (code - 10) as i64,
            _ => 0,
        };
        line += delta;
        end += units * 2;
        if offset < end {
            return if code == 15 { None } else { Some(line as i32) };
        }
        i += 1;
        while i < table.len() && table[i] & 0x80 == 0 {
            i += 1;
        }
    }
    None
}

/// Location-table varints: 6 bits per byte, least significant first, 0x40 = more follow.
fn varint(bytes: &[u8]) -> Option<u64> {
    let mut v: u64 = 0;
    for (k, b) in bytes.iter().enumerate().take(10) {
        v |= ((b & 0x3f) as u64) << (6 * k);
        if b & 0x40 == 0 {
            return Some(v);
        }
    }
    None
}

fn signed_varint(bytes: &[u8]) -> Option<i64> {
    let v = varint(bytes)?;
    Some(if v & 1 != 0 {
        -((v >> 1) as i64)
    } else {
        (v >> 1) as i64
    })
}

/// One Python sample as BPF sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PySample {
    pub pid: u32,
    pub tid: u32,
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
        flags,
        frames,
    })
}

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
    fn marker(m: &'static str) -> Self {
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
    codes: HashMap<u64, Option<Arc<CodeEntry>>>,
}

struct CodeEntry {
    info: CodeInfo,
    file: Arc<str>,
    function: Arc<str>,
}

/// Per-process Python state of a session: which processes run which CPython, and their code
/// objects.
pub struct PyStacks {
    depth: usize,
    procs: HashMap<u32, ProcState>,
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
    pub fn was_looked_at(&self, pid: u32) -> bool {
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
        self.procs.insert(
            pid,
            ProcState::Python(Box::new(PyProc {
                pid,
                mem,
                layout,
                code_type: interp.code_type,
                codes: HashMap::new(),
            })),
        );
        Ok(Configured::Walk(walk))
    }

    /// [`configure`](Self::configure) and hand the result to BPF. `again`: look again in a
    /// process where no interpreter was found before (it may have loaded libpython since).
    pub fn enable(&mut self, bpf: &mut crate::trace::bpf::Bpf, pid: u32, again: bool) {
        if self.is_known(pid) || (!again && self.was_looked_at(pid)) {
            return;
        }
        match self.configure(pid) {
            Ok(Configured::Walk(layout)) => {
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

    /// The process exited or exec'd: its code objects and interpreter are gone.
    pub fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    /// The text for a call of `pid` that came without a Python sample.
    pub fn without_sample(&self, pid: u32) -> Arc<str> {
        Arc::from(
            match self.procs.get(&pid) {
                Some(ProcState::Unknown(m)) => PyStack::marker(m),
                // A known interpreter whose BPF walk did not run (configured after the call).
                Some(ProcState::Python(_)) => PyStack::marker(NO_THREAD_STATE),
                _ => PyStack::marker(NO_INTERPRETER),
            }
            .text(),
        )
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
            let frame = match p.code(f.code) {
                Some(c) => PyFrame::Code {
                    file: c.file.clone(),
                    line: c.info.line_at(f.instr),
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

impl PyProc {
    fn code(&mut self, addr: u64) -> Option<Arc<CodeEntry>> {
        if let Some(c) = self.codes.get(&addr) {
            return c.clone();
        }
        let entry = read_code(&self.mem, &self.layout, self.code_type, addr)
            .map_err(|e| crate::log::debug(&format!("pid {}: Python frame: {e:#}", self.pid)))
            .ok()
            .map(|info| {
                Arc::new(CodeEntry {
                    file: Arc::from(info.filename.as_str()),
                    function: Arc::from(info.name.as_str()),
                    info,
                })
            });
        // Failures are not cached: a later read may succeed.
        if entry.is_some() {
            self.codes.insert(addr, entry.clone());
        }
        entry
    }
}

fn read_at(mem: &File, addr: u64, len: usize) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    mem.read_exact_at(&mut buf, addr)
        .with_context(|| format!("cannot read {len} bytes at 0x{addr:x}"))?;
    Ok(buf)
}

fn u64_in(b: &[u8], off: u64) -> u64 {
    let o = off as usize;
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// Reads a code object: checks its type, then its names, first line and line table.
pub fn read_code(mem: &File, layout: &PyLayout, code_type: u64, addr: u64) -> Result<CodeInfo> {
    let c = &layout.code;
    let head = read_at(mem, addr, (c.linetable + 8) as usize)?;
    // A freed block's first word is an allocator's free-list pointer (pymalloc keeps the
    // type word, glibc's tcache overwrites it too): not a live object.
    if u64_in(&head, 0) >= 1 << 40 {
        bail!("0x{addr:x} was freed");
    }
    let ty = u64_in(&head, OB_TYPE);
    if ty != code_type {
        bail!("0x{addr:x} is not a code object (type 0x{ty:x}, not 0x{code_type:x})");
    }
    let firstlineno = u64_in(&head, c.firstlineno) as u32 as i32;
    let filename = read_str(mem, layout, u64_in(&head, c.filename))?;
    let name = read_str(mem, layout, u64_in(&head, c.name))?;
    let qualname = read_str(mem, layout, u64_in(&head, c.qualname)).unwrap_or_default();
    let linetable = read_bytes(mem, u64_in(&head, c.linetable))?;
    Ok(CodeInfo {
        filename,
        name,
        qualname,
        firstlineno,
        linetable,
        code_start: addr + c.code_adaptive,
    })
}

/// A `bytes` object's contents (at most 1 MiB).
fn read_bytes(mem: &File, addr: u64) -> Result<Vec<u8>> {
    let head = read_at(mem, addr, BYTES_DATA as usize)?;
    let len = u64_in(&head, OB_SIZE);
    if len > 1 << 20 {
        bail!("bytes object of {len} bytes");
    }
    read_at(mem, addr + BYTES_DATA, len as usize)
}

/// A compact `str` object's text (at most 64 KiB of characters).
fn read_str(mem: &File, layout: &PyLayout, addr: u64) -> Result<String> {
    let head = read_at(mem, addr, (STR_STATE + 4) as usize)?;
    let len = u64_in(&head, STR_LENGTH);
    let state = u32::from_le_bytes(head[STR_STATE as usize..][..4].try_into().unwrap());
    let kind = (state >> 2) & 7;
    let compact = (state >> 5) & 1 != 0;
    let ascii = (state >> 6) & 1 != 0;
    if !compact || len > 1 << 16 {
        bail!("unsupported str object at 0x{addr:x}");
    }
    let data = if ascii {
        addr + layout.ascii_size
    } else {
        addr + layout.compact_size
    };
    let bytes = read_at(mem, data, len as usize * kind.max(1) as usize)?;
    Ok(match kind {
        1 => bytes.iter().map(|&b| b as char).collect(),
        2 => bytes
            .chunks_exact(2)
            .map(|c| char::from_u32(u16::from_le_bytes([c[0], c[1]]) as u32).unwrap_or('?'))
            .collect(),
        4 => bytes
            .chunks_exact(4)
            .map(|c| char::from_u32(u32::from_le_bytes(c.try_into().unwrap())).unwrap_or('?'))
            .collect(),
        _ => bail!("str object of kind {kind} at 0x{addr:x}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_view_puts_each_loops_python_frames_in_its_place() {
        let c = |address, function: &str| memscope_symbols::Frame {
            address,
            module: Some("libpython3.11.so.1.0".into()),
            module_offset: 0,
            function: Some(function.into()),
            file: None,
            line: None,
            inlined: false,
        };
        let py = |function: &str, line, entry| PyFrame::Code {
            file: Arc::from("/s.py"),
            line: Some(line),
            function: Arc::from(function),
            entry,
        };
        let frames = [
            c(0x10, "halMemAlloc"),
            c(0x20, EVAL_LOOP),
            c(0x30, "callback_trampoline"),
            c(0x40, EVAL_LOOP),
            c(0x50, EVAL_LOOP),
            c(0x60, "main"),
        ];
        let stack = PyStack {
            frames: vec![
                py("inner", 3, false),
                py("callback", 7, true),
                PyFrame::Unreadable { entry: false },
                py("<module>", 9, true),
            ],
            end: None,
        };
        assert_eq!(
            mix(&frames, &stack, true),
            "0x0000000000000010 halMemAlloc\n\
             0x0000000000000020 [python] inner at /s.py:3\n\
             0x0000000000000020 [python] callback at /s.py:7\n\
             0x0000000000000030 callback_trampoline\n\
             0x0000000000000040 [python] [python: code object unreadable]\n\
             0x0000000000000040 [python] <module> at /s.py:9\n\
             0x0000000000000050 _PyEval_EvalFrameDefault\n\
             0x0000000000000060 main\n\
             [truncated]"
        );
    }

    /// The bytes of `_PyRuntime`'s initial value in an ELF file.
    fn runtime_image(path: &Path, len: usize) -> Vec<u8> {
        let data = std::fs::read(path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let addr = file
            .dynamic_symbols()
            .find(|s| s.name() == Ok("_PyRuntime"))
            .unwrap()
            .address();
        let section = file
            .sections()
            .find(|s| addr >= s.address() && addr < s.address() + s.size())
            .unwrap();
        let at = (addr - section.address()) as usize;
        section.data().unwrap()[at..at + len].to_vec()
    }

    #[test]
    fn the_313_table_agrees_with_the_interpreters_published_offsets() {
        let Some(lib) = std::fs::read_dir("/root/.pyenv/versions")
            .ok()
            .and_then(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.path().join("lib/libpython3.13.so.1.0"))
                    .find(|p| p.is_file())
            })
        else {
            eprintln!("SKIPPED: no libpython3.13 under /root/.pyenv/versions");
            return;
        };
        let image = runtime_image(&lib, DEBUG_OFFSETS_WORDS * 8);
        assert_eq!(
            layout_from_debug_offsets(&image),
            layout_for(3, 13),
            "{}",
            lib.display()
        );
        // Not a debug-offsets table: no layout from it.
        let mut other = image.clone();
        other[0] = b'X';
        assert_eq!(layout_from_debug_offsets(&other), None);
        // A free-threaded build lays objects out differently.
        let mut ft = image;
        ft[16] = 1;
        assert_eq!(layout_from_debug_offsets(&ft), None);
    }

    #[test]
    fn versions_from_file_names() {
        assert_eq!(version_from_name("libpython3.10.so.1.0"), Some((3, 10)));
        assert_eq!(version_from_name("python3.13"), Some((3, 13)));
        assert_eq!(version_from_name("python"), None);
    }

    #[test]
    fn location_table_lines() {
        // firstlineno 10: [2 units, no-column form, +1] [1 unit, one-line form +2, cols]
        // [3 units, no location] [1 unit, long form, -3, end line 0, cols]
        let table = [
            0x80 | 13 << 3 | 1,
            2, // +1
            0x80 | 12 << 3,
            4,
            5,
            0x80 | 15 << 3 | 2,
            0x80 | 14 << 3,
            7, // -3
            0,
            1,
            2,
        ];
        let at = |o| line_for_offset(&table, 10, o);
        assert_eq!(at(0), Some(11));
        assert_eq!(at(3), Some(11));
        assert_eq!(at(4), Some(13));
        assert_eq!(at(6), None);
        assert_eq!(at(11), None);
        assert_eq!(at(12), Some(10));
        assert_eq!(at(14), None);
    }

    #[test]
    fn varints() {
        assert_eq!(varint(&[0x05]), Some(5));
        assert_eq!(varint(&[0x41, 0x01]), Some(1 | 1 << 6));
        assert_eq!(signed_varint(&[0x03]), Some(-1));
        assert_eq!(signed_varint(&[0x04]), Some(2));
        assert_eq!(varint(&[0x40]), None);
    }
}
