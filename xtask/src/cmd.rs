//! Running external commands with useful error reports.
//!
//! Every failure names the command line that failed and carries its stderr
//! (or the tail of it for long-running commands), so a CI log is enough to
//! see what went wrong.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;

use anyhow::{Context, Result, bail};

/// How many trailing stderr lines of a streamed command are kept for the error report.
const TAIL_LINES: usize = 60;

/// A shell-like rendering of `cmd`: `ENV=val program arg 'arg with space'`.
pub fn describe(cmd: &Command) -> String {
    let mut parts = Vec::new();
    for (key, value) in cmd.get_envs() {
        // PATH is long and setup reports its change itself.
        if let Some(value) = value.filter(|_| key != "PATH") {
            parts.push(format!("{}={}", key.to_string_lossy(), quote(value)));
        }
    }
    parts.push(quote(cmd.get_program()));
    parts.extend(cmd.get_args().map(quote));
    let mut line = parts.join(" ");
    if let Some(dir) = cmd.get_current_dir() {
        line.push_str(&format!("  (in {})", dir.display()));
    }
    line
}

fn quote(s: &OsStr) -> String {
    let s = s.to_string_lossy();
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

fn spawn_error(cmd: &Command, err: std::io::Error) -> anyhow::Error {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let hint = if err.kind() == std::io::ErrorKind::NotFound {
        format!(" (is `{program}` installed and on PATH?)")
    } else {
        String::new()
    };
    anyhow::anyhow!("could not start `{}`: {err}{hint}", describe(cmd))
}

fn status_text(status: ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("exit status {code}"),
        None => {
            use std::os::unix::process::ExitStatusExt;
            match status.signal() {
                Some(sig) => format!("killed by signal {sig}"),
                None => status.to_string(),
            }
        }
    }
}

/// The process exit code that mirrors `status` (128 + signal for a killed child).
pub fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
        (None, None) => 1,
    }
}

/// Runs `cmd` quietly and returns its stdout; fails with the command line and
/// its stderr if it cannot start or exits unsuccessfully.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| spawn_error(cmd, e))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let mut msg = format!("`{}` failed ({})", describe(cmd), status_text(out.status));
        if !stderr.trim().is_empty() {
            msg.push_str(&format!("\n--- stderr ---\n{}", stderr.trim_end()));
        }
        if !stdout.trim().is_empty() {
            msg.push_str(&format!("\n--- stdout ---\n{}", stdout.trim_end()));
        }
        bail!(msg);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Like [`output`], but `Ok(None)` when the command ran and failed (or could not start):
/// for probes such as "is this tool working?".
pub fn probe(cmd: &mut Command) -> Option<String> {
    let out = cmd.stdin(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a long command with its output shown live; stderr is also kept (its
/// last lines) so that a failure report repeats the end of it.
pub fn stream(cmd: &mut Command) -> Result<()> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| spawn_error(cmd, e))?;
    let stderr = child.stderr.take().expect("stderr is piped");
    let reader = thread::spawn(move || {
        let mut tail = VecDeque::with_capacity(TAIL_LINES);
        let mut echo = std::io::stderr();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = writeln!(echo, "{line}");
            if tail.len() == TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(line);
        }
        tail
    });
    let status = child
        .wait()
        .with_context(|| format!("waiting for `{}`", describe(cmd)))?;
    let tail = reader.join().unwrap_or_default();
    if !status.success() {
        let tail: Vec<String> = tail.into();
        bail!(
            "`{}` failed ({})\n--- last {} lines of stderr ---\n{}",
            describe(cmd),
            status_text(status),
            tail.len(),
            tail.join("\n")
        );
    }
    Ok(())
}

/// Runs `cmd` attached to the terminal and returns its status (the caller decides
/// what a failure means); fails only if it cannot be started.
pub fn interactive(cmd: &mut Command) -> Result<ExitStatus> {
    cmd.status().map_err(|e| spawn_error(cmd, e))
}

/// Totals of the `test result: ... N passed; M failed; ...` lines cargo test printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TestTotals {
    pub passed: u64,
    pub failed: u64,
}

/// Runs `cmd` with its stdout shown as it comes and scanned for cargo's test result lines.
pub fn cargo_test(cmd: &mut Command) -> Result<(ExitStatus, TestTotals)> {
    use std::io::{BufRead, BufReader, Write};
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| spawn_error(cmd, e))?;
    let mut totals = TestTotals::default();
    let stdout = child.stdout.take().expect("piped");
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        println!("{line}");
        let _ = std::io::stdout().flush();
        if let Some(rest) = line.strip_prefix("test result: ") {
            for part in rest.split(';') {
                let mut words = part.split_whitespace().rev();
                let (Some(kind), Some(n)) = (words.next(), words.next()) else {
                    continue;
                };
                let n: u64 = n.parse().unwrap_or(0);
                match kind {
                    "passed" => totals.passed += n,
                    "failed" => totals.failed += n,
                    _ => {}
                }
            }
        }
    }
    let status = child.wait().map_err(|e| spawn_error(cmd, e))?;
    Ok((status, totals))
}

/// Reports a failed interactive command: its output is already on the terminal.
pub fn report_failure(tag: &str, cmd: &Command, status: ExitStatus) {
    eprintln!(
        "[{tag}] `{}` failed ({}); its output is above",
        describe(cmd),
        status_text(status)
    );
}
