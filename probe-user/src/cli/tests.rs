//! Unit tests of the command line: every option, alias, list form and error message.

use super::*;
use crate::offline::MAX_COMPARE_INPUT_BYTES;
use crate::output::config_json::{config_json, json_escape};
use crate::output::paths::{check_output_dir, lexical_absolute};
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

fn parse(args: &[&str]) -> Result<Options, CliError> {
    let mut v = vec![PROGRAM_NAME];
    v.extend_from_slice(args);
    parse_from(v)
}

fn ok(args: &[&str]) -> Options {
    match parse(args) {
        Ok(o) => o,
        Err(e) => panic!("{args:?} failed: {e}"),
    }
}

fn err(args: &[&str]) -> CliError {
    match parse(args) {
        Ok(o) => panic!("{args:?} unexpectedly parsed: {o:?}"),
        Err(e) => e,
    }
}

/// Assert a usage error (exit 2) whose message contains every fragment.
fn usage_err(args: &[&str], fragments: &[&str]) {
    let e = err(args);
    assert_eq!(e.exit_code, 2, "{args:?}: {e}");
    for f in fragments {
        assert!(
            e.message.contains(f),
            "{args:?}: {:?} lacks {f:?}",
            e.message
        );
    }
}

/// Launch `true` with extra options.
fn launch(opts: &[&str]) -> Options {
    let mut v = opts.to_vec();
    v.extend_from_slice(&["--", "true"]);
    ok(&v)
}

fn launch_err(opts: &[&str], fragments: &[&str]) {
    let mut v = opts.to_vec();
    v.extend_from_slice(&["--", "true"]);
    usage_err(&v, fragments);
}

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "memscope_cli_test_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn file(&self, name: &str, contents: &[u8]) -> String {
        let p = self.0.join(name);
        std::fs::write(&p, contents).unwrap();
        p.to_str().unwrap().to_owned()
    }
    fn path(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn help_text() -> String {
    command().render_help().to_string()
}

fn os(s: &str) -> OsString {
    OsString::from(s)
}

fn parse_watch(s: &str) -> Result<WatchConfig, Refused> {
    s.parse()
}

// ----- defaults -----------------------------------------------------------------------

#[test]
fn defaults() {
    let o = ok(&["--", "python", "train.py"]);
    assert_eq!(
        o.mode,
        Mode::Launch {
            program: os("python"),
            args: vec![os("train.py")]
        }
    );
    let cwd = std::env::current_dir().unwrap();
    assert_eq!(o.output_dir, cwd.join("memscopeDumpResults"));
    assert_eq!(o.dump_events, EventSet::CLI_DEFAULT);
    assert_eq!(o.events, EventSet::CLI_DEFAULT);
    assert_eq!(
        o.levels,
        Levels {
            op: true,
            kernel: false
        }
    );
    assert_eq!(
        o.devices,
        DeviceFilter {
            all_npu: true,
            npu_mask: 0,
            cpu: false
        }
    );
    assert_eq!(o.analysis, AnalysisSet::CLI_DEFAULT);
    assert!(o.analysis.leaks && o.analysis.oom_top_k.is_none());
    assert!(o.steps.is_empty());
    // Python programs get their own line by default: the innermost 16 Python frames, at the
    // calls that allocate.
    assert_eq!(
        o.call_stack,
        CallStack {
            c_depth: None,
            python_depth: Some(16),
            mixed: false,
            allocations_only: true,
        }
    );
    // The same value given on the command line takes every call's.
    assert_eq!(
        launch(&["--call-stack=python:16"]).call_stack,
        CallStack {
            allocations_only: false,
            ..o.call_stack
        }
    );
    assert_eq!(o.collect_mode, CollectMode::Immediate);
    assert_eq!(o.format, DataFormat::Csv);
    assert_eq!(o.watch, None);
    assert_eq!(o.log_level, LogLevel::Info);
    assert!(o.libs.is_empty());
    assert_eq!(o.ring_buffer_mib, 64);
    assert!(o.warnings.is_empty());
}

// ----- target selection -------------------------------------------------------------

#[test]
fn launch_without_double_dash_keeps_program_flags() {
    let o = ok(&[
        "--level=op",
        "bash",
        "run.sh",
        "--level=kernel",
        "-h",
        "--",
        "x",
    ]);
    assert_eq!(
        o.mode,
        Mode::Launch {
            program: os("bash"),
            args: vec![
                os("run.sh"),
                os("--level=kernel"),
                os("-h"),
                os("--"),
                os("x")
            ]
        }
    );
    assert_eq!(
        o.levels,
        Levels {
            op: true,
            kernel: false
        }
    );
}

#[test]
fn launch_after_double_dash_program_may_look_like_option() {
    let o = ok(&["--", "--weird", "-v"]);
    assert_eq!(
        o.mode,
        Mode::Launch {
            program: os("--weird"),
            args: vec![os("-v")]
        }
    );
    assert_eq!(o.log_level, LogLevel::Info);
}

#[test]
fn non_utf8_program_args_pass_through() {
    let bad = OsString::from_vec(vec![0x66, 0xff, 0xfe, 0x41]);
    let o = parse_from(vec![os(PROGRAM_NAME), os("-q"), bad.clone(), bad.clone()]).unwrap();
    assert_eq!(
        o.mode,
        Mode::Launch {
            program: bad.clone(),
            args: vec![bad]
        }
    );
}

#[test]
fn non_utf8_option_values_are_errors_not_panics() {
    let bad = OsString::from_vec(vec![
        b'-', b'-', b'e', b'v', b'e', b'n', b't', b's', b'=', 0xff,
    ]);
    let e = parse_from(vec![os(PROGRAM_NAME), bad, os("true")]).unwrap_err();
    assert_eq!(e.exit_code, 2);
    assert!(e.message.contains("not valid UTF-8"), "{e}");
    let bad_name = OsString::from_vec(vec![b'-', b'-', 0xff]);
    let e = parse_from(vec![os(PROGRAM_NAME), bad_name, os("true")]).unwrap_err();
    assert!(e.message.contains("unrecognized option"), "{e}");
    let bad_short = OsString::from_vec(vec![b'-', 0xff]);
    let e = parse_from(vec![os(PROGRAM_NAME), bad_short, os("true")]).unwrap_err();
    assert!(e.message.contains("\\xff"), "{e}");
    let bad_out = OsString::from_vec(vec![b'/', b't', 0xff]);
    let e = parse_from(vec![os(PROGRAM_NAME), os("-o"), bad_out, os("true")]).unwrap_err();
    assert!(e.message.contains("invalid output path"), "{e}");
}

#[test]
fn no_target_is_error_with_help_hint() {
    usage_err(&[], &["--help"]);
    usage_err(&["--level=op"], &["--pid", "--compare", "--help"]);
    assert!(!err(&[]).message.contains('\n'));
    usage_err(&["--"], &["'--' must be followed"]);
}

#[test]
fn empty_argv_does_not_panic() {
    let e = parse_from(Vec::<OsString>::new()).unwrap_err();
    assert_eq!(e.exit_code, 2);
}

#[test]
fn pid_attach() {
    // pid 1 always exists in a Linux pid namespace.
    let o = ok(&["--pid", "1", "--level=kernel"]);
    assert_eq!(o.mode, Mode::Attach { pid: 1 });
    let o = ok(&["--pid=1"]);
    assert_eq!(o.mode, Mode::Attach { pid: 1 });
}

#[test]
fn rotation_and_as_root_options() {
    let o = ok(&["--max-file-mib=80", "--max-files", "10", "--", "true"]);
    assert_eq!((o.max_file_mib, o.max_files), (Some(80), Some(10)));
    let o = ok(&["--", "true"]);
    assert_eq!(
        (o.max_file_mib, o.max_files, o.as_root),
        (None, None, false)
    );
    assert!(ok(&["--as-root", "--", "true"]).as_root);
    usage_err(
        &["--max-files=3", "--", "true"],
        &["--max-files needs --max-file-mib"],
    );
    usage_err(
        &["--max-file-mib=0", "--", "true"],
        &["--max-file-mib", "1 to 1048576"],
    );
    usage_err(
        &["--max-files=0", "--max-file-mib=1", "--", "true"],
        &["1 to 10000"],
    );
    usage_err(
        &["--max-file-mib=1", "--format=db", "--", "true"],
        &["--format=db"],
    );
    usage_err(&["--as-root=yes", "--", "true"], &["--as-root"]);
}

#[test]
fn pid_errors() {
    for bad in [
        "0",
        "-1",
        "+1",
        "01",
        "abc",
        "",
        "1.5",
        " 1",
        "4294967296",
        "99999999999",
    ] {
        usage_err(&["--pid", bad], &["--pid", "positive decimal"]);
    }
    usage_err(
        &["--pid", "4000000000"],
        &["no process with pid 4000000000"],
    );
    let me = std::process::id().to_string();
    usage_err(&["--pid", &me], &["itself"]);
    usage_err(&["--pid"], &["requires a value"]);
}

#[test]
fn pid_with_program_or_compare_is_error() {
    usage_err(&["--pid", "1", "--", "true"], &["--pid", "program"]);
    usage_err(&["--pid", "1", "bash"], &["--pid"]);
    let t = TempDir::new();
    let a = t.file("a.csv", b"x");
    let b = t.file("b.csv", b"y");
    usage_err(
        &["--pid", "1", "--compare", "-i", &format!("{a},{b}")],
        &["--compare"],
    );
}

#[test]
fn compare_mode() {
    let t = TempDir::new();
    let a = t.file("a.csv", b"x");
    let b = t.file("b.csv", b"y");
    for args in [
        vec!["--compare".to_owned(), format!("--input={a},{b}")],
        vec!["--compare".to_owned(), "-i".to_owned(), format!("{a},{b}")],
        vec!["--compare".to_owned(), format!("-i{a},{b}")],
        vec![
            "--compare".to_owned(),
            format!("--input-path={a}\u{ff0c}{b}"),
        ],
        vec![format!("--input-path={a},,{b},"), "--compare".to_owned()],
    ] {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = ok(&refs);
        assert_eq!(
            o.mode,
            Mode::Compare {
                inputs: [PathBuf::from(&a), PathBuf::from(&b)]
            },
            "{args:?}"
        );
    }
    let o = ok(&["--compare", &format!("--input={a},{b}")]);
    assert!(
        o.warnings
            .iter()
            .any(|w| w.contains("'--input' is deprecated"))
    );
    assert!(config_json(&o.recorded()).contains("\"enableCompare\": true"));
}

#[test]
fn compare_errors() {
    let t = TempDir::new();
    let a = t.file("a.csv", b"x");
    let b = t.file("b.csv", b"y");
    let c = t.file("c.csv", b"z");
    usage_err(&["--compare"], &["--compare", "--input-path"]);
    usage_err(
        &["-i", &format!("{a},{b}"), "--", "true"],
        &["-i", "--compare"],
    );
    usage_err(
        &["--input-path", &format!("{a},{b}")],
        &["--input-path", "--compare"],
    );
    usage_err(
        &["--compare", "-i", &format!("{a},{b}"), "true"],
        &["--compare", "true"],
    );
    usage_err(&["--compare", "-i", &a], &["exactly two", "got 1"]);
    usage_err(
        &["--compare", "-i", &format!("{a},{b},{c}")],
        &["exactly two", "got 3"],
    );
    usage_err(&["--compare", "-i", ""], &["got 0"]);
    let missing = t.path("missing.csv");
    usage_err(
        &["--compare", "-i", &format!("{a},{missing}")],
        &["missing.csv", "cannot be read"],
    );
    usage_err(
        &["--compare", "-i", &format!("{a},{}", t.0.display())],
        &["not a regular file"],
    );
    let link = t.path("link.csv");
    std::os::unix::fs::symlink(&a, &link).unwrap();
    usage_err(
        &["--compare", "-i", &format!("{link},{b}")],
        &["symbolic link"],
    );
    let long = format!("{a},{}", "x".repeat(5000));
    usage_err(&["--compare", "-i", &long], &["4096"]);
    usage_err(&["--compare", "-i"], &["requires a value"]);
}

#[test]
fn analyze_mode() {
    let t = TempDir::new();
    let a = t.file("a.csv", b"x");
    for args in [
        vec!["analyze".to_owned(), format!("--input={a}")],
        vec!["analyze".to_owned(), format!("--input-path={a}")],
        vec!["analyze".to_owned(), "-i".to_owned(), a.clone()],
        vec!["analyze".to_owned(), format!("-i{a}")],
        vec![
            "analyze".to_owned(),
            "-q".to_owned(),
            format!("-i{a},"),
            "--log-level=debug".to_owned(),
        ],
    ] {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = ok(&refs);
        assert_eq!(
            o.mode,
            Mode::Analyze {
                input: PathBuf::from(&a)
            },
            "{args:?}"
        );
    }
    let out = t.path("out");
    let o = ok(&["analyze", "-i", &a, "-o", &out]);
    assert_eq!(o.output_dir, PathBuf::from(&out));
    assert_eq!(o.log_level, LogLevel::Info);
    assert_eq!(
        ok(&["analyze", "-i", &a, "--log-level=error"]).log_level,
        LogLevel::Error
    );
    assert!(
        ok(&["analyze", &format!("--input={a}")])
            .warnings
            .iter()
            .any(|w| w.contains("'--input' is deprecated"))
    );
    // Only as the first argument: elsewhere it is a program name.
    match ok(&["--level=op", "analyze"]).mode {
        Mode::Launch { program, .. } => assert_eq!(program, "analyze"),
        m => panic!("{m:?}"),
    }
    match ok(&["--", "analyze", "-i", &a]).mode {
        Mode::Launch { program, args } => {
            assert_eq!(program, "analyze");
            assert_eq!(args.len(), 2);
        }
        m => panic!("{m:?}"),
    }
}

#[test]
fn analyze_sites_options() {
    use crate::report::{At, SitesRequest};
    let t = TempDir::new();
    let a = t.file("a.csv", b"x");
    let o = ok(&["analyze", "-i", &a, "--by-site", "--at=peak", "--timeline"]);
    assert_eq!(
        o.sites,
        SitesRequest {
            by_site: true,
            by_stack: false,
            at: Some(At::Peak),
            timeline_ms: Some(100),
        }
    );
    let o = ok(&[
        "analyze",
        "-i",
        &a,
        "--by-stack",
        "--at",
        "1.5",
        "--timeline=250",
    ]);
    assert!(o.sites.by_stack);
    assert_eq!(o.sites.at, Some(At::After(1_500_000_000)));
    assert_eq!(o.sites.timeline_ms, Some(250));
    assert_eq!(
        ok(&["analyze", "-i", &a, "--at=exit"]).sites.at,
        Some(At::Exit)
    );
    assert_eq!(ok(&["analyze", "-i", &a]).sites, SitesRequest::default());
    usage_err(
        &["analyze", "-i", &a, "--at=soon"],
        &["--at", "exit, peak or seconds"],
    );
    usage_err(&["analyze", "-i", &a, "--at=-1"], &["--at"]);
    usage_err(&["analyze", "-i", &a, "--timeline=0"], &["milliseconds"]);
    usage_err(&["analyze", "-i", &a, "--by-site=yes"], &["takes no value"]);
    // Outside analyze they say where they belong.
    usage_err(&["--by-site", "--", "true"], &["belongs to 'analyze'"]);
    usage_err(&["--perfetto", "--", "true"], &["belongs to 'report'"]);
}

#[test]
fn report_mode() {
    use crate::report::{Formats, ReportRequest};
    let t = TempDir::new();
    let a = t.file("a.csv", b"x");
    let dir = t.path("");
    let out = t.path("r.html");
    match ok(&["report", "-i", &dir, "-o", &out]).mode {
        Mode::Report { request } => assert_eq!(
            request,
            ReportRequest {
                inputs: vec![PathBuf::from(&dir)],
                output: PathBuf::from(&out),
                formats: Formats {
                    html: true,
                    ..Default::default()
                },
            }
        ),
        m => panic!("{m:?}"),
    }
    match ok(&[
        "report",
        &format!("--input-path={dir},{a}"),
        "--perfetto",
        "-q",
    ])
    .mode
    {
        Mode::Report { request } => {
            assert_eq!(request.inputs.len(), 2);
            assert!(request.formats.html && request.formats.perfetto);
            assert!(request.output.ends_with("memscope_report.html"));
        }
        m => panic!("{m:?}"),
    }
    match ok(&["report", "-i", &a, "--format=folded,speedscope"]).mode {
        Mode::Report { request } => assert_eq!(
            request.formats,
            Formats {
                html: false,
                perfetto: false,
                folded: true,
                speedscope: true
            }
        ),
        m => panic!("{m:?}"),
    }
    usage_err(&["report"], &["report needs the run", "--input-path"]);
    usage_err(
        &["report", "-i", &a, "--format=png"],
        &["html, perfetto, folded or speedscope"],
    );
    usage_err(
        &["report", "-i", &format!("{a},{a},{a}")],
        &["one run, or two", "got 3"],
    );
    usage_err(&["report", "-i", &t.path("missing")], &["cannot read"]);
    // -o names a directory, as in every mode: the page goes in it.
    let reports = t.path("reports");
    for given in [&dir, &reports] {
        match ok(&["report", "-i", &a, "-o", given]).mode {
            Mode::Report { request } => {
                assert_eq!(
                    request.output,
                    Path::new(given).join("memscope_report.html")
                )
            }
            m => panic!("{m:?}"),
        }
    }
    let o = ok(&["report", "-i", &a, "-o", &reports]);
    assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    // Without -o: the current directory.
    match ok(&["report", "-i", &a]).mode {
        Mode::Report { request } => assert_eq!(
            request.output,
            std::env::current_dir()
                .unwrap()
                .join("memscope_report.html")
        ),
        m => panic!("{m:?}"),
    }
    // A page name, as before -o meant a directory: kept, with a notice.
    let o = ok(&["report", "-i", &a, "--output-path", &out]);
    assert!(
        o.warnings
            .iter()
            .any(|w| w.contains("deprecated") && w.contains("names the output directory")),
        "{:?}",
        o.warnings
    );
    usage_err(
        &["report", "-i", &a, "-o", &a],
        &[
            "invalid --output-path value",
            "exists and is not a directory",
        ],
    );
    usage_err(
        &["report", "-i", &a, "-o", &t.path("a,b")],
        &["invalid --output-path value", "contains ','"],
    );
    // The page itself is checked before anything is read: never written through a link.
    let taken = t.path("taken");
    std::fs::create_dir_all(Path::new(&taken).join("memscope_report.html")).unwrap();
    usage_err(
        &["report", "-i", &a, "-o", &taken],
        &["memscope_report.html", "is a directory", "-o DIR"],
    );
    let linked = t.path("linked");
    std::fs::create_dir_all(&linked).unwrap();
    std::os::unix::fs::symlink(&a, Path::new(&linked).join("memscope_report.html")).unwrap();
    usage_err(
        &["report", "-i", &a, "-o", &linked],
        &["is a symbolic link", "-o DIR"],
    );
    usage_err(
        &["report", "-i", &a, "--pid=1"],
        &["cannot be used with 'report'"],
    );
    usage_err(
        &["report", "-i", &a, "prog"],
        &["unexpected argument 'prog'"],
    );
    usage_err(
        &["report", "-i", &format!("{a},{a}"), "--format=perfetto"],
        &["add html"],
    );
    // --report at the end of a run.
    assert_eq!(ok(&["--report", "--", "true"]).report_at_end, Some(None));
    assert_eq!(
        ok(&[&format!("--report={out}"), "--", "true"]).report_at_end,
        Some(Some(PathBuf::from(&out)))
    );
    assert_eq!(ok(&["--", "true"]).report_at_end, None);
    assert!(ok(&["--memory-snapshot", "--", "true"]).memory_snapshot);
    assert!(!ok(&["--", "true"]).memory_snapshot);
    assert!(help_text().contains("report --input-path"));
}

#[test]
fn analyze_errors() {
    let t = TempDir::new();
    let a = t.file("a.csv", b"x");
    let b = t.file("b.csv", b"y");
    usage_err(&["analyze"], &["analyze needs", "--input-path"]);
    usage_err(
        &["analyze", "-i", &format!("{a},{b}")],
        &["exactly one", "got 2"],
    );
    usage_err(&["analyze", "-i", ""], &["exactly one", "got 0"]);
    usage_err(&["analyze", "-i"], &["requires a value"]);
    usage_err(&["analyze", &a], &["unexpected argument", "-- analyze"]);
    usage_err(
        &["analyze", "-i", &a, "--", "true"],
        &["unexpected argument"],
    );
    usage_err(
        &["analyze", "-i", &a, "--compare"],
        &["--compare", "analyze"],
    );
    usage_err(&["analyze", "-i", &a, "--pid=1"], &["--pid", "analyze"]);
    usage_err(&["analyze", "-i", &a, "--events=alloc"], &["--events"]);
    usage_err(&["analyze", "-i", &a, "--format=db"], &["--format"]);
    let missing = t.path("missing.csv");
    usage_err(
        &["analyze", "-i", &missing],
        &["missing.csv", "cannot be read"],
    );
    usage_err(
        &["analyze", "-i", &t.0.display().to_string()],
        &["not a regular file"],
    );
    let link = t.path("link.csv");
    std::os::unix::fs::symlink(&a, &link).unwrap();
    usage_err(&["analyze", "-i", &link], &["symbolic link"]);
    let big = t.path("big.csv");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(MAX_COMPARE_INPUT_BYTES + 1)
        .unwrap();
    usage_err(&["analyze", "-i", &big], &["8 GiB"]);
    usage_err(&["analyze", "-i", &"x".repeat(5000)], &["4096"]);
    // Help still works.
    assert_eq!(err(&["analyze", "--help"]).exit_code, 0);
    assert!(help_text().contains("analyze --input-path"));
}

#[test]
fn compare_rejects_files_over_8_gib() {
    let t = TempDir::new();
    let a = t.file("a.csv", b"x");
    let big = t.path("big.csv");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(MAX_COMPARE_INPUT_BYTES + 1).unwrap(); // sparse
    usage_err(&["--compare", "-i", &format!("{a},{big}")], &["8 GiB"]);
    f.set_len(MAX_COMPARE_INPUT_BYTES).unwrap();
    ok(&["--compare", "-i", &format!("{a},{big}")]);
}

// ----- help / version / unknown ------------------------------------------------------

#[test]
fn help_and_version_exit_zero() {
    for h in ["-h", "--help"] {
        let e = err(&[h]);
        assert_eq!(e.exit_code, 0);
        for needle in [
            "USAGE",
            "EXAMPLES",
            "memscope-bpf -- python train.py",
            "--output=./out bash run.sh",
            "--pid 1234",
            "--lib /",
            "libascend_hal.so",
            "--compare",
            "CAP_BPF",
            "CAP_PERFMON",
            "memscopeDumpResults",
            "Ctrl-C",
            "TARGET SELECTION",
            "WHAT TO COLLECT",
            "ANALYSIS",
            "OUTPUT",
            "MISC",
            "never consumed",
        ] {
            assert!(e.message.contains(needle), "help lacks {needle:?}");
        }
    }
    for v in ["-V", "--version"] {
        let e = err(&[v]);
        assert_eq!(e.exit_code, 0);
        assert_eq!(
            e.message,
            format!("memscope-bpf {}", env!("CARGO_PKG_VERSION"))
        );
    }
}

#[test]
fn help_stops_parsing_but_earlier_errors_win() {
    assert_eq!(err(&["-h", "--bogus"]).exit_code, 0);
    assert_eq!(err(&["--bogus", "-h"]).exit_code, 2);
    assert_eq!(err(&["-qh"]).exit_code, 0);
    // After the program, -h belongs to the program.
    assert!(parse(&["true", "-h"]).is_ok());
}

#[test]
fn help_lines_fit_100_columns() {
    for line in help_text().lines() {
        assert!(line.chars().count() <= 100, "{line}");
    }
}

#[test]
fn unknown_options() {
    usage_err(
        &["--bogus", "true"],
        &["unrecognized option '--bogus'", "--help"],
    );
    usage_err(&["--bogus=1", "true"], &["unrecognized option '--bogus'"]);
    usage_err(&["-x", "true"], &["unrecognized option '-x'"]);
    usage_err(&["-vx", "true"], &["'-x'"]);
    usage_err(&["--quiet=yes", "true"], &["--quiet", "takes no value"]);
    usage_err(&["--compare=1"], &["takes no value"]);
}

#[test]
fn clap_wording() {
    // An empty value of a fixed-choice option is invalid, not missing.
    launch_err(
        &["--format="],
        &["invalid --format value '': expected csv or db"],
    );
    launch_err(&["--collect-mode", ""], &["expected immediate or deferred"]);
    // A near miss gets clap's suggestion.
    usage_err(
        &["--event=alloc", "true"],
        &["unrecognized option '--event'", "did you mean '--events'?"],
    );
    // A short option written with '=' takes what follows it, as in clap.
    let t = TempDir::new();
    let d = t.path("eq");
    assert_eq!(launch(&[&format!("-o={d}")]).output_dir, PathBuf::from(&d));
}

#[test]
fn option_value_forms() {
    let t = TempDir::new();
    let d = t.path("out");
    for args in [
        vec!["-o".to_owned(), d.clone()],
        vec![format!("-o{d}")],
        vec!["--output-path".to_owned(), d.clone()],
        vec![format!("--output-path={d}")],
        vec!["--output".to_owned(), d.clone()],
        vec![format!("--output={d}")],
    ] {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(launch(&refs).output_dir, PathBuf::from(&d), "{args:?}");
    }
    // A required value is taken from the next argument even if it starts with '-'.
    launch_err(&["--events", "-v"], &["--events", "-v"]);
    usage_err(&["--events"], &["requires a value"]);
    usage_err(&["-o"], &["'-o' requires a value"]);
}

#[test]
fn short_option_clusters() {
    let o = launch(&["-vq"]);
    assert_eq!(o.log_level, LogLevel::Debug);
    let t = TempDir::new();
    let d = t.path("o2");
    let o = launch(&[&format!("-qo{d}")]);
    assert_eq!(o.output_dir, PathBuf::from(&d));
    assert_eq!(o.log_level, LogLevel::Error);
}

#[test]
fn last_occurrence_wins() {
    let o = launch(&[
        "--level=kernel",
        "--level=op",
        "--format=db",
        "--format=csv",
    ]);
    assert_eq!(
        o.levels,
        Levels {
            op: true,
            kernel: false
        }
    );
    assert_eq!(o.format, DataFormat::Csv);
}

// ----- output path ---------------------------------------------------------------------

#[test]
fn output_path_made_absolute_lexically() {
    let cwd = std::env::current_dir().unwrap();
    assert_eq!(launch(&["-o", "out"]).output_dir, cwd.join("out"));
    assert_eq!(launch(&["-o", "./a/./b/../c"]).output_dir, cwd.join("a/c"));
    assert_eq!(
        launch(&["-o", "/tmp/x/../y/."]).output_dir,
        PathBuf::from("/tmp/y")
    );
    assert_eq!(launch(&["-o", "/../.."]).output_dir, PathBuf::from("/"));
    assert_eq!(
        launch(&["-o", "/tmp/结果 dir~_-.1"]).output_dir,
        PathBuf::from("/tmp/结果 dir~_-.1")
    );
}

#[test]
fn output_path_errors() {
    launch_err(&["-o", ""], &["-o", "must not be empty"]);
    launch_err(
        &["--output-path=  "],
        &["--output-path", "must not be empty"],
    );
    for c in ["=x", "+x", "-x", "@x"] {
        launch_err(&["-o", c], &["invalid output path", "must not start with"]);
    }
    launch_err(&["-o", "/tmp/a$b"], &["invalid output path", "'$'"]);
    launch_err(&["-o", "/tmp/a:b"], &["':'"]);
    launch_err(&["-o", "/tmp/é"], &["'é'"]);
    launch_err(&["-o", &format!("/tmp/{}", "a".repeat(256))], &["255"]);
    launch_err(&["-o", &format!("/{}", "a".repeat(4097))], &["4096"]);
    let deep = "/a".repeat(33);
    launch_err(&["-o", &deep], &["33 '/'", "32"]);
    ok(&["-o", &"/a".repeat(32), "true"]);
    let t = TempDir::new();
    let f = t.file("plain", b"");
    launch_err(&["-o", &f], &["not a directory"]);
    // Deprecated alias gets a warning.
    let d = t.path("dep");
    let o = launch(&["--output", &d]);
    assert!(
        o.warnings
            .iter()
            .any(|w| w.contains("'--output' is deprecated") && w.contains("--output-path"))
    );
}

#[test]
fn check_output_dir_rules() {
    assert!(check_output_dir(Path::new("/tmp/ok")).is_ok());
    assert!(check_output_dir(Path::new("/tmp/a\tb")).is_ok());
    assert!(check_output_dir(Path::new("/tmp/\u{4e00}\u{9fa5}")).is_ok());
    assert!(check_output_dir(Path::new("/tmp/\u{9fa6}")).is_err());
}

#[test]
fn lexical_absolute_cases() {
    let cwd = Path::new("/home/u/w");
    assert_eq!(
        lexical_absolute(Path::new("."), cwd),
        PathBuf::from("/home/u/w")
    );
    assert_eq!(
        lexical_absolute(Path::new(".."), cwd),
        PathBuf::from("/home/u")
    );
    assert_eq!(
        lexical_absolute(Path::new("../../../../x"), cwd),
        PathBuf::from("/x")
    );
    assert_eq!(
        lexical_absolute(Path::new("a//b/"), cwd),
        PathBuf::from("/home/u/w/a/b")
    );
}

// ----- events / implied rules ----------------------------------------------------------

#[test]
fn events_parsing() {
    let o = launch(&["--events=launch"]);
    assert_eq!(
        o.dump_events,
        EventSet {
            launch: true,
            ..EventSet::NONE
        }
    );
    // default analysis (leaks) implies alloc+free collection
    assert_eq!(
        o.events,
        EventSet {
            alloc: true,
            free: true,
            launch: true,
            access: false
        }
    );
    let o = launch(&["--events=alloc,free,launch,access"]);
    assert_eq!(o.dump_events.bits(), 0b1111);
    let o = launch(&["--events", "alloc\u{ff0c}launch,,"]);
    assert_eq!(
        o.dump_events,
        EventSet {
            alloc: true,
            launch: true,
            ..EventSet::NONE
        }
    );
}

#[test]
fn events_implied_rules() {
    let o = launch(&["--analysis=none", "--events=alloc"]);
    assert_eq!(
        o.events,
        EventSet {
            alloc: true,
            free: true,
            ..EventSet::NONE
        }
    );
    assert_eq!(
        o.dump_events,
        EventSet {
            alloc: true,
            ..EventSet::NONE
        }
    );
    let o = launch(&["--analysis=none", "--events=free"]);
    assert_eq!(
        o.events,
        EventSet {
            alloc: true,
            free: true,
            ..EventSet::NONE
        }
    );
    let o = launch(&["--analysis=none", "--events=access"]);
    assert_eq!(
        o.events,
        EventSet {
            alloc: true,
            free: true,
            access: true,
            launch: false
        }
    );
    let o = launch(&["--analysis=none", "--events=launch"]);
    assert_eq!(
        o.events,
        EventSet {
            launch: true,
            ..EventSet::NONE
        }
    );
}

#[test]
fn analysis_implied_rules() {
    let o = launch(&["--events=none", "--analysis=oom"]);
    assert_eq!(o.dump_events, EventSet::NONE);
    assert_eq!(
        o.events,
        EventSet {
            alloc: true,
            free: true,
            ..EventSet::NONE
        }
    );
    let o = launch(&["--events=none", "--analysis=leaks"]);
    assert_eq!(
        o.events,
        EventSet {
            alloc: true,
            free: true,
            ..EventSet::NONE
        }
    );
    let o = launch(&["--events=none", "--analysis=decompose"]);
    assert_eq!(
        o.events,
        EventSet {
            alloc: true,
            free: true,
            access: true,
            launch: false
        }
    );
    let o = launch(&["--events=none", "--analysis=inefficient"]);
    assert_eq!(o.events.bits(), 0b1111);
    assert_eq!(o.dump_events, EventSet::NONE);
    let o = launch(&["--events=none", "--analysis=none"]);
    assert_eq!(o.events, EventSet::NONE);
}

#[test]
fn events_none_and_traceback() {
    let o = launch(&["--events=none"]);
    assert_eq!(o.dump_events, EventSet::NONE);
    assert!(o.warnings.is_empty());
    let o = launch(&["--events=alloc,none"]);
    assert_eq!(o.dump_events, EventSet::NONE);
    assert!(o.warnings.iter().any(|w| w.contains("'none' mixed")));
    let o = launch(&["--events=alloc,traceback"]);
    assert_eq!(
        o.dump_events,
        EventSet {
            alloc: true,
            ..EventSet::NONE
        }
    );
    assert!(o.warnings.iter().any(|w| w.contains("traceback")));
}

#[test]
fn events_errors() {
    launch_err(
        &["--events=alloc,bogus"],
        &["invalid event trace type", "--events", "'bogus'"],
    );
    launch_err(&["--events="], &["--events", "none"]);
    launch_err(&["--events=,,"], &["--events"]);
    launch_err(&["--events=ALLOC"], &["'ALLOC'"]);
}

// ----- level -------------------------------------------------------------------------

#[test]
fn levels_and_deprecated_numbers() {
    assert_eq!(
        launch(&["--level=kernel"]).levels,
        Levels {
            op: false,
            kernel: true
        }
    );
    assert_eq!(
        launch(&["--level=op,kernel"]).levels,
        Levels {
            op: true,
            kernel: true
        }
    );
    let o = launch(&["--level=0"]);
    assert_eq!(
        o.levels,
        Levels {
            op: true,
            kernel: false
        }
    );
    assert!(
        o.warnings
            .iter()
            .any(|w| w.contains("'--level=0' is deprecated") && w.contains("'--level=op'"))
    );
    let o = launch(&["--level=0,1"]);
    assert_eq!(
        o.levels,
        Levels {
            op: true,
            kernel: true
        }
    );
    assert!(
        o.warnings
            .iter()
            .any(|w| w.contains("'--level=1' is deprecated") && w.contains("'--level=kernel'"))
    );
    assert_eq!(o.levels.bits(), 3);
}

#[test]
fn level_errors() {
    launch_err(
        &["--level=2"],
        &["invalid --level value '2'", "data trace level"],
    );
    launch_err(&["--level=op,bogus"], &["'bogus'"]);
    launch_err(&["--level="], &["--level"]);
}

// ----- steps -------------------------------------------------------------------------

#[test]
fn steps_parsing_and_leaks_disabled() {
    let o = launch(&["--steps=1,2\u{ff0c}3"]);
    assert_eq!(o.steps, vec![1, 2, 3]);
    assert!(!o.analysis.leaks);
    assert!(o.warnings.is_empty(), "implicit leaks need no warning");
    let o = launch(&["--steps=4294967295,1,2,3,5"]);
    assert_eq!(o.steps, vec![u32::MAX, 1, 2, 3, 5]);
    let o = launch(&["--analysis=leaks,decompose", "--steps=2"]);
    assert!(!o.analysis.leaks && o.analysis.decompose);
    assert!(o.warnings.iter().any(|w| w.contains("--steps")));
    assert_eq!(o.analysis.bits(), 0b10);
}

#[test]
fn steps_errors() {
    launch_err(&["--steps=1,2,3,4,5,6"], &["--steps", "at most 5"]);
    for bad in ["0", "01", "-1", "+1", "1.0", "x", "4294967296"] {
        launch_err(
            &[&format!("--steps={bad}")],
            &["invalid --steps value", "invalid steps"],
        );
    }
    launch_err(&["--steps="], &["--steps"]);
}

// ----- call stack ----------------------------------------------------------------------

#[test]
fn call_stack_parsing() {
    assert_eq!(
        launch(&["--call-stack=c"]).call_stack,
        CallStack {
            c_depth: Some(50),
            python_depth: None,
            mixed: false,
            allocations_only: false,
        }
    );
    assert_eq!(
        launch(&["--call-stack=c:20,python:10"]).call_stack,
        CallStack {
            c_depth: Some(20),
            python_depth: Some(10),
            mixed: false,
            allocations_only: false,
        }
    );
    assert_eq!(
        launch(&["--call-stack=python:1000\u{ff0c}c:0"]).call_stack,
        CallStack {
            c_depth: Some(0),
            python_depth: Some(1000),
            mixed: false,
            allocations_only: false,
        }
    );
    assert_eq!(
        launch(&["--call-stack=python:10,mixed:30"]).call_stack,
        CallStack {
            c_depth: Some(30),
            python_depth: Some(10),
            mixed: true,
            allocations_only: false,
        }
    );
    assert_eq!(
        launch(&["--call-stack=c", "--call-stack="]).call_stack,
        CallStack::default()
    );
}

#[test]
fn call_stack_errors() {
    for bad in [
        "c:1001", "c:01", "c:", "c:-1", "python:x", "java", "c:5:6", "C",
    ] {
        launch_err(&[&format!("--call-stack={bad}")], &["--call-stack", bad]);
    }
    launch_err(&["--call-stack=c:1001"], &["call-stack depth"]);
}

// ----- collect mode / format / log level -----------------------------------------------

#[test]
fn collect_mode() {
    assert_eq!(
        launch(&["--collect-mode=deferred"]).collect_mode,
        CollectMode::Deferred
    );
    assert_eq!(
        launch(&["--collect-mode", "immediate"]).collect_mode,
        CollectMode::Immediate
    );
    launch_err(
        &["--collect-mode=lazy"],
        &["--collect-mode", "'lazy'", "immediate or deferred"],
    );
}

#[test]
fn format_and_deprecated_alias() {
    assert_eq!(launch(&["--format=db"]).format, DataFormat::Db);
    let o = launch(&["--data-format=db"]);
    assert_eq!(o.format, DataFormat::Db);
    assert!(
        o.warnings
            .iter()
            .any(|w| w.contains("'--data-format' is deprecated") && w.contains("'--format'"))
    );
    launch_err(&["--format=json"], &["--format", "'json'", "csv or db"]);
    launch_err(&["--data-format=json"], &["--data-format", "'json'"]);
}

#[test]
fn log_level_and_precedence() {
    assert_eq!(launch(&["--log-level=debug"]).log_level, LogLevel::Debug);
    assert_eq!(launch(&["--log-level=error"]).log_level, LogLevel::Error);
    assert_eq!(
        launch(&["--log-level=warning"]).log_level,
        LogLevel::Warning
    );
    let o = launch(&["--log-level=warn"]);
    assert_eq!(o.log_level, LogLevel::Warning);
    assert!(
        o.warnings
            .iter()
            .any(|w| w.contains("'--log-level=warn' is deprecated"))
    );
    for v in ["-v", "--verbose", "--debug"] {
        assert_eq!(launch(&[v]).log_level, LogLevel::Debug);
    }
    for q in ["-q", "--quiet"] {
        assert_eq!(launch(&[q]).log_level, LogLevel::Error);
    }
    assert_eq!(launch(&["-q", "-v"]).log_level, LogLevel::Debug);
    assert_eq!(
        launch(&["-v", "--log-level=info"]).log_level,
        LogLevel::Info
    );
    assert_eq!(
        launch(&["--log-level=info", "-q"]).log_level,
        LogLevel::Info
    );
    launch_err(
        &["--log-level=trace"],
        &["--log-level", "'trace'", "debug, info, warning or error"],
    );
}

// ----- device --------------------------------------------------------------------------

#[test]
fn device_parsing() {
    let d = launch(&["--device=npu:0,npu:3"]).devices;
    assert_eq!(
        d,
        DeviceFilter {
            all_npu: false,
            npu_mask: 0b1001,
            cpu: false
        }
    );
    assert!(d.wants_npu(0) && d.wants_npu(3) && !d.wants_npu(1) && !d.wants_npu(31));
    assert!(!d.wants_npu(32) && !d.wants_npu(u32::MAX));
    assert!(d.wants_npu(UNKNOWN_DEVICE_ID));
    assert!(!d.wants_cpu());
    let d = launch(&["--device=cpu"]).devices;
    assert!(d.wants_cpu() && !d.wants_npu(0));
    let d = launch(&["--device=npu:1,npu"]).devices;
    assert!(d.all_npu && d.wants_npu(5) && d.npu_mask == 0b10);
    let d = launch(&["--device=npu:0x1f\u{ff0c}npu:010,npu:31"]).devices;
    assert_eq!(
        d.npu_mask,
        (1 << 31) | (1 << 8) | (1 << 31) | (1 << 31) | (1 << 8) | (1 << 31)
    );
    let d = launch(&["--device=npu:0x1f,npu:010"]).devices;
    assert_eq!(d.npu_mask, (1 << 31) | (1 << 8));
    let d = DeviceFilter::default();
    assert!(d.wants_npu(0) && d.wants_npu(12345) && !d.wants_cpu());
}

#[test]
fn device_errors() {
    launch_err(
        &["--device=gpu"],
        &["invalid --device value 'gpu': expected npu, cpu or npu:N with N < 32"],
    );
    for bad in [
        "npu:32", "npu:", "npu:x", "npu:-1", "npu:0x", "npu:08", "npu:1a", "NPU",
    ] {
        launch_err(
            &[&format!("--device={bad}")],
            &["invalid --device value", bad],
        );
    }
    launch_err(&["--device="], &["--device", "at least one"]);
    launch_err(&["--device=,"], &["--device"]);
}

// ----- analysis ------------------------------------------------------------------------

#[test]
fn analysis_parsing() {
    let a = launch(&["--analysis=decompose,inefficient"]).analysis;
    assert_eq!(
        a,
        AnalysisSet {
            decompose: true,
            inefficient: true,
            ..AnalysisSet::default()
        }
    );
    let a = launch(&["--analysis=oom"]).analysis;
    assert_eq!(a.oom_top_k, Some(10));
    assert!(!a.leaks);
    assert_eq!(launch(&["--analysis=oom:1"]).analysis.oom_top_k, Some(1));
    assert_eq!(
        launch(&["--analysis=leaks\u{ff0c}oom:1000"])
            .analysis
            .bits(),
        0b1001
    );
    let o = launch(&["--analysis=none"]);
    assert!(o.analysis.is_empty() && o.warnings.is_empty());
    let o = launch(&["--analysis=leaks,none"]);
    assert!(o.analysis.is_empty());
    assert!(o.warnings.iter().any(|w| w.contains("'none' mixed")));
}

#[test]
fn analysis_errors() {
    launch_err(
        &["--analysis=bogus"],
        &["invalid --analysis value 'bogus'", "invalid analysis type"],
    );
    for bad in ["oom:0", "oom:1001", "oom:", "oom:01", "oom:x"] {
        launch_err(
            &[&format!("--analysis={bad}")],
            &["invalid OOM top-K", "1 to 1000"],
        );
    }
    launch_err(&["--analysis=oomx"], &["'oomx'"]);
    launch_err(&["--analysis="], &["--analysis", "none"]);
}

// ----- watch ---------------------------------------------------------------------------

#[test]
fn watch_parsing() {
    let o = launch(&["--watch=opA:2,opB,full-content"]);
    assert_eq!(
        o.watch,
        Some(WatchConfig {
            start: Some("opA".into()),
            output_id: Some(2),
            end: "opB".into(),
            full_content: true
        })
    );
    assert_eq!(
        parse_watch(",end").unwrap(),
        WatchConfig {
            start: None,
            output_id: None,
            end: "end".into(),
            full_content: false
        }
    );
    assert_eq!(parse_watch("s,e").unwrap().start.as_deref(), Some("s"));
    assert_eq!(parse_watch("s:0,e").unwrap().output_id, Some(0));
    assert_eq!(
        parse_watch("s:4294967295,e").unwrap().output_id,
        Some(u32::MAX)
    );
    assert!(parse_watch(&format!("{},e", "a".repeat(254))).is_ok());
}

#[test]
fn watch_errors() {
    for bad in [
        "end",
        "s,",
        ",",
        "",
        ":1,e",
        "s:,e",
        "s:01,e",
        "s:x,e",
        "s:4294967296,e",
        "s,e,full",
        "s,e,full-content,x",
        "s,e,",
    ] {
        launch_err(
            &[&format!("--watch={bad}")],
            &["invalid --watch value", "invalid watch config"],
        );
    }
    launch_err(&[&format!("--watch={},e", "a".repeat(255))], &["254"]);
    launch_err(&[&format!("--watch=s,{}", "a".repeat(255))], &["254"]);
}

// ----- lib / ring buffer -----------------------------------------------------------------

#[test]
fn libs() {
    let t = TempDir::new();
    // The first 18 bytes of an x86-64 shared object: ELF64, little-endian, ET_DYN.
    let so = b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0\x03\0";
    let a = t.file("liba.so", so);
    let b = t.file("libb.so", so);
    let link = t.path("liblink.so");
    std::os::unix::fs::symlink(&b, &link).unwrap();
    let dotted = format!("{}/./liba.so", t.0.display());
    let o = launch(&["--lib", &dotted, &format!("--lib={link}")]);
    assert_eq!(
        o.libs,
        vec![
            std::fs::canonicalize(&a).unwrap(),
            std::fs::canonicalize(&b).unwrap()
        ]
    );
}

#[test]
fn lib_errors() {
    let t = TempDir::new();
    launch_err(&["--lib", &t.path("nope.so")], &["--lib", "nope.so"]);
    launch_err(
        &["--lib", t.0.to_str().unwrap()],
        &["--lib", "not a regular file"],
    );
    launch_err(&["--lib="], &["--lib", "empty"]);
    let dangling = t.path("dangling.so");
    std::os::unix::fs::symlink(t.path("missing"), &dangling).unwrap();
    launch_err(&["--lib", &dangling], &["dangling.so"]);
}

#[test]
fn ring_buffer() {
    for (v, n) in [("1", 1), ("2", 2), ("64", 64), ("1024", 1024)] {
        assert_eq!(
            launch(&[&format!("--ring-buffer-mib={v}")]).ring_buffer_mib,
            n
        );
    }
    for bad in ["0", "3", "2048", "-1", "+16", "016", "x", "", "1.0"] {
        launch_err(
            &["--ring-buffer-mib", bad],
            &["--ring-buffer-mib", "power of two"],
        );
    }
}

// ----- list splitting -----------------------------------------------------------------

#[test]
fn list_splitting_is_character_based() {
    assert_eq!(split_list("a,b\u{ff0c}c,,\u{ff0c}"), vec!["a", "b", "c"]);
    // U+EF3C ("\u{ef3c}") contains byte 0xEF but must not split.
    assert_eq!(split_list("a\u{ef3c}b"), vec!["a\u{ef3c}b"]);
    assert_eq!(split_list(""), Vec::<&str>::new());
    let raw = OsString::from_vec(b"a\xff,b\xef\xbc\x8cc\xef\xbc".to_vec());
    let parts: Vec<_> = split_list_os(&raw)
        .into_iter()
        .map(|p| p.as_bytes().to_vec())
        .collect();
    assert_eq!(
        parts,
        vec![b"a\xff".to_vec(), b"b".to_vec(), b"c\xef\xbc".to_vec()]
    );
}

#[test]
fn number_helpers() {
    assert_eq!(parse_decimal("0", true), Some(0));
    assert_eq!(parse_decimal("0", false), None);
    assert_eq!(parse_decimal("00", true), None);
    assert_eq!(parse_decimal("4294967295", false), Some(u32::MAX));
    assert_eq!(parse_decimal("4294967296", false), None);
    assert_eq!(parse_c_number("0x1F"), Some(31));
    assert_eq!(parse_c_number("017"), Some(15));
    assert_eq!(parse_c_number("0"), Some(0));
    assert_eq!(parse_c_number("09"), None);
    assert_eq!(parse_c_number("0x"), None);
}

// ----- config.json --------------------------------------------------------------------

#[test]
fn config_json_defaults_exact() {
    let mut o = launch(&[]);
    o.output_dir = PathBuf::from("/tmp/out");
    let expected = r#"{
    "SelectedStepList": {
        "stepCount": 0,
        "stepIdList": [
            0,
            0,
            0,
            0,
            0
        ]
    },
    "analysisType": 1,
    "cStackDepth": 0,
    "collectAllNpu": true,
    "collectCpu": false,
    "collectMode": 0,
    "dataFormat": 0,
    "dumpEventType": 7,
    "enableCStack": false,
    "enableCompare": false,
    "enablePyStack": true,
    "eventType": 7,
    "isEffective": true,
    "levelType": 1,
    "logLevel": 1,
    "npuSlots": 0,
    "oomTopK": 10,
    "outputDir": "/tmp/out",
    "pyStackDepth": 16,
    "watchConfig": {
        "end": "",
        "fullContent": false,
        "isWatched": false,
        "outputId": 4294967295,
        "start": ""
    }
}"#;
    assert_eq!(config_json(&o.recorded()), expected);
}

#[test]
fn config_json_values() {
    let mut o = launch(&[
        "--steps=3,7",
        "--events=access",
        "--analysis=oom:5,decompose",
        "--level=kernel",
        "--device=npu:2,cpu",
        "--call-stack=c:20,python",
        "--collect-mode=deferred",
        "--format=db",
        "--log-level=error",
        "--watch=mm:1,add,full-content",
    ]);
    o.output_dir = PathBuf::from("/tmp/a \"q\"\\\t");
    let j = config_json(&o.recorded());
    for needle in [
        "\"stepCount\": 2",
        "            3,\n            7,\n            0,",
        "\"analysisType\": 10",
        "\"oomTopK\": 5",
        "\"eventType\": 11",
        "\"dumpEventType\": 8",
        "\"levelType\": 2",
        "\"collectAllNpu\": false",
        "\"collectCpu\": true",
        "\"npuSlots\": 4",
        "\"enableCStack\": true",
        "\"cStackDepth\": 20",
        "\"enablePyStack\": true",
        "\"pyStackDepth\": 50",
        "\"collectMode\": 1",
        "\"dataFormat\": 1",
        "\"logLevel\": 3",
        "\"isWatched\": true",
        "\"fullContent\": true",
        "\"start\": \"mm\"",
        "\"end\": \"add\"",
        "\"outputId\": 1",
        "\"outputDir\": \"/tmp/a \\\"q\\\"\\\\\\t\"",
    ] {
        assert!(j.contains(needle), "{needle:?} not in\n{j}");
    }
}

#[test]
fn json_escape_controls() {
    let mut s = String::new();
    json_escape("a\u{1}\u{8}\u{c}\n\r\u{7f}结", &mut s);
    assert_eq!(s, "\"a\\u0001\\b\\f\\n\\r\u{7f}结\"");
}

#[test]
fn error_display_and_trait() {
    let e = CliError::usage("boom");
    assert_eq!(e.to_string(), "boom");
    let _: &dyn std::error::Error = &e;
    assert_ne!(e.exit_code, 0);
}

#[test]
fn control_chars_in_values_are_escaped_in_messages() {
    let e = err(&["--format=a\nb", "true"]);
    assert!(e.message.contains("a\\nb"), "{e}");
    assert!(!e.message.contains('\n'));
}

/// `agent`'s options, parsed through the main command line (moved here from `agent/`, which
/// never uses the front end).
mod agent_options {
    use super::*;
    use crate::agent::options::AgentOptions;
    use std::ffi::OsString;

    /// Parses the arguments after `agent`, through the main command line.
    fn parse(args: &[OsString]) -> Result<AgentOptions, CliError> {
        let argv = ["memscope-bpf", "agent"].map(OsString::from);
        match parse_from(argv.into_iter().chain(args.iter().cloned()))?.mode {
            Mode::Agent(opts) => Ok(opts),
            mode => panic!("{mode:?}"),
        }
    }

    fn p(args: &[&str]) -> Result<AgentOptions, CliError> {
        parse(&args.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn defaults_and_both_value_spellings() {
        let o = p(&[]).unwrap();
        assert_eq!(o.listen.to_string(), "127.0.0.1:9464");
        assert_eq!(o.sample_bytes, 524288);
        let o = p(&[
            "--listen=127.0.0.1:1234",
            "--sample-bytes",
            "0",
            "--leak-steps=2",
            "--python-depth",
            "0",
        ])
        .unwrap();
        assert_eq!(o.python_depth, 0);
        assert_eq!(p(&[]).unwrap().python_depth, 32);
        assert_eq!(o.listen.port(), 1234);
        assert_eq!(o.sample_bytes, 0);
        assert_eq!(o.leak_steps, 2);
    }

    #[test]
    fn the_hold_is_the_default_and_no_hold_turns_it_off() {
        assert!(p(&[]).unwrap().holds());
        assert!(p(&["--hold"]).unwrap().holds(), "still accepted");
        assert!(!p(&["--no-hold"]).unwrap().holds());
        // The last one given wins (a wrapper's default, then the user's).
        assert!(!p(&["--hold", "--no-hold"]).unwrap().holds());
        assert!(p(&["--no-hold", "--hold"]).unwrap().holds());
    }

    #[test]
    fn bad_values_are_usage_errors_that_say_what_is_accepted() {
        for (args, needle) in [
            (&["--listen", "nowhere"][..], "IP:PORT"),
            (&["--ring-buffer-mib=3"][..], "power of two"),
            (&["--leak-steps=0"][..], "at least 1 step"),
            (&["--python-depth=200"][..], "from 0 to 128"),
            (&["--bogus"][..], "unknown agent option"),
            (&["1234"][..], "takes no program or pid"),
            (&["--lib"][..], "needs a value"),
        ] {
            let e = p(args).unwrap_err();
            assert_eq!(e.exit_code, 2, "{args:?}");
            assert!(e.message.contains(needle), "{args:?}: {}", e.message);
        }
        assert_eq!(p(&["--help"]).unwrap_err().exit_code, 0);
    }
}
