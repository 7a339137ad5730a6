//! Bad input gives a clear message and exit code 2, before anything is traced.

mod common;

use std::fs;

use common::*;

fn expect_usage_error(args: &[&str], needle: &str) {
    let out = run_tracer(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "args {args:?}: stderr {stderr}");
    assert!(
        stderr.to_lowercase().contains(&needle.to_lowercase()),
        "args {args:?}: expected {needle:?} in {stderr}"
    );
}

#[test]
fn invalid_options_are_rejected_with_exit_2() {
    expect_usage_error(&["--device=gpu", "--", "/bin/true"], "device");
    expect_usage_error(&["--events=alloc,bogus", "--", "/bin/true"], "events");
    expect_usage_error(&["--analysis=oom:0", "--", "/bin/true"], "oom");
    expect_usage_error(&["--log-level=loud", "--", "/bin/true"], "log-level");
    expect_usage_error(&["--no-such-option", "--", "/bin/true"], "no-such-option");
    expect_usage_error(&["--steps=1,2,3,4,5,6", "--", "/bin/true"], "steps");
    expect_usage_error(&[], "--help");
}

#[test]
fn missing_pid_and_program_are_clear_errors() {
    expect_usage_error(&["--pid", "999999999"], "999999999");
    expect_usage_error(&["--pid", "abc"], "pid");
    expect_usage_error(&["--", "/no/such/program"], "program not found");
    expect_usage_error(&["no-such-program-anywhere"], "program not found");
}

#[test]
fn unwritable_output_directory_is_rejected_before_launch() {
    let dir = scratch("unwritable");
    let file = dir.join("plain-file");
    fs::write(&file, "x").unwrap();
    let marker = dir.join("ran");
    // A path below a regular file can never be created.
    let out = run_tracer(&[
        "-o",
        file.join("sub").to_str().unwrap(),
        "--",
        "/bin/sh",
        "-c",
        &format!("touch {}", marker.display()),
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("output"));
    assert!(
        !marker.exists(),
        "the program must not run when the output is unusable"
    );
}

#[test]
fn help_teaches_and_version_prints() {
    let out = run_tracer(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--pid",
        "--output-path",
        "--device",
        "--lib",
        "EXAMPLES",
        "root",
    ] {
        assert!(help.contains(needle), "help lacks {needle}");
    }
    let out = run_tracer(&["--version"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("memscope-bpf "));
}
