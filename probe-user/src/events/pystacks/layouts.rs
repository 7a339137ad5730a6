//! Which CPython a process runs and where its structures are: the per-version offset tables
//! (`layout_for`), the 3.13+ debug offsets, and finding `_PyRuntime` and `Py_Version`.

use anyhow::{Result, bail};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
use probe_common::{PY_NO_OFFSET, PyProcess};
use std::path::{Path, PathBuf};

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

impl CodeLayout {
    /// Where BPF reads a code object's identity (`co_filename`, `co_name`, `co_qualname`,
    /// `co_linetable`), if the four are neighbours in that order.
    pub fn ids_offset(&self) -> u32 {
        let f = self.filename;
        match u32::try_from(f) {
            Ok(off) if [self.name, self.qualname, self.linetable] == [f + 8, f + 16, f + 24] => off,
            _ => PY_NO_OFFSET,
        }
    }
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
pub(super) const FRAME_OWNED_BY_CSTACK: u64 = 3;
/// `PyObject.ob_type`, `PyVarObject.ob_size`, `PyBytesObject.ob_sval`,
/// `PyASCIIObject.length` and `.state`: the same in 3.11 to 3.13 (64-bit).
pub(super) const OB_TYPE: u64 = 8;
pub(super) const OB_SIZE: u64 = 16;
pub(super) const BYTES_DATA: u64 = 32;
pub(super) const STR_LENGTH: u64 = 16;
pub(super) const STR_STATE: u64 = 32;

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
        tstate_prev: 0,
        tstate_next: 8,
        tstate_native_thread_id,
        tstate_frame,
        cframe_current_frame,
        frame_code,
        frame_previous,
        frame_instr,
        frame_owner,
        frame_is_entry,
        code_ids: PY_NO_OFFSET,
        code_firstlineno: PY_NO_OFFSET,
        str_ascii_data: 0,
        str_compact_data: 0,
        generation: 0,
        tstate_current: PY_NO_OFFSET,
        code_gone: 0,
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
    let mut walk = walk;
    if (major, minor) == (3, 11) {
        // `gilstate` follows `ceval`, whose GIL holds pthread mutexes: 40 bytes each on
        // x86-64's glibc, 48 on aarch64's.
        walk.tstate_current = if cfg!(target_arch = "aarch64") {
            592
        } else {
            576
        };
    }
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
    // BPF loads pointer fields from its copies as aligned words.
    let frame_word = |i: usize| -> Option<u32> { frame_field(i).filter(|o| o.is_multiple_of(8)) };
    // The fields BPF reads out of one `PY_TSTATE_READ`-byte copy of a thread state.
    let tstate_field = |i: usize| -> Option<u32> {
        small(i)
            .filter(|o| (*o as usize) + 8 <= probe_common::PY_TSTATE_READ && o.is_multiple_of(8))
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
            tstate_prev: tstate_field(20)?,
            tstate_next: tstate_field(21)?,
            tstate_native_thread_id: tstate_field(25)?,
            tstate_frame: tstate_field(23)?,
            cframe_current_frame: PY_NO_OFFSET,
            frame_code: frame_word(30)?,
            frame_previous: frame_word(29)?,
            frame_instr: frame_word(31)?,
            frame_owner: frame_field(33)?,
            frame_is_entry: PY_NO_OFFSET,
            code_ids: PY_NO_OFFSET,
            ..base.walk
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
pub(super) const DEBUG_OFFSETS_WORDS: usize = 44;

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
        let file = m.map_files_path(pid);
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

pub(super) struct RuntimeSymbols {
    runtime: u64,
    code_type: u64,
    version: Option<u64>,
    /// Virtual address of the segment that starts at file offset 0.
    first_vaddr: u64,
}

/// `_PyRuntime`, `PyCode_Type` and the value of `Py_Version` in an ELF image; `None` when it
/// does not define `_PyRuntime`.
pub(super) fn runtime_symbols(data: &[u8]) -> Result<Option<RuntimeSymbols>> {
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
pub(super) fn version_from_name(name: &str) -> Option<(u8, u8)> {
    let rest = name
        .strip_prefix("libpython")
        .or_else(|| name.strip_prefix("python"))?;
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}
