//! `cargo xtask demo`: traces the demo training fixture and shows where the results went.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use anyhow::{Result, bail};

use crate::{cmd, setup};

const TAG: &str = "[demo]";

pub fn run(repo: &Path) -> Result<u8> {
    if crate::effective_uid() != Some(0) {
        eprintln!(
            "{TAG} the tracer attaches eBPF uprobes to the traced process, which needs root \
             (CAP_BPF + CAP_PERFMON at least); you are not root.\n\
             {TAG} run it as root, e.g.: sudo -E env \"PATH=$PATH\" cargo xtask demo"
        );
        return Ok(1);
    }
    let ready = setup::run(repo, &setup::Options::default())?;

    let mut build = crate::cargo(repo, &ready);
    build.args(["build", "--release", "-p", "memscope-bpf"]);
    println!("{TAG} + {}", cmd::describe(&build));
    let status = cmd::interactive(&mut build)?;
    if !status.success() {
        cmd::report_failure("demo", &build, status);
        return Ok(cmd::exit_code(status));
    }

    let tracer = target_dir(repo).join("release/memscope-bpf");
    let workload = repo.join("tests/fixtures/build/bin/demo_train");
    if !workload.is_file() {
        bail!(
            "{} does not exist; `make -C tests/fixtures` (run by setup) should have built it",
            workload.display()
        );
    }
    let out_dir = repo.join("target/demo");
    let before = files_under(&out_dir);

    let mut trace = Command::new(&tracer);
    trace
        .current_dir(repo)
        .arg(format!("--output-path={}", out_dir.display()))
        // The HTML report of the run, in the process directory (open it in a browser).
        .arg("--report")
        .arg("--")
        .arg(&workload);
    println!("{TAG} + {}", cmd::describe(&trace));
    let status = cmd::interactive(&mut trace)?;
    if !status.success() {
        cmd::report_failure("demo", &trace, status);
    }

    report_results(repo, &out_dir, &before);
    Ok(cmd::exit_code(status))
}

/// `$CARGO_TARGET_DIR` if set (relative to the repo), else `<repo>/target`.
fn target_dir(repo: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => repo.join(dir),
        None => repo.join("target"),
    }
}

/// Every file under `dir` (recursively), relative to it, with its modification time.
fn files_under(dir: &Path) -> HashMap<PathBuf, Option<SystemTime>> {
    let mut files = HashMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        let Ok(entries) = fs::read_dir(&current) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(path);
            } else if let Ok(rel) = path.strip_prefix(dir) {
                files.insert(rel.to_path_buf(), meta.modified().ok());
            }
        }
    }
    files
}

/// What this run wrote under the output directory (paths relative to it).
#[derive(Debug, Default, PartialEq)]
struct Written {
    /// The newest top-level directory that this run wrote into.
    run_dir: Option<PathBuf>,
    /// Files written inside `run_dir`.
    inside: Vec<PathBuf>,
    /// Files written elsewhere under the output directory.
    outside: Vec<PathBuf>,
}

fn written_since(out_dir: &Path, before: &HashMap<PathBuf, Option<SystemTime>>) -> Written {
    let mut written: Vec<PathBuf> = files_under(out_dir)
        .into_iter()
        .filter(|(path, mtime)| before.get(path) != Some(mtime))
        .map(|(path, _)| path)
        .collect();
    written.sort();
    let run_dir = written
        .iter()
        .filter(|p| p.components().count() > 1)
        .filter_map(|p| p.components().next())
        .map(|c| PathBuf::from(c.as_os_str()))
        .filter_map(|dir| Some((fs::metadata(out_dir.join(&dir)).ok()?.modified().ok()?, dir)))
        .max()
        .map(|(_, dir)| dir);
    let (inside, outside) = written
        .into_iter()
        .partition(|p| run_dir.as_ref().is_some_and(|d| p.starts_with(d)));
    Written {
        run_dir,
        inside,
        outside,
    }
}

fn report_results(repo: &Path, out_dir: &Path, before: &HashMap<PathBuf, Option<SystemTime>>) {
    let shown = |p: &Path| -> String { p.strip_prefix(repo).unwrap_or(p).display().to_string() };
    let written = written_since(out_dir, before);
    if written.inside.is_empty() && written.outside.is_empty() {
        println!("{TAG} this run wrote no files under {}", shown(out_dir));
        return;
    }
    if let Some(dir) = &written.run_dir {
        println!("{TAG} results of this run: {}/", shown(&out_dir.join(dir)));
        for file in &written.inside {
            print_file(&out_dir.join(file), &shown);
        }
    }
    if !written.outside.is_empty() {
        let label = if written.run_dir.is_some() {
            "also written"
        } else {
            "written"
        };
        println!("{TAG} {label} under {}/:", shown(out_dir));
        for file in &written.outside {
            print_file(&out_dir.join(file), &shown);
        }
    }
}

fn print_file(path: &Path, shown: &dyn Fn(&Path) -> String) {
    let size = fs::metadata(path)
        .map(|m| human_size(m.len()))
        .unwrap_or_else(|_| "?".to_owned());
    println!("{TAG}   {}  ({size})", shown(path));
}

fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_newest_run_directory() {
        let out = std::env::temp_dir().join(format!("xtask-demo-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&out);
        fs::create_dir_all(out.join("old-run")).unwrap();
        fs::write(out.join("old-run/leaks.csv"), "old").unwrap();
        let before = files_under(&out);

        fs::create_dir_all(out.join("new-run/sub")).unwrap();
        fs::write(out.join("new-run/leaks.csv"), "a").unwrap();
        fs::write(out.join("new-run/sub/events.db"), "b").unwrap();
        fs::write(out.join("loose.log"), "c").unwrap();
        let written = written_since(&out, &before);
        fs::remove_dir_all(&out).unwrap();

        assert_eq!(
            written,
            Written {
                run_dir: Some("new-run".into()),
                inside: vec!["new-run/leaks.csv".into(), "new-run/sub/events.db".into()],
                outside: vec!["loose.log".into()],
            }
        );
        assert_eq!(human_size(512), "512 B");
        assert_eq!(human_size(1536), "1.5 KiB");
    }
}
