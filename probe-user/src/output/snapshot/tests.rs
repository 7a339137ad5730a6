use super::*;
use std::borrow::Cow;

fn row(event: &'static str, event_type: &'static str, ptr: u64, size: u64, py: &str) -> Row {
    Row {
        event,
        event_type,
        name: Cow::Borrowed("N/A"),
        ts_ns: 5_000,
        pid: 1,
        tid: 1,
        device: DeviceKey::Npu(0),
        ptr: Some(ptr),
        size: Some(size),
        attr: String::new(),
        c_stack: None,
        py_stack: (!py.is_empty()).then(|| Arc::from(py)),
    }
}

fn get<'a>(v: &'a Value, key: &str) -> &'a Value {
    match v {
        Value::Dict(pairs) => &pairs.iter().find(|(k, _)| *k == key).unwrap().1,
        Value::Shared(s) => get(s, key),
        _ => panic!("not a dict: {v:?}"),
    }
}

fn list(v: &Value) -> &[Value] {
    match v {
        Value::List(items) => items,
        Value::Shared(s) => list(s),
        _ => panic!("not a list: {v:?}"),
    }
}

/// Blocks and gaps of a segment; a driver allocation no pool block was seen in is no segment.
#[test]
fn segments_hold_live_blocks_and_gaps() {
    let mut r = SnapshotRecorder::new(false);
    r.row(&row(
        "MALLOC",
        "HAL",
        0x1000_0000,
        20 << 20,
        "t.py(4): <module>",
    ));
    r.row(&row("MALLOC", "HAL", 0x9000_0000, 4096, ""));
    r.row(&row(
        "MALLOC",
        "PTA",
        0x1000_0000,
        0x1000,
        "t.py(4): <module>",
    ));
    r.row(&row(
        "MALLOC",
        "PTA",
        0x1000_1000,
        0x2000,
        "t.py(5): <module>",
    ));
    r.row(&row(
        "MALLOC",
        "PTA",
        0x1000_3000,
        0x1000,
        "t.py(6): <module>",
    ));
    r.row(&row(
        "FREE",
        "PTA",
        0x1000_1000,
        0x2000,
        "t.py(7): <module>",
    ));
    let v = r.value();
    let segs = list(get(&v, "segments"));
    assert_eq!(
        segs.len(),
        1,
        "the driver block with no pool block is no segment"
    );
    let blocks: Vec<(i128, i128, String)> = list(get(&segs[0], "blocks"))
        .iter()
        .map(|b| {
            let (Value::Int(a), Value::Int(s), Value::Str(st)) =
                (get(b, "address"), get(b, "size"), get(b, "state"))
            else {
                panic!()
            };
            (*a, *s, st.clone())
        })
        .collect();
    let (base, total) = (0x1000_0000i128, 20i128 << 20);
    assert_eq!(
        blocks,
        vec![
            (base, 0x1000, "active_allocated".into()),
            (base + 0x1000, 0x2000, "inactive".into()),
            (base + 0x3000, 0x1000, "active_allocated".into()),
            (base + 0x4000, total - 0x4000, "inactive".into()),
        ]
    );
    assert_eq!(get(&segs[0], "allocated_size"), &Value::Int(0x2000));
    let actions: Vec<String> = list(&list(get(&v, "device_traces"))[0])
        .iter()
        .map(|e| match get(e, "action") {
            Value::Str(s) => s.clone(),
            _ => panic!(),
        })
        .collect();
    assert_eq!(
        actions,
        [
            "segment_alloc",
            "alloc",
            "alloc",
            "alloc",
            "free_requested",
            "free_completed"
        ]
    );
}

/// Python frames go where the interpreter loop runs them; symbolized C frames keep file:line.
#[test]
fn frames_interleave_c_and_python() {
    let c = "0x00007f01 device_malloc at /src/cann_acl.c:43\n\
             0x00007f02 libtorch_npu.so+0xda512a\n\
             0x00007f03 [inlined] binary_op1 at /py/abstract.c:893\n\
             0x00007f04 _PyEval_EvalFrameDefault at /py/ceval.c:5548\n\
             0x00007f05 _start\n\
             [truncated]\"";
    let py = "/t/train.py(12): step\n/t/train.py(40): main";
    let names: Vec<(String, i128, String)> = list(&frames_of(Some(c), Some(py)))
        .iter()
        .map(|f| {
            let (Value::Str(file), Value::Int(line), Value::Str(name)) =
                (get(f, "filename"), get(f, "line"), get(f, "name"))
            else {
                panic!()
            };
            (file.clone(), *line, name.clone())
        })
        .collect();
    let want = [
        ("/src/cann_acl.c", 43, "device_malloc"),
        ("libtorch_npu.so", 0, "libtorch_npu.so+0xda512a"),
        ("/py/abstract.c", 893, "binary_op1"),
        ("/t/train.py", 12, "step"),
        ("/t/train.py", 40, "main"),
        ("/py/ceval.c", 5548, "_PyEval_EvalFrameDefault"),
        ("??", 0, "_start"),
        ("??", 0, "[truncated]"),
    ];
    let want: Vec<(String, i128, String)> = want
        .iter()
        .map(|(f, l, n)| (f.to_string(), *l, n.to_string()))
        .collect();
    assert_eq!(names, want);
}

/// A pool block in no segment seen (its segment came before an attach) is left out and
/// counted: memory_viz draws every block inside its segment.
#[test]
fn blocks_outside_every_known_segment_are_counted_not_drawn() {
    let mut r = SnapshotRecorder::new(true);
    r.row(&row("MALLOC", "PTA", 0x5000_0000, 0x1000, ""));
    r.row(&row("FREE", "PTA", 0x5000_0000, 0x1000, ""));
    r.row(&row("MALLOC", "HAL", 0x1000_0000, 2 << 20, ""));
    r.row(&row("MALLOC", "PTA", 0x1000_0000, 0x1000, ""));
    let v = r.value();
    assert_eq!(
        list(&list(get(&v, "device_traces"))[0]).len(),
        2,
        "segment_alloc, alloc"
    );
    let meta = get(&v, "memscope_bpf");
    assert_eq!(
        get(meta, "pool_rows_outside_known_segments"),
        &Value::Int(2)
    );
    assert_eq!(get(meta, "attached"), &Value::Bool(true));
    let segs = list(get(&v, "segments"));
    assert_eq!(get(&segs[0], "segment_type"), &Value::Str("small".into()));
}
