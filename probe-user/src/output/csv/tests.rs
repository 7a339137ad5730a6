use super::*;
use file::whole_lines;

fn row(device: DeviceKey, event: &'static str) -> Row {
    Row {
        event,
        event_type: "HAL",
        name: "N/A".into(),
        ts_ns: 5,
        pid: 7,
        tid: 8,
        device,
        ptr: Some(0x3039),
        size: None,
        attr: "allocation_id:1,addr:0x0000000000003039,size:10,used:10".into(),
        c_stack: None,
        py_stack: None,
    }
}

#[test]
fn row_format_matches_msmemscope() {
    let mut r = row(DeviceKey::Npu(0), "MALLOC");
    r.event_type = "PTA";
    r.ts_ns = 3;
    r.pid = 123;
    r.tid = 1234;
    r.attr = "allocation_id:1,addr:0x0000000000003039,size:10,used:10,total:10".into();
    assert_eq!(
        r.format(3),
        "3,MALLOC,PTA,N/A,3,123,1234,0,0x0000000000003039,\"{allocation_id:1,addr:0x0000000000003039,size:10,used:10,total:10}\",,\n"
    );
    let mut sys = row(DeviceKey::NotApplicable, "SYSTEM");
    sys.ptr = None;
    sys.attr.clear();
    sys.event_type = "ACL_INIT";
    assert_eq!(sys.format(0), "0,SYSTEM,ACL_INIT,N/A,5,7,8,N/A,N/A,,,\n");
    assert_eq!(quote_text("a\"b\nc"), "\"a\"\"b c\"");
}

#[test]
fn digits_match_std_formatting() {
    let mut vals = vec![
        0,
        1,
        9,
        10,
        11,
        99,
        100,
        101,
        999,
        1000,
        u64::MAX,
        u64::MAX - 1,
    ];
    for k in 0..20 {
        let p = 10u64.pow(k);
        vals.extend([p - 1, p, p + 1]);
    }
    for v in vals {
        let mut out = b"x".to_vec();
        push_u64(&mut out, v);
        assert_eq!(out, format!("x{v}").as_bytes());
        let mut out = Vec::new();
        push_hex16(&mut out, v);
        assert_eq!(out, format!("0x{v:016x}").as_bytes());
    }
}

#[test]
fn whole_lines_skip_newlines_inside_quotes() {
    let text = b"h\n1,\"a\nb\"\n2,\"\"\"x\n";
    assert_eq!(whole_lines(text), (10, 2));
    assert_eq!(whole_lines(b"partial"), (0, 0));
}

#[test]
fn device_less_rows_reach_every_device_file() {
    let root = std::env::temp_dir().join(format!("memscope-csv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let mut out = ProcessOutput::new(&root, 7, "{}".into());
    let mut na = row(DeviceKey::NotApplicable, "SYSTEM");
    na.ptr = None;
    na.attr.clear();
    out.write(na.clone()).unwrap(); // id 0, before any device file
    out.write(row(DeviceKey::Npu(0), "MALLOC")).unwrap(); // id 1
    out.write(row(DeviceKey::Npu(1), "MALLOC")).unwrap(); // id 2
    out.write(na).unwrap(); // id 3, into both
    out.finish().unwrap();
    let files = out.dump_files();
    assert_eq!(files.len(), 2);
    let d0 = std::fs::read_to_string(&files[0]).unwrap();
    let d1 = std::fs::read_to_string(&files[1]).unwrap();
    let ids = |s: &str| -> Vec<String> {
        s.lines()
            .skip(1)
            .map(|l| l.split(',').next().unwrap().to_string())
            .collect()
    };
    assert_eq!(d0.lines().next().unwrap(), CSV_HEADER);
    assert_eq!(ids(&d0), ["0", "1", "3"]);
    assert_eq!(ids(&d1), ["0", "2", "3"]);
    assert!(d0.contains("0,SYSTEM,HAL,N/A,5,7,8,N/A,N/A,,,"));
    assert!(out.process_dir().join("config.json").exists());
    std::fs::remove_dir_all(&root).unwrap();
}

/// Issue 27: rotation deleting the oldest files of a second must not hand their names to the
/// next files: sorted by name (`memscope_dump_<ts>[_<n>].csv`, n as a number), the files are
/// in the order they were written.
#[test]
fn rotated_files_sort_by_name_in_time_order() {
    let root = std::env::temp_dir().join(format!("memscope-rotate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let mut out = ProcessOutput::new(&root, 7, "{}".into());
    // Every flushed file is full: each row gets a file of its own; two are left at the end
    // (three kept, one of them the next file, never started without a row for it).
    out.rotate(1, Some(3));
    for _ in 0..10 {
        out.write(row(DeviceKey::Npu(0), "MALLOC")).unwrap();
        out.flush().unwrap();
    }
    out.finish().unwrap();
    let dir = out.process_dir().join("device_0/dump");
    let mut files: Vec<((String, u32), u64)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            let stem = name.trim_end_matches(".csv");
            // memscope_dump_<ts> or memscope_dump_<ts>_<n>
            let parts: Vec<&str> = stem.split('_').collect();
            let key = match parts.as_slice() {
                [_, _, ts] => (ts.to_string(), 0),
                [_, _, ts, n] => (ts.to_string(), n.parse().unwrap()),
                _ => panic!("{name}"),
            };
            let text = std::fs::read_to_string(dir.join(&name)).unwrap();
            let first_id = text.lines().nth(1).unwrap().split(',').next().unwrap();
            (key, first_id.parse().unwrap())
        })
        .collect();
    files.sort();
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(
        files.windows(2).all(|w| w[0].1 < w[1].1),
        "name order is not write order: {files:?}"
    );
    assert_eq!(
        files[1].1, 9,
        "the newest file holds the last row: {files:?}"
    );
    std::fs::remove_dir_all(&root).unwrap();
}
