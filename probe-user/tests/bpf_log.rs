//! End-to-end: the BPF side's own log (aya-log). With `--log-level=debug` the process-tree
//! programs say what they saw, as `bpf:` debug lines; the pids in them must be the ones the
//! workloads wrote in their own logs. (At other levels the statements are turned off at load
//! time; what that leaves in the loaded programs is measured in docs/design.md, not here.)

mod common;

use common::*;

/// Traces, at debug level, a workload that forks and execs a child; returns (stderr, parent pid, child pid),
/// the pids from the workloads' logs.
fn trace_spawning_workload(name: &str) -> (String, u32, u32) {
    let dir = scratch(name);
    let log = dir.join("gt.log");
    let out_dir = dir.join("out");
    let out = run_tracer(&[
        "-o",
        out_dir.to_str().unwrap(),
        "--log-level=debug",
        "--",
        bin("workload").to_str().unwrap(),
        "--steps",
        "1",
        "--spawn-child",
        "--log",
        log.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let parent = parse_log(&log).pid;
    let child = parse_log(&dir.join("gt.log.child")).pid;
    assert!(
        parent != 0 && child != 0 && parent != child,
        "{parent} {child}"
    );
    (stderr, parent, child)
}

fn bpf_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("[memscope-bpf] debug: bpf: "))
        .collect()
}

#[test]
fn debug_level_shows_the_bpf_side_seeing_the_process_tree() {
    if !require_root("debug_level_shows_the_bpf_side_seeing_the_process_tree") {
        return;
    }
    let _serial = serial();
    let (stderr, parent, child) = trace_spawning_workload("bpf-log-debug");
    let lines = bpf_lines(&stderr);
    // Launch mode holds each new program at exec until its libraries have probes.
    for want in [
        format!("traced process {parent} exec, held: 1"),
        format!("traced process {parent} forked {child}"),
        format!("traced process {child} exec, held: 1"),
        // The child exits while its parent waits for it, long before the tracer stops.
        format!("traced process {child} exited"),
    ] {
        assert!(
            lines.contains(&want.as_str()),
            "no BPF log line {want:?} in:\n{stderr}"
        );
    }
    // The child's exec comes after its fork, which comes after the parent's exec.
    let at = |l: String| lines.iter().position(|x| *x == l).unwrap();
    assert!(
        at(format!("traced process {parent} exec, held: 1"))
            < at(format!("traced process {parent} forked {child}"))
    );
    assert!(
        at(format!("traced process {parent} forked {child}"))
            < at(format!("traced process {child} exec, held: 1"))
    );
}
