//! End-to-end: ATen operators and accesses (msMemScope's mstx text protocol), kernel launches
//! and the inefficient-memory analysis, against tests/fixtures/src/op_workload.c, whose log
//! says what it did and which blocks are inefficient by msMemScope's definitions.

mod common;

use std::collections::BTreeMap;

use common::*;

#[test]
fn operators_accesses_launches_and_inefficient_blocks() {
    if !require_root("operators_accesses_launches_and_inefficient_blocks") {
        return;
    }
    let _serial = serial();
    let dir = scratch("ops");
    let log = dir.join("gt.log");
    let out_dir = dir.join("out");
    let out = run_tracer(&[
        "-o",
        out_dir.to_str().unwrap(),
        "--level=op,kernel",
        "--events=alloc,free,launch,access",
        "--analysis=leaks,inefficient",
        "--",
        bin("op_workload").to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let text = std::fs::read_to_string(&log).unwrap();
    let pid: u32 = log_lines(&text, "SUMMARY")[0]["pid"].parse().unwrap();
    let dump = std::fs::read_to_string(
        &find_files(&process_dir(&out_dir, pid).unwrap(), "memscope_dump_")[0],
    )
    .unwrap();
    let rows = parse_dump_records(&dump);
    let of = |event: &str, ty: &str| -> Vec<&Vec<String>> {
        rows.iter()
            .filter(|r| r[1] == event && r[2] == ty)
            .collect()
    };

    // Operators: every begin and end, named as the marks name them.
    let begins = log_lines(&text, "OP_BEGIN");
    assert_eq!(of("OP_LAUNCH", "ATEN_START").len(), begins.len());
    assert_eq!(
        of("OP_LAUNCH", "ATEN_END").len(),
        log_lines(&text, "OP_END").len()
    );
    for (row, b) in of("OP_LAUNCH", "ATEN_START").iter().zip(&begins) {
        assert_eq!(row[3], format!("torch._ops.aten.{}.default", b["name"]));
    }
    // No MSTX rows for the protocol marks.
    assert!(
        rows.iter()
            .all(|r| !(r[1] == "MSTX" && r[3].contains("memscope-aten")))
    );

    // Accesses: each one, in order, with its kind, address and the block it falls in.
    let accesses = log_lines(&text, "ACCESS");
    let rows_ac: Vec<_> = rows.iter().filter(|r| r[1] == "ACCESS").collect();
    assert_eq!(rows_ac.len(), accesses.len());
    for (row, a) in rows_ac.iter().zip(&accesses) {
        assert_eq!(row[2], a["kind"]);
        assert_eq!(hex(&row[8]), hex(a["addr"]));
        assert_eq!(row[3], format!("torch._ops.aten.{}.default", a["op"]));
        assert!(
            row[9].contains("type:PTA,dtype:torch.float16,shape:torch.Size("),
            "{}",
            row[9]
        );
    }

    // Kernel launches: names (stub functions symbolized, AICPU names, handles) and streams.
    let launches = log_lines(&text, "LAUNCH");
    let rows_kl = of("KERNEL_LAUNCH", "KERNEL_LAUNCH");
    assert_eq!(rows_kl.len(), launches.len());
    let mut streams: Vec<&str> = Vec::new();
    let mut tasks: BTreeMap<&str, u64> = BTreeMap::new();
    for (row, l) in rows_kl.iter().zip(&launches) {
        assert_eq!(row[3], l["kernel"], "launch through {}", l["api"]);
        if !streams.contains(&l["stream"]) {
            streams.push(l["stream"]);
        }
        let sid = streams.iter().position(|s| *s == l["stream"]).unwrap();
        let task = tasks.entry(l["stream"]).or_default();
        assert_eq!(row[9], format!("{{streamId:{sid},taskId:{task}}}"));
        *task += 1;
    }

    // Inefficient memory: exactly the blocks the workload built to be, with their types, on
    // their FREE rows; and the per-block CSV.
    let expect = log_lines(&text, "EXPECT");
    assert_eq!(expect.len(), 30);
    let frees: BTreeMap<u64, &Vec<String>> = rows
        .iter()
        .filter(|r| r[1] == "FREE" && r[2] == "PTA")
        .map(|r| (hex(&r[8]), r))
        .collect();
    let mut flagged = 0;
    for e in &expect {
        let free = frees[&hex(e["addr"])];
        let got = free[9]
            .split("inefficient_type:")
            .nth(1)
            .map(|t| t.trim_end_matches('}').to_string());
        match e["inefficient"] {
            "none" => assert_eq!(got, None, "block {}", e["block"]),
            want => {
                flagged += 1;
                assert_eq!(got.as_deref(), Some(want), "block {}", e["block"]);
            }
        }
    }
    let csv = std::fs::read_to_string(
        &find_files(&process_dir(&out_dir, pid).unwrap(), "inefficient_")[0],
    )
    .unwrap();
    assert_eq!(csv.lines().count(), flagged + 1);
    assert!(
        stderr.contains(&format!("inefficient memory: {flagged} block(s)")),
        "{stderr}"
    );

    // Offline: `analyze` on the saved dump flags the same blocks with the same types.
    let dump_path = find_files(&process_dir(&out_dir, pid).unwrap(), "memscope_dump_")[0].clone();
    let offline_dir = dir.join("offline");
    let out = run_tracer(&[
        "analyze",
        "--input",
        dump_path.to_str().unwrap(),
        "-o",
        offline_dir.to_str().unwrap(),
    ]);
    let offline_stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{offline_stderr}");
    let offline_csv =
        std::fs::read_to_string(&find_files(&offline_dir, "inefficient_")[0]).unwrap();
    let sorted = |t: &str| {
        let mut v: Vec<String> = t.lines().map(str::to_string).collect();
        v.sort();
        v
    };
    assert_eq!(sorted(&offline_csv), sorted(&csv));
    assert!(
        offline_stderr.contains(&format!("inefficient memory: {flagged} block(s)")),
        "{offline_stderr}"
    );
}

#[test]
fn default_options_write_operators_but_not_accesses_or_kernel_launches() {
    if !require_root("default_options_write_operators_but_not_accesses_or_kernel_launches") {
        return;
    }
    let _serial = serial();
    let dir = scratch("ops-default");
    let log = dir.join("gt.log");
    let out_dir = dir.join("out");
    let out = run_tracer(&[
        "-o",
        out_dir.to_str().unwrap(),
        "--",
        bin("op_workload").to_str().unwrap(),
        "--steps",
        "1",
        "--log",
        log.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    let pid: u32 = log_lines(&text, "SUMMARY")[0]["pid"].parse().unwrap();
    let dump = std::fs::read_to_string(
        &find_files(&process_dir(&out_dir, pid).unwrap(), "memscope_dump_")[0],
    )
    .unwrap();
    let rows = parse_dump_records(&dump);
    let count = |e: &str| rows.iter().filter(|r| r[1] == e).count();
    assert_eq!(count("OP_LAUNCH"), 2 * log_lines(&text, "OP_BEGIN").len());
    assert_eq!((count("ACCESS"), count("KERNEL_LAUNCH")), (0, 0));
    assert!(!rows.iter().any(|r| r[9].contains("inefficient_type")));
}
