use super::layouts::version_from_name;
use super::memory::{signed_varint, varint};
use super::*;
use object::{Object, ObjectSection, ObjectSymbol};
use std::path::Path;

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

#[test]
fn a_code_record_gives_back_the_names_and_line_table_bpf_copied() {
    use probe_common::{PY_CODE_HEADER, PYCODE_KIND, PyCodeEvent, py_code_flags};
    // SAFETY: plain integers and byte arrays; all zeroes is a valid value.
    let mut ev: PyCodeEvent = unsafe { std::mem::zeroed() };
    ev.kind = PYCODE_KIND;
    ev.pid = 42;
    ev.code = 0x7f00_0000_1000;
    ev.ids = 0xdead_beef;
    ev.firstlineno = 17;
    ev.file[..6].copy_from_slice(b"/a.py\0");
    ev.file_len = 5;
    ev.file_kind = 1;
    // "é" as a 2-byte-wide string, "fn" as 4-byte.
    ev.name[..2].copy_from_slice(&0xe9u16.to_le_bytes());
    ev.name_len = 2;
    ev.name_kind = 2;
    ev.qualname[..8].copy_from_slice(&[b'f', 0, 0, 0, b'n', 0, 0, 0]);
    ev.qualname_len = 8;
    ev.qualname_kind = 4;
    ev.table[..3].copy_from_slice(&[0x80 | (13 << 3), 0x04, 0x80]);
    ev.table_len = 3;
    ev.table_full_len = 3;
    let bytes = unsafe {
        std::slice::from_raw_parts(
            &ev as *const PyCodeEvent as *const u8,
            PY_CODE_HEADER + ev.table_len as usize,
        )
    };
    let r = code_record_from_bytes(bytes).expect("a code record");
    assert_eq!(
        (r.pid, r.code, r.ids, r.flags),
        (42, 0x7f00_0000_1000, 0xdead_beef, 0)
    );
    assert_eq!((r.filename.as_str(), r.name.as_str()), ("/a.py", "é"));
    assert_eq!((r.qualname.as_str(), r.firstlineno), ("fn", 17));
    assert_eq!(r.linetable, [0x80 | (13 << 3), 0x04, 0x80]);
    assert!(r.table_complete);
    // The line table's first entry: line 17 + 2 for its first 2 bytes of code.
    assert_eq!(line_for_offset(&r.linetable, r.firstlineno, 0), Some(19));

    // A table cut by BPF says so; anything that is not a code record is not taken.
    ev.table_full_len = 9000;
    ev.flags = py_code_flags::CUT;
    let bytes = unsafe {
        std::slice::from_raw_parts(
            &ev as *const PyCodeEvent as *const u8,
            PY_CODE_HEADER + ev.table_len as usize,
        )
    };
    assert!(!code_record_from_bytes(bytes).unwrap().table_complete);
    assert!(code_record_from_bytes(&bytes[..PY_CODE_HEADER - 1]).is_none());
    ev.kind = probe_common::PYSTACK_KIND;
    let bytes = unsafe {
        std::slice::from_raw_parts(&ev as *const PyCodeEvent as *const u8, PY_CODE_HEADER)
    };
    assert!(code_record_from_bytes(bytes).is_none());
}

#[test]
fn a_thread_states_fields_fit_one_read() {
    // BPF checks a cached thread state from one copy of its first PY_TSTATE_READ bytes.
    for minor in 11..=13 {
        let w = layout_for(3, minor).unwrap().walk;
        for off in [
            w.tstate_prev,
            w.tstate_next,
            w.tstate_native_thread_id,
            w.tstate_frame,
        ] {
            assert!(
                off as usize + 8 <= probe_common::PY_TSTATE_READ,
                "3.{minor}: {off}"
            );
        }
        // BPF loads these from its copies as aligned words.
        for off in [
            w.tstate_prev,
            w.tstate_next,
            w.tstate_native_thread_id,
            w.tstate_frame,
            w.frame_code,
            w.frame_previous,
            w.frame_instr,
        ] {
            assert_eq!(off % 8, 0, "3.{minor}: {off} is not a word's offset");
        }
        if w.tstate_current != probe_common::PY_NO_OFFSET {
            let span = (w.tstate_current + 8 - w.interpreters_head) as usize;
            assert!(
                span < probe_common::PY_RUNTIME_READ && span.is_multiple_of(8),
                "3.{minor}"
            );
        }
    }
}

#[test]
fn a_resolved_stack_is_remembered_only_for_the_same_code_objects() {
    let layout = layouts::layout_for(3, 11).expect("3.11's layout");
    let code_start = layout.code.code_adaptive;
    let mut py = PyStacks::new(16);
    py.procs.insert(
        42,
        ProcState::Python(Box::new(PyProc {
            pid: 42,
            mem: File::open("/dev/null").unwrap(),
            layout,
            code_type: 0,
            codes: HashMap::new(),
            lines: HashMap::new(),
            stacks: HashMap::new(),
        })),
    );
    let code = 0x7f00_0000_1000;
    // Two code objects made at the same address one after the other (an `exec` in a loop):
    // their identities differ. Line tables: one entry, line firstlineno + 2 / + 5.
    let learn = |py: &mut PyStacks, ids, file: &str, delta: u8| {
        py.learn(CodeRecord {
            pid: 42,
            code,
            ids,
            flags: 0,
            filename: file.into(),
            name: "f".into(),
            qualname: "f".into(),
            firstlineno: 10,
            linetable: vec![0x80 | (13 << 3) | 7, delta << 1],
            table_complete: true,
        })
    };
    learn(&mut py, 1, "/first.py", 2);
    let sample = |meta| PySample {
        pid: 42,
        tid: 42,
        ts_ns: 0,
        flags: 0,
        frames: vec![PyFrameRecord {
            code,
            instr: code + code_start + 4,
            meta,
        }],
    };
    let with_ids = |ids: u64| PY_FRAME_HAS_IDS | (ids << 32);
    let (first, text) = py.resolve_text(&sample(with_ids(1)));
    assert_eq!(&*text, "/first.py(12): f\n");
    // The same frames again: the stack resolved before, not a new one.
    let (again, _) = py.resolve_text(&sample(with_ids(1)));
    assert!(Arc::ptr_eq(&first, &again));
    // Another code object at the same address is named anew.
    learn(&mut py, 2, "/second.py", 5);
    let (_, text) = py.resolve_text(&sample(with_ids(2)));
    assert_eq!(&*text, "/second.py(15): f\n");
    // A frame without its code object's identity is never remembered.
    let (one, _) = py.resolve_text(&sample(0));
    let (two, _) = py.resolve_text(&sample(0));
    assert!(!Arc::ptr_eq(&one, &two));
}
