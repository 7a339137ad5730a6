//! End-to-end: ATB operators, kernels and tensor accesses (spec §1.8) from the simulated
//! C++ libatb.so (tests/fixtures/src/atb.cpp), whose log lists what the tracer must report:
//! a runner with two kernels whose first kernel runs a nested runner, executed several times.

mod common;

use common::*;

/// One start/end row with the accesses that follow it (their order among themselves is the
/// order the probes on one instruction ran in, which the kernel does not fix).
#[derive(Debug, PartialEq, Eq)]
struct Group {
    head: (String, String, String, String),
    accesses: Vec<(String, String, u64, String)>,
}

struct Traced {
    log: String,
    rows: Vec<Vec<String>>,
    stderr: String,
}

fn trace(name: &str, level: &str, events: &str, iters: &str) -> Traced {
    trace_with(name, level, events, &["--iters", iters])
}

fn trace_with(name: &str, level: &str, events: &str, workload_args: &[&str]) -> Traced {
    let dir = scratch(name);
    let log = dir.join("gt.log");
    let out_dir = dir.join("out");
    let workload = bin("atb_workload");
    let mut args = vec![
        "-o",
        out_dir.to_str().unwrap(),
        level,
        events,
        "--",
        workload.to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
    ];
    args.extend_from_slice(workload_args);
    let out = run_tracer(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let log = std::fs::read_to_string(&log).unwrap();
    let pid: u32 = log
        .lines()
        .find(|l| l.starts_with("SUMMARY "))
        .map(|l| log_fields(l)["pid"].parse().unwrap())
        .unwrap();
    let dump = std::fs::read_to_string(
        &find_files(&process_dir(&out_dir, pid).unwrap(), "memscope_dump_")[0],
    )
    .unwrap();
    Traced {
        log,
        rows: parse_dump_records(&dump),
        stderr,
    }
}

/// The groups the workload's log says the tracer must write.
fn expected_groups(log: &str, ops: bool, kernels: bool, accesses: bool) -> Vec<Group> {
    // The allocation id of each pool region, by address, for the accesses' Attr.
    let regions: Vec<(u64, u64)> = log
        .lines()
        .filter(|l| l.starts_with("ATB_POOL_REGION "))
        .map(|l| {
            let f = log_fields(l);
            (hex(f["addr"]), f["size"].parse().unwrap())
        })
        .collect();
    let mut groups: Vec<Group> = Vec::new();
    for line in log.lines() {
        let f = log_fields(line);
        let kind = line.split(' ').next().unwrap();
        match kind {
            "ATB_OP" | "ATB_KERNEL" => {
                let op = kind == "ATB_OP";
                // Accesses do not depend on --level (spec §2.5): without their start or
                // end row they follow the previous row that is written.
                if !(if op { ops } else { kernels }) {
                    continue;
                }
                let start = f["phase"] == "start";
                let head = if op {
                    (
                        "OP_LAUNCH".to_string(),
                        if start { "ATB_START" } else { "ATB_END" }.to_string(),
                        f["name"].to_string(),
                        format!(
                            "{{path:{},workspace_ptr:{},workspace_size:{}}}",
                            f["path"], f["ws_ptr"], f["ws_size"]
                        ),
                    )
                } else {
                    (
                        "KERNEL_LAUNCH".to_string(),
                        if start { "KERNEL_START" } else { "KERNEL_END" }.to_string(),
                        f["name"].to_string(),
                        format!("{{path:{}}}", f["path"]),
                    )
                };
                groups.push(Group {
                    head,
                    accesses: Vec::new(),
                });
            }
            "ATB_ACCESS" | "ATB_KERNEL_ACCESS" if accesses => {
                let addr = hex(f["addr"]);
                let (index, (base, size)) = regions
                    .iter()
                    .enumerate()
                    .find(|(_, (b, s))| *b <= addr && addr < b + s)
                    .expect("every tensor lies in a pool region");
                // Allocation ids: 1 is the HAL segment, the regions follow in order.
                let attr = format!(
                    "{{allocation_id:{},addr:0x{base:016x},size:{size},type:ATB,dtype:{},format:{},shape:{}}}",
                    index + 2,
                    f["dtype"],
                    f["format"],
                    f["shape"]
                );
                let g = last_group(&mut groups);
                g.accesses
                    .push((f["kind"].to_string(), f["owner"].to_string(), addr, attr));
                g.accesses.sort();
            }
            _ => {}
        }
    }
    groups
}

/// Accesses before any start or end row go to a group with an empty head.
fn last_group(groups: &mut Vec<Group>) -> &mut Group {
    if groups.is_empty() {
        groups.push(Group {
            head: Default::default(),
            accesses: Vec::new(),
        });
    }
    groups.last_mut().unwrap()
}

fn traced_groups(rows: &[Vec<String>]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for r in rows {
        match (r[1].as_str(), r[2].as_str()) {
            ("OP_LAUNCH", _) | ("KERNEL_LAUNCH", _) => groups.push(Group {
                head: (r[1].clone(), r[2].clone(), r[3].clone(), r[9].clone()),
                accesses: Vec::new(),
            }),
            ("ACCESS", _) => {
                let g = last_group(&mut groups);
                g.accesses
                    .push((r[2].clone(), r[3].clone(), hex(&r[8]), r[9].clone()));
                g.accesses.sort();
            }
            _ => {}
        }
    }
    groups
}

#[test]
fn atb_operators_kernels_and_accesses_nested_and_repeated() {
    if !require_root("atb_operators_kernels_and_accesses_nested_and_repeated") {
        return;
    }
    let _serial = serial();
    let t = trace(
        "atb_all",
        "--level=op,kernel",
        "--events=alloc,free,launch,access",
        "3",
    );
    let want = expected_groups(&t.log, true, true, true);
    // 3 executions x (parent start/end + child start/end + 3 kernels x start/end).
    assert_eq!(want.len(), 3 * (4 + 6));
    // The summary counts them: 6 operators, 9 ATB kernels, 26 accesses per execution.
    assert!(
        t.stderr.contains(
            "6 pool malloc, 6 pool free, 6 operator, 0 kernel launch, 9 ATB kernel, 78 access"
        ),
        "{}",
        t.stderr
    );
    let got = traced_groups(&t.rows);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "group {i}");
    }
    // The nested runner's rows lie inside its parent's first kernel.
    let heads: Vec<&str> = got.iter().take(6).map(|g| g.head.2.as_str()).collect();
    assert_eq!(
        heads,
        [
            "LinearOperationWithBias",
            "MatMulKernel",
            "AddOperation",
            "AddKernel",
            "AddKernel",
            "AddOperation"
        ]
    );
    // Every ATB row is on the device the thread set, and the operator rows have no address.
    for r in t.rows.iter().filter(|r| r[1] != "MALLOC" && r[1] != "FREE") {
        assert_eq!(r[7], "0", "{r:?}");
        if r[1] != "ACCESS" {
            assert_eq!(r[8], "N/A", "{r:?}");
        }
    }
}

#[test]
fn atb_rows_follow_level_and_events() {
    if !require_root("atb_rows_follow_level_and_events") {
        return;
    }
    let _serial = serial();
    // Operators only, no accesses: ATB_START/ATB_END and nothing else of ATB's.
    let t = trace("atb_op", "--level=op", "--events=alloc,free,launch", "2");
    let want = expected_groups(&t.log, true, false, false);
    assert_eq!(want.len(), 2 * 4);
    assert_eq!(traced_groups(&t.rows), want);
    assert!(
        t.rows
            .iter()
            .all(|r| r[1] != "ACCESS" && r[1] != "KERNEL_LAUNCH")
    );
    // Kernels with accesses, no operator rows (their accesses are still written).
    let t = trace(
        "atb_kernel",
        "--level=kernel",
        "--events=alloc,free,launch,access",
        "1",
    );
    let want = expected_groups(&t.log, false, true, true);
    assert_eq!(want.len(), 1 + 6);
    // Per execution: operators 6 + 4, kernels 6 + 6 + 4.
    assert_eq!(want.iter().map(|g| g.accesses.len()).sum::<usize>(), 26);
    assert_eq!(traced_groups(&t.rows), want);
    assert!(t.rows.iter().all(|r| r[1] != "OP_LAUNCH"));
}

/// A C++ exception thrown out of Runner::Execute reaches the program's catch: the return
/// probes sit on the function's return instructions, not in a uretprobe trampoline (through
/// which the unwinder cannot go: the program would die in std::terminate).
#[test]
fn an_exception_thrown_through_runner_execute_reaches_its_catch() {
    if !require_root("an_exception_thrown_through_runner_execute_reaches_its_catch") {
        return;
    }
    let _serial = serial();
    let t = trace_with(
        "atb_throw",
        "--level=op,kernel",
        "--events=alloc,free,launch,access",
        &["--iters", "1", "--throw"],
    );
    assert!(
        t.log.contains("ATB_CAUGHT what=ThrowingKernel failed"),
        "{}",
        t.log
    );
    // The failed operator has its start and its kernel's start, no end; the operator run
    // after it is complete.
    let want = expected_groups(&t.log, true, true, true);
    assert_eq!(want.len(), 10 + 2 + 10);
    assert_eq!(traced_groups(&t.rows), want);
}
