//! `cargo xtask demo`: traces the demo training fixture with C stacks and the HTML report,
//! shows where the results went, and with `--screenshot PNG` renders the report the way the
//! README's picture (docs/img/report.png) shows it.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use anyhow::{Context, Result, bail};

use crate::{cmd, setup};

const TAG: &str = "[demo]";

/// `cargo xtask demo [--screenshot PNG]`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Where to write a screenshot of the run's report.
    pub screenshot: Option<PathBuf>,
}

pub fn parse(args: &[String]) -> Result<Options> {
    let mut opts = Options::default();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--screenshot" => {
                let png = args
                    .next()
                    .filter(|p| !p.is_empty())
                    .with_context(|| "--screenshot needs the PNG file to write")?;
                opts.screenshot = Some(PathBuf::from(png));
            }
            s if s.starts_with("--screenshot=") => {
                let png = &s["--screenshot=".len()..];
                if png.is_empty() {
                    bail!("--screenshot needs the PNG file to write");
                }
                opts.screenshot = Some(PathBuf::from(png));
            }
            other => bail!("unknown option for `demo`: `{other}`"),
        }
    }
    Ok(opts)
}

/// The tracer's command line for the demo: C stacks (the report's sites and flame charts
/// need them, as in the README's picture) and the HTML report at the end.
fn trace_command(tracer: &Path, out_dir: &Path, workload: &Path) -> Command {
    let mut trace = Command::new(tracer);
    trace
        .arg(format!("--output-path={}", out_dir.display()))
        .arg("--call-stack=c")
        // The HTML report of the run, in the process directory (open it in a browser).
        .arg("--report")
        .arg("--")
        .arg(workload);
    trace
}

pub fn run(repo: &Path, opts: &Options) -> Result<u8> {
    if crate::effective_uid() != Some(0) {
        eprintln!(
            "{TAG} the tracer attaches eBPF uprobes to the traced process, which needs root \
             (CAP_BPF + CAP_PERFMON at least); you are not root.\n\
             {TAG} run it as root, e.g.: sudo -E env \"PATH=$PATH\" cargo xtask demo"
        );
        return Ok(1);
    }
    // Resolved before setup, against the directory the command was given in.
    let screenshot = match &opts.screenshot {
        Some(p) => Some(std::env::current_dir()?.join(p)),
        None => None,
    };
    let purpose = setup::Purpose::Demo {
        screenshot: screenshot.is_some(),
    };
    let ready = setup::run(
        repo,
        &setup::Options {
            purpose,
            ..Default::default()
        },
    )?;

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

    let mut trace = trace_command(&tracer, &out_dir, &workload);
    trace.current_dir(repo);
    println!("{TAG} + {}", cmd::describe(&trace));
    let status = cmd::interactive(&mut trace)?;
    if !status.success() {
        cmd::report_failure("demo", &trace, status);
    }

    let written = report_results(repo, &out_dir, &before);
    if let (Some(png), true) = (screenshot, status.success()) {
        let page = written
            .run_dir
            .as_ref()
            .map(|d| out_dir.join(d).join("report.html"))
            .filter(|p| p.is_file())
            .context("the demo run wrote no report.html to take a screenshot of")?;
        take_screenshot(&page, &png)?;
    }
    Ok(cmd::exit_code(status))
}

/// The size of the README's picture.
const SCREENSHOT_SIZE: &str = "1100,1000";

/// Renders `page` with headless Chromium into `png` (the README's size), with a fresh profile
/// that is removed afterwards, and nothing fetched or updated in the background.
fn take_screenshot(page: &Path, png: &Path) -> Result<()> {
    let chromium = ["chromium", "chromium-browser"]
        .into_iter()
        .find(|c| cmd::probe(Command::new(c).arg("--version")).is_some())
        .context("no chromium on PATH (Debian package chromium; setup installs it as root)")?;
    let profile = std::env::temp_dir().join(format!("xtask-demo-chromium-{}", std::process::id()));
    let _ = fs::remove_dir_all(&profile);
    if let Some(dir) = png.parent() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // A stale picture must not pass for a new one.
    let _ = fs::remove_file(png);
    let mut shot = Command::new(chromium);
    shot.args(screenshot_args(page, png, &profile));
    println!("{TAG} + {}", cmd::describe(&shot));
    let out = shot.output();
    let _ = fs::remove_dir_all(&profile);
    let out = out.context("cannot run chromium")?;
    let header = fs::read(png)
        .ok()
        .filter(|b| b.starts_with(b"\x89PNG\r\n\x1a\n"));
    match header {
        Some(bytes) if out.status.success() => {
            println!(
                "{TAG} screenshot of {}: {} ({})",
                page.display(),
                png.display(),
                human_size(bytes.len() as u64)
            );
            Ok(())
        }
        _ => bail!(
            "chromium did not write the screenshot {} ({}): {}",
            png.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    }
}

fn screenshot_args(page: &Path, png: &Path, profile: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        // The page draws its charts after load; give it (virtual) time to finish.
        "--virtual-time-budget=10000",
    ]
    .map(str::to_owned)
    .into();
    args.push(format!("--window-size={SCREENSHOT_SIZE}"));
    args.push(format!("--user-data-dir={}", profile.display()));
    args.push(format!("--screenshot={}", png.display()));
    args.push(format!("file://{}", page.display()));
    args
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

fn report_results(
    repo: &Path,
    out_dir: &Path,
    before: &HashMap<PathBuf, Option<SystemTime>>,
) -> Written {
    let shown = |p: &Path| -> String { p.strip_prefix(repo).unwrap_or(p).display().to_string() };
    let written = written_since(out_dir, before);
    if written.inside.is_empty() && written.outside.is_empty() {
        println!("{TAG} this run wrote no files under {}", shown(out_dir));
        return written;
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
    written
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

    #[test]
    fn the_demo_traces_with_stacks_and_the_report() {
        let c = trace_command(
            Path::new("/t/memscope-bpf"),
            Path::new("/r/target/demo"),
            Path::new("/r/demo_train"),
        );
        let args: Vec<String> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            [
                "--output-path=/r/target/demo",
                "--call-stack=c",
                "--report",
                "--",
                "/r/demo_train"
            ]
        );
    }

    #[test]
    fn screenshot_option_and_chromium_flags() {
        let s = |a: &[&str]| parse(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(s(&[]).unwrap(), Options::default());
        for given in [
            &["--screenshot", "docs/img/report.png"][..],
            &["--screenshot=docs/img/report.png"],
        ] {
            assert_eq!(
                s(given).unwrap().screenshot.as_deref(),
                Some(Path::new("docs/img/report.png"))
            );
        }
        assert!(s(&["--screenshot"]).is_err());
        assert!(s(&["--screenshot="]).is_err());
        assert!(s(&["--bogus"]).unwrap_err().to_string().contains("--bogus"));
        let args = screenshot_args(
            Path::new("/p/report.html"),
            Path::new("/o/x.png"),
            Path::new("/tmp/prof"),
        );
        for flag in [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1100,1000",
            "--user-data-dir=/tmp/prof",
            "--screenshot=/o/x.png",
        ] {
            assert!(args.iter().any(|a| a == flag), "{flag} missing: {args:?}");
        }
        assert_eq!(args.last().unwrap(), "file:///p/report.html");
    }
}
