//! Bad input gives a clear message and exit code 2, before anything is traced; a kernel that
//! refuses the tracer's programs, exit code 1, before the target runs.

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
fn lib_that_cannot_be_probed_is_rejected_before_launch() {
    let dir = scratch("bad-lib");
    let marker = dir.join("ran");
    let touch = format!("touch {}", marker.display());
    let text = dir.join("notes.so");
    fs::write(&text, "not an elf, just text").unwrap();
    let short = dir.join("short.so");
    fs::write(&short, b"\x7fELF").unwrap();
    // The header of a relocatable object (ET_REL), not a shared object.
    let object = dir.join("object.o");
    let mut header = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
    header.resize(16, 0);
    header.extend_from_slice(&1u16.to_le_bytes());
    header.resize(64, 0);
    fs::write(&object, header).unwrap();
    let cases: [(&str, &str); 5] = [
        ("/no/such/libascend_hal.so", "no such file"),
        (dir.to_str().unwrap(), "not a regular file"),
        (text.to_str().unwrap(), "not an ELF file"),
        (short.to_str().unwrap(), "cannot read its ELF header"),
        (object.to_str().unwrap(), "not a shared object"),
    ];
    for (lib, why) in cases {
        let out = run_tracer(&["--lib", lib, "--", "/bin/sh", "-c", &touch]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--lib {lib}: {stderr}");
        assert!(
            stderr.to_lowercase().contains(&why.to_lowercase()),
            "--lib {lib}: expected {why:?} in {stderr}"
        );
        assert!(!marker.exists(), "--lib {lib}: the program must not run");
    }
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

/// A program the kernel's verifier refuses stops the tracer before the target starts, whether
/// the programs go through multi-uprobe links or perf links: the error names it and shows where
/// the verifier stopped. (Before, the target ran without probes and its exit status looked like
/// a trace's, with no output at all.)
#[test]
fn a_refused_program_stops_the_tracer_before_launch() {
    if !require_root("a_refused_program_stops_the_tracer_before_launch") {
        return;
    }
    let dir = scratch("refused");
    let marker = dir.join("ran");
    let touch = format!("touch {}", marker.display());
    let output = dir.join("out/run");
    for links in ["multi-uprobe", "perf"] {
        let mut cmd = std::process::Command::new(TRACER);
        cmd.env_remove("SUDO_UID")
            .env(memscope_bpf::trace::bpf::REFUSED_ENTRY_ENV, "1")
            .args([
                "-o",
                output.to_str().unwrap(),
                "--",
                "/bin/sh",
                "-c",
                &touch,
            ]);
        if links == "perf" {
            cmd.env(memscope_bpf::trace::bpf::NO_MULTI_ENV, "1");
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{links}: {stderr}");
        assert!(
            stderr.contains("the kernel refused the uprobe program refused_entry"),
            "{links}: {stderr}"
        );
        // The verifier's own words for the read through a number.
        assert!(
            stderr.contains("R1 invalid mem access 'scalar'"),
            "{links}: {stderr}"
        );
        assert!(!marker.exists(), "{links}: the program must not run");
        // Nor is the output directory it made for the run left behind, nested as it is.
        assert!(
            !output.exists(),
            "{links}: {} left behind",
            output.display()
        );
        assert!(dir.exists(), "{links}: a directory that was there stays");
    }
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
        "decompose: bytes per owner",
        "memscope-label-push",
        "--events=alloc,free,launch,access",
    ] {
        assert!(help.contains(needle), "help lacks {needle}");
    }
    let out = run_tracer(&["--version"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("memscope-bpf "));
}

/// `-o` names a directory in every mode, `report` included: its page goes in it as
/// `memscope_report.html` (made if missing); a path ending in `.html` still names the page
/// (with a deprecation notice); a regular file in the way is a usage error before anything is
/// read.
#[test]
fn report_output_is_a_directory_as_everywhere() {
    let dir = scratch("report-o");
    let dump = dir.join("memscope_dump_1.csv");
    fs::write(
        &dump,
        format!(
            "{}\n1,MALLOC,HAL,N/A,10,7,7,0,0x0000000000001000,\"{{allocation_id:1,addr:0x0000000000001000,size:4096,used:4096}}\",,\n",
            memscope_bpf::output::csv::CSV_HEADER
        ),
    )
    .unwrap();
    let dump = dump.to_str().unwrap();
    let out_dir = dir.join("reports");
    let out = run_tracer(&[
        "report",
        "-i",
        dump,
        "-o",
        out_dir.to_str().unwrap(),
        "--perfetto",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("deprecated"), "{stderr}");
    for name in ["memscope_report.html", "memscope_report.perfetto.json"] {
        assert!(out_dir.join(name).is_file(), "{name} missing: {stderr}");
    }
    // The form of before: a page name.
    let page = dir.join("run.html");
    let out = run_tracer(&[
        "report",
        "-i",
        dump,
        "--output-path",
        page.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(page.is_file() && !page.join("memscope_report.html").exists());
    assert!(
        stderr.contains("deprecated") && stderr.contains("names the output directory"),
        "{stderr}"
    );
    // A file where the directory should be.
    let plain = dir.join("plain-file");
    fs::write(&plain, "x").unwrap();
    expect_usage_error(
        &["report", "-i", dump, "-o", plain.to_str().unwrap()],
        "exists and is not a directory",
    );
    assert_eq!(fs::read(&plain).unwrap(), b"x");
    let help = run_tracer(&["report", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("Output directory") && help.contains("DIR/memscope_report.html"),
        "{help}"
    );
}
