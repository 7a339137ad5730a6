//! Shared helpers for the end-to-end tests: fixture build, running the tracer, and parsers for
//! the dump CSVs and the workloads' ground-truth logs (format in tests/fixtures/README.md).
#![allow(dead_code)]

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::{Mutex, OnceLock},
};

pub mod agent;
pub mod chromium;
pub mod dashboard;
mod torch_bed;
#[allow(unused_imports)] // only the torch bed tests use it
pub use torch_bed::*;

pub const TRACER: &str = env!("CARGO_BIN_EXE_memscope-bpf");

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// True when the tests can load BPF; otherwise prints a loud SKIPPED line.
pub fn require_root(test: &str) -> bool {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    eprintln!("SKIPPED {test}: needs root (CAP_BPF + CAP_PERFMON) to load BPF programs");
    println!("SKIPPED {test}: needs root");
    false
}

/// Builds the C fixtures once per test binary and returns `tests/fixtures/build`, or returns
/// `$MEMSCOPE_FIXTURES_DIR` as it is: fixtures built elsewhere (the arm64 VM of `cargo xtask
/// test-aarch64` has no compiler; its fixtures are cross-built on the host).
pub fn fixtures() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Some(dir) = std::env::var_os("MEMSCOPE_FIXTURES_DIR") {
                return PathBuf::from(dir);
            }
            let dir = repo_root().join("tests/fixtures");
            let out = Command::new("make")
                .arg("-s")
                .arg("-C")
                .arg(&dir)
                .output()
                .expect("run make");
            assert!(
                out.status.success(),
                "fixture build failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            dir.join("build")
        })
        .clone()
}

pub fn bin(name: &str) -> PathBuf {
    fixtures().join("bin").join(name)
}

/// Tracing tests share the kernel's uprobes on the same fixture files; run them one at a time
/// so that timing-sensitive ones (SIGTERM mid-run) are not starved on a 2-core machine.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh scratch directory for one test, removed when the test passes. A failed test keeps
/// it (and says where) so its dumps can be read; a full run leaves nothing behind, since the
/// traces of a few hundred tests would otherwise fill the disk run after run.
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "kept the failed test's scratch directory {}",
                self.0.display()
            );
        } else if let Err(e) = fs::remove_dir_all(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("could not remove {}: {e}", self.0.display());
        }
    }
}

/// A fresh scratch directory for one test; see [`Scratch`].
pub fn scratch(name: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("memscope-e2e-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

pub fn run_tracer(args: &[&str]) -> Output {
    // Tests run as plain root: a `sudo` around the test run must not make the tracer launch
    // the fixtures as the invoking user.
    Command::new(TRACER)
        .env_remove("SUDO_UID")
        .args(args)
        .output()
        .expect("run memscope-bpf")
}

/// One row of a memscope_dump CSV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpRow {
    pub id: u64,
    pub event: String,
    pub event_type: String,
    pub name: String,
    pub ts: u64,
    pub pid: u32,
    pub tid: u32,
    pub device: String,
    pub ptr: String,
    pub attr: BTreeMap<String, String>,
    pub raw_attr: String,
}

impl DumpRow {
    pub fn size(&self) -> u64 {
        self.attr["size"].parse().unwrap()
    }
    pub fn addr(&self) -> u64 {
        u64::from_str_radix(self.ptr.trim_start_matches("0x"), 16).unwrap()
    }
}

pub const HEADER: &str = "ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,Ptr,Attr,Call Stack(Python),Call Stack(C)";

/// Splits a CSV line honouring double quotes.
pub fn split_csv(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

pub fn parse_dump(path: &Path) -> Vec<DumpRow> {
    let text = fs::read_to_string(path).unwrap();
    assert_eq!(
        text.lines().next(),
        Some(HEADER),
        "header of {}",
        path.display()
    );
    // Records, not lines: a stack column holds line breaks (Python programs have their
    // stacks by default).
    parse_dump_records(&text)
        .into_iter()
        .map(|f| {
            assert_eq!(f.len(), 12, "12 columns in {f:?}");
            let raw_attr = f[9].clone();
            let mut attr = BTreeMap::new();
            if !raw_attr.is_empty() {
                let inner = raw_attr
                    .strip_prefix('{')
                    .and_then(|s| s.strip_suffix('}'))
                    .expect("braced attr");
                for kv in inner.split(',') {
                    let (k, v) = kv.split_once(':').expect("k:v");
                    attr.insert(k.to_string(), v.to_string());
                }
            }
            DumpRow {
                id: f[0].parse().unwrap(),
                event: f[1].clone(),
                event_type: f[2].clone(),
                name: f[3].clone(),
                ts: f[4].parse().unwrap(),
                pid: f[5].parse().unwrap(),
                tid: f[6].parse().unwrap(),
                device: f[7].clone(),
                ptr: f[8].clone(),
                attr,
                raw_attr,
            }
        })
        .collect()
}

/// All files under `dir` whose name starts with `prefix`.
pub fn find_files(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(find_files(&p, prefix));
        } else if p.file_name().unwrap().to_string_lossy().starts_with(prefix) {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Every dump row written under `dir`, for the process directory of `pid`.
pub fn rows_of(dir: &Path, pid: u32) -> Vec<DumpRow> {
    let proc_dir =
        process_dir(dir, pid).unwrap_or_else(|| panic!("no output directory for pid {pid}"));
    let mut rows: Vec<DumpRow> = Vec::new();
    for f in find_files(&proc_dir, "memscope_dump_") {
        for r in parse_dump(&f) {
            // Device-less rows are copied into every device file: keep one copy.
            if !rows.iter().any(|x| x.id == r.id) {
                rows.push(r);
            }
        }
    }
    rows.sort_by_key(|r| r.id);
    rows
}

pub fn process_dir(dir: &Path, pid: u32) -> Option<PathBuf> {
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.starts_with(&format!("msmemscope_{pid}_")) && n.ends_with("_ascend")
        })
}

/// One ground-truth line of a workload log.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct GtBlock {
    pub kind: String,
    pub pid: u32,
    pub tid: u32,
    pub dev: String,
    pub addr: u64,
    pub size: u64,
    pub step: u32,
}

#[derive(Debug, Default)]
pub struct GroundTruth {
    pub pid: u32,
    pub blocks: Vec<GtBlock>,
    pub marks: Vec<String>,
    pub range_starts: Vec<String>,
    pub range_ends: usize,
    pub summary: BTreeMap<String, u64>,
}

impl GroundTruth {
    pub fn of(&self, kind: &str) -> Vec<GtBlock> {
        self.blocks
            .iter()
            .filter(|b| b.kind == kind)
            .cloned()
            .collect()
    }
}

pub fn parse_log(path: &Path) -> GroundTruth {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut gt = GroundTruth::default();
    for line in text.lines() {
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        let field = |k: &str| -> Option<String> {
            rest.split(' ')
                .find_map(|kv| kv.strip_prefix(&format!("{k}=")).map(str::to_string))
        };
        let text_field = || {
            rest.split_once("text=")
                .map(|(_, t)| t.to_string())
                .unwrap_or_default()
        };
        match kind {
            "MALLOC" | "FREE" | "CREATE" | "RELEASE" | "LEAK" => gt.blocks.push(GtBlock {
                kind: kind.to_string(),
                pid: field("pid").unwrap().parse().unwrap(),
                tid: field("tid").unwrap().parse().unwrap(),
                dev: field("dev").unwrap(),
                addr: u64::from_str_radix(field("addr").unwrap().trim_start_matches("0x"), 16)
                    .unwrap(),
                size: field("size").unwrap().parse().unwrap(),
                step: field("step").unwrap().parse().unwrap(),
            }),
            "MARK" => gt.marks.push(text_field()),
            "RANGE_START" => gt.range_starts.push(text_field()),
            "RANGE_END" => gt.range_ends += 1,
            "SUMMARY" => {
                gt.pid = field("pid").unwrap().parse().unwrap();
                for kv in rest.split(' ') {
                    if let Some((k, v)) = kv.split_once('=') {
                        gt.summary.insert(k.to_string(), v.parse().unwrap());
                    }
                }
            }
            _ => {}
        }
    }
    gt
}

/// (kind, tid, device, addr, size) of memory rows, sorted, for multiset comparison.
pub fn memory_rows(rows: &[DumpRow], event: &str) -> Vec<(u32, String, u64, u64)> {
    let mut v: Vec<_> = rows
        .iter()
        .filter(|r| r.event == event)
        .map(|r| (r.tid, r.device.clone(), r.addr(), r.size()))
        .collect();
    v.sort();
    v
}

pub fn gt_rows(gt: &GroundTruth, kinds: &[&str]) -> Vec<(u32, String, u64, u64)> {
    let mut v: Vec<_> = gt
        .blocks
        .iter()
        .filter(|b| kinds.contains(&b.kind.as_str()))
        .map(|b| (b.tid, b.dev.clone(), b.addr, b.size))
        .collect();
    v.sort();
    v
}

/// Rows of the leak CSVs of a process: (tid, device, addr, size, step) (the Site column may be
/// quoted; it is not read here).
pub fn leak_rows(dir: &Path, pid: u32) -> Vec<(u32, String, u64, u64, u32)> {
    let proc_dir = process_dir(dir, pid).unwrap();
    let mut v = Vec::new();
    for f in find_files(&proc_dir, "leaks_") {
        let text = fs::read_to_string(&f).unwrap();
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some(
                "Process Id,Thread Id,Device Id,Event Type,Ptr,Size,Step,Allocation Id,Module,Timestamp(ns),Leak,Site"
            )
        );
        for l in lines {
            let c: Vec<&str> = l.split(',').collect();
            assert_eq!(c[0].parse::<u32>().unwrap(), pid);
            v.push((
                c[1].parse().unwrap(),
                c[2].to_string(),
                u64::from_str_radix(c[4].trim_start_matches("0x"), 16).unwrap(),
                c[5].parse().unwrap(),
                c[6].parse().unwrap(),
            ));
        }
    }
    v.sort();
    v
}

pub fn gt_leaks(gt: &GroundTruth) -> Vec<(u32, String, u64, u64, u32)> {
    let mut v: Vec<_> = gt
        .of("LEAK")
        .into_iter()
        .map(|b| (b.tid, b.dev, b.addr, b.size, b.step))
        .collect();
    v.sort();
    v
}

/// `memscope-bpf -o OUT_DIR --call-stack=python --pid PID` in the background, returned once it
/// says it is attached.
pub fn attach_python_tracer(out_dir: &Path, pid: u32) -> Background {
    let mut tracer = Background::spawn(&[
        "-o",
        out_dir.to_str().unwrap(),
        "--call-stack=python",
        "--pid",
        &pid.to_string(),
    ]);
    tracer.wait_for("attached to pid", 90);
    tracer
}

/// Waits until `path` contains `needle` (a workload's `PID` line, say), up to `secs`.
pub fn wait_for_text(path: &Path, needle: &str, secs: u64) -> String {
    let start = std::time::Instant::now();
    loop {
        if let Ok(t) = fs::read_to_string(path)
            && t.contains(needle)
        {
            return t;
        }
        assert!(
            start.elapsed().as_secs() < secs,
            "timed out waiting for {needle:?} in {}",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Runs `workload --wait-file GO <workload_args>` under the tracer (`tracer_args`, then a
/// 1 MiB ring buffer) with the tracer frozen while the workload runs, so the ring fills for
/// sure. Asserts the target got through `exit()` and the tracer reported losses and exited 0;
/// returns the target's pid and the tracer's stderr.
pub fn run_with_full_ring(
    dir: &Path,
    out_dir: &Path,
    tracer_args: &[&str],
    workload_args: &[&str],
) -> (u32, String) {
    let go = dir.join("go");
    let workload = bin("workload");
    let mut args = vec!["-o", out_dir.to_str().unwrap()];
    args.extend_from_slice(tracer_args);
    args.extend_from_slice(&[
        "--ring-buffer-mib=1",
        "--",
        workload.to_str().unwrap(),
        "--wait-file",
        go.to_str().unwrap(),
    ]);
    args.extend_from_slice(workload_args);
    let mut tracer = Background::spawn(&args);
    let pid = tracer.target_pid();
    let end = tracer.run_target_frozen(pid, &go);
    assert!(
        end.is_none() || end == Some('Z'),
        "target left in state {end:?}"
    );
    tracer.wait_for("event(s): the ring buffer was full", 120);
    let (code, stderr) = tracer.finish();
    assert_eq!(code, Some(0), "{stderr}");
    (pid, stderr)
}

/// The state letter of `/proc/PID/stat` (None once the process is gone).
pub fn process_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.trim().chars().next()
}

/// A tracer started in the background whose stderr is collected while the test goes on.
pub struct Background {
    pub child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Background {
    pub fn spawn(args: &[&str]) -> Background {
        Self::spawn_with_env(args, &[])
    }

    /// As `spawn`, with `env` set for the tracer.
    pub fn spawn_with_env(args: &[&str], env: &[(&str, &str)]) -> Background {
        use std::io::BufRead;
        let mut child = Command::new(TRACER)
            .env_remove("SUDO_UID")
            .envs(env.iter().copied())
            .args(args)
            // A target's own output would land amid the test harness's result lines.
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start memscope-bpf");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Background {
            child,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// Waits until the tracer printed a line containing `needle`.
    pub fn wait_for(&mut self, needle: &str, secs: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        while !self.seen.iter().any(|l| l.contains(needle)) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => panic!(
                    "tracer never printed {needle:?}; stderr so far:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// The first line seen so far that contains `needle` (call after `wait_for(needle)`).
    pub fn seen_line(&self, needle: &str) -> &str {
        self.seen
            .iter()
            .find(|l| l.contains(needle))
            .map(String::as_str)
            .unwrap_or_else(|| panic!("no line with {needle:?} seen"))
    }

    /// The pid of the launched target, from the line announcing it (`... (pid N)`).
    pub fn target_pid(&mut self) -> u32 {
        self.wait_for("(pid ", 60);
        self.seen_line("(pid ")
            .rsplit("(pid ")
            .next()
            .and_then(|r| r.trim_end_matches(')').parse().ok())
            .expect("target pid")
    }

    /// Lets a launched target that waits for the file `go` run to its end while this tracer is
    /// frozen (SIGSTOP: nobody drains the ring buffer), then thaws the tracer. Returns the
    /// target's state at the end: None (gone) or `Z` once it got through, anything else if it
    /// was still there after 240 s.
    pub fn run_target_frozen(&mut self, pid: u32, go: &Path) -> Option<char> {
        use std::time::{Duration, Instant};
        // The target waits for the file, running (not held at its exec stop any more). Before
        // its exec the launched child also sleeps, on the tracer's start gate: freezing the
        // tracer then would leave it there, so wait for the program itself.
        let tracer_exe = fs::canonicalize(TRACER).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while process_state(pid) != Some('S')
            || fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == tracer_exe)
        {
            assert!(
                Instant::now() < deadline,
                "target never started: {:?}",
                process_state(pid)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let tracer = self.child.id() as i32;
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(tracer, libc::SIGSTOP) };
        fs::write(go, b"").unwrap();
        // Generous: on a loaded 2-CPU machine thousands of probed calls with stack copies
        // took over a minute; the loop ends as soon as the target is through.
        let deadline = Instant::now() + Duration::from_secs(240);
        let end = loop {
            let s = process_state(pid);
            if s.is_none() || s == Some('Z') || Instant::now() > deadline {
                break s;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        unsafe { libc::kill(tracer, libc::SIGCONT) };
        end
    }

    /// Waits for the tracer to exit; returns its exit code and its whole stderr.
    pub fn finish(mut self) -> (Option<i32>, String) {
        let status = self.child.wait().unwrap();
        while let Ok(l) = self.lines.recv_timeout(std::time::Duration::from_secs(5)) {
            self.seen.push(l);
        }
        (status.code(), self.seen.join("\n"))
    }
}

/// Splits a whole CSV text into records of fields, honouring quotes (fields may hold commas,
/// doubled quotes and newlines, as the stack column does). The header is skipped.
pub fn parse_dump_records(text: &str) -> Vec<Vec<String>> {
    let mut records = Vec::new();
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut cur)),
            '\n' if !quoted => {
                fields.push(std::mem::take(&mut cur));
                records.push(std::mem::take(&mut fields));
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() || !fields.is_empty() {
        fields.push(cur);
        records.push(fields);
    }
    records.into_iter().skip(1).collect()
}

/// The `key=value` fields of a ground-truth log line, after its first word.
pub fn log_fields(line: &str) -> std::collections::BTreeMap<&str, &str> {
    line.split(' ')
        .skip(1)
        .filter_map(|kv| kv.split_once('='))
        .collect()
}

/// The fields of every log line whose first word is `kind`.
pub fn log_lines<'a>(
    text: &'a str,
    kind: &str,
) -> Vec<std::collections::BTreeMap<&'a str, &'a str>> {
    text.lines()
        .filter(|l| l.split(' ').next() == Some(kind))
        .map(log_fields)
        .collect()
}

/// A ground-truth log line's `stack=[["file",line,"function"],...]` field (the script's JSON; no escapes in our
/// paths and names) as msMemScope's text, innermost first.
pub fn log_stack_text(line: &str) -> String {
    let json = line
        .split_once(" stack=")
        .expect("stack field")
        .1
        .split(' ')
        .next()
        .unwrap();
    json.trim_start_matches("[[")
        .trim_end_matches("]]")
        .split("],[")
        .map(|f| {
            let parts: Vec<&str> = f.split(',').collect();
            assert_eq!(parts.len(), 3, "frame {f:?}");
            let line: u32 = parts[1].parse().unwrap();
            format!(
                "{}({line}): {}\n",
                parts[0].trim_matches('"'),
                parts[2].trim_matches('"')
            )
        })
        .collect()
}

/// Waits (at most `secs`) for the traced script to exit.
pub fn wait_for_exit(target: &mut std::process::Child, secs: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while target.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the traced script did not finish"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `0x1f` or `1f` as a number.
pub fn hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap()
}

/// The working `python3.M` interpreters of these minor versions.
pub fn interpreters_of(minors: &[u32]) -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    for &minor in minors {
        let name = format!("python3.{minor}");
        let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join(&name)).collect())
            .unwrap_or_default();
        if let Ok(dir) = std::fs::read_dir("/root/.pyenv/versions") {
            let mut versions: Vec<PathBuf> = dir
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(&format!("3.{minor}.")))
                })
                .collect();
            versions.sort();
            candidates.extend(versions.into_iter().map(|v| v.join("bin").join(&name)));
        }
        // A pyenv shim fails for versions that are not selected: run each candidate.
        if let Some(p) = candidates.into_iter().find(|p| {
            std::process::Command::new(p)
                .args(["-c", "import ctypes"])
                .output()
                .is_ok_and(|o| o.status.success())
        }) {
            found.push((format!("3.{minor}"), p));
        }
    }
    found
}

/// The "PID n" line a fixture workload prints first.
pub fn job_pid(stdout: &[u8]) -> u32 {
    String::from_utf8_lossy(stdout)
        .lines()
        .find_map(|l| l.strip_prefix("PID ")?.trim().parse().ok())
        .expect("PID line")
}

/// Lets a gated workload go however the test ends (it polls for the file).
pub struct GoOnDrop(pub PathBuf);

impl Drop for GoOnDrop {
    fn drop(&mut self) {
        let _ = fs::write(&self.0, b"");
    }
}
