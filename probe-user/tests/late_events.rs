//! A call that returns long after it began (a free waiting for the device) while another thread
//! of the same process goes on: the free is dated at its entry, but its event reaches the tracer
//! only at its return, after the reorder window has let the other thread's later events through.
//! Nothing may be lost, the free's row comes after rows dated later, and the tracer says so.

mod common;

use common::*;
use std::process::Command;

/// Traces tests/fixtures/python/slow_free.py with the HAL's first free held `slow_ms` (if any).
/// Returns the tracer's stderr, the program's log and the process's dump rows.
fn trace(name: &str, slow_ms: Option<u32>) -> (String, String, Vec<DumpRow>) {
    let dir = scratch(name);
    let out_dir = dir.join("out");
    let log = dir.join("gt.log");
    let script = repo_root().join("tests/fixtures/python/slow_free.py");
    let mut tracer = Command::new(TRACER);
    tracer
        .env_remove("SUDO_UID")
        .arg("-o")
        .arg(&out_dir)
        .args(["--", "python3"])
        .arg(&script)
        .arg("--lib-dir")
        .arg(fixtures().join("lib"))
        .arg("--log")
        .arg(&log);
    if let Some(ms) = slow_ms {
        tracer.env("SIM_HAL_SLOW_FREE_MS", ms.to_string());
    }
    let out = tracer.output().expect("run memscope-bpf");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let log = std::fs::read_to_string(&log).unwrap();
    let pid: u32 = log_lines(&log, "SUMMARY")[0]["pid"].parse().unwrap();
    let rows = rows_of(&out_dir, pid);
    (stderr, log, rows)
}

/// (event, address) of the program's own calls, sorted; and of the dump's MALLOC/FREE rows.
fn calls_of_log(log: &str) -> Vec<(String, u64)> {
    let mut v: Vec<_> = [("ALLOC", "MALLOC"), ("FREE", "FREE")]
        .into_iter()
        .flat_map(|(kind, event)| {
            log_lines(log, kind)
                .into_iter()
                .map(move |f| (event.to_owned(), hex(f["addr"])))
        })
        .collect();
    v.sort();
    v
}

fn calls_of_rows(rows: &[DumpRow]) -> Vec<(String, u64)> {
    let mut v: Vec<_> = rows
        .iter()
        .filter(|r| r.event_type == "HAL" && (r.event == "MALLOC" || r.event == "FREE"))
        .map(|r| (r.event.clone(), hex(&r.ptr)))
        .collect();
    v.sort();
    v
}

/// The rows dated before a row written earlier.
fn out_of_order(rows: &[DumpRow]) -> Vec<&DumpRow> {
    let mut newest = 0;
    let mut late = Vec::new();
    for r in rows {
        if r.ts < newest {
            late.push(r);
        }
        newest = newest.max(r.ts);
    }
    late
}

const WARNING: &str = "reached the tracer more than 50 ms after they happened";

#[test]
fn a_free_returning_after_the_reorder_window_is_kept_and_reported() {
    if !require_root("a_free_returning_after_the_reorder_window_is_kept_and_reported") {
        return;
    }
    let _serial = serial();
    // 1 s: far beyond the 50 ms window and the 100 ms tick, even on a loaded machine.
    let (stderr, log, rows) = trace("late-free", Some(1000));
    // Nothing lost: every call of the program has its row.
    assert_eq!(calls_of_rows(&rows), calls_of_log(&log), "{stderr}");
    assert_eq!(calls_of_log(&log).len(), 2 + 2 * 20);
    // Exactly one row out of time order: thread A's free, dated at its entry, before thread
    // B's calls (B started 20 ms after A was about to call the free).
    let late = out_of_order(&rows);
    assert_eq!(late.len(), 1, "{stderr}");
    let a_block = log_lines(&log, "ALLOC")
        .into_iter()
        .find(|f| f["size"] == (64 << 20).to_string())
        .map(|f| hex(f["addr"]))
        .unwrap();
    assert_eq!(
        (late[0].event.as_str(), hex(&late[0].ptr)),
        ("FREE", a_block)
    );
    let first_b = rows
        .iter()
        .find(|r| r.event == "MALLOC" && r.size() == 1 << 20)
        .unwrap();
    assert!(late[0].ts < first_b.ts);
    // The tracer says so, once, with the count.
    assert_eq!(stderr.matches(WARNING).count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("1 event(s) {WARNING}")),
        "{stderr}"
    );
}

#[test]
fn calls_within_the_reorder_window_come_out_in_time_order() {
    if !require_root("calls_within_the_reorder_window_come_out_in_time_order") {
        return;
    }
    let _serial = serial();
    let (stderr, log, rows) = trace("prompt-free", None);
    assert_eq!(calls_of_rows(&rows), calls_of_log(&log), "{stderr}");
    assert!(out_of_order(&rows).is_empty(), "{stderr}");
    assert!(!stderr.contains(WARNING), "{stderr}");
}
