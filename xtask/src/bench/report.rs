//! `report`: the HTML report of a large dump written by the replay example: build time, size
//! and first paint in headless Chromium.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::Result;

use super::{Bench, TAG, median};

impl Bench {
    /// `report`: a 10 M-event dump drawn as HTML; build time, size, first paint.
    pub(super) fn report(&mut self, target: &Path) -> Result<()> {
        let events = self.opts.events;
        println!("{TAG} HTML report of a {events}-event dump");
        let dump_dir = self.scratch.join("report-dump");
        let _ = fs::remove_dir_all(&dump_dir);
        let mut c = Command::new(target.join("release/examples/replay"));
        c.args(["--events", &events.to_string(), "--writer", "csv", "--out"])
            .arg(&dump_dir);
        self.exec(c)?;
        let dump_bytes: u64 = walk_files(&dump_dir)
            .iter()
            .filter_map(|p| fs::metadata(p).ok())
            .map(|m| m.len())
            .sum();
        // `report -o DIR` writes DIR/memscope_report.html.
        let page_dir = self.scratch.join("report-10m");
        let page = page_dir.join("memscope_report.html");
        let rounds = self.opts.rounds.min(3);
        let chrome = ["chromium", "chromium-browser"].into_iter().find(|c| {
            Command::new("which")
                .arg(c)
                .output()
                .is_ok_and(|o| o.status.success())
        });
        for round in 0..rounds {
            let t = Instant::now();
            let mut c = Command::new(target.join("release/memscope-bpf"));
            c.args(["report", "-q", "-i"])
                .arg(&dump_dir)
                .arg("-o")
                .arg(&page_dir);
            self.exec(c)?;
            let build_s = t.elapsed().as_secs_f64();
            let size = fs::metadata(&page)?.len() as f64;
            self.sample("report", "10m", "html", round, "build_s", build_s);
            self.sample("report", "10m", "html", round, "bytes", size);
            let Some(chrome) = chrome else {
                self.notes
                    .push("report: no chromium on PATH, first paint not measured".into());
                continue;
            };
            let profile = self.scratch.join("report-chrome");
            let t = Instant::now();
            let mut c = Command::new(chrome);
            c.args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--window-size=1400,2600",
                "--dump-dom",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(format!("file://{}", page.display()));
            let out = self.exec(c)?;
            let wall_s = t.elapsed().as_secs_f64();
            // The self-check JSON in the DOM: `"first_paint_ms":1234.5`.
            let metric = |k: &str| {
                out.stdout
                    .split(&format!("\"{k}\":"))
                    .nth(1)
                    .and_then(|r| r.split(['}', ',']).next())
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(f64::NAN)
            };
            let paint_ms = metric("first_paint_ms");
            println!(
                "{TAG}   build {build_s:.2} s, {:.2} MiB, first paint {paint_ms:.0} ms (chromium wall {wall_s:.2} s)",
                size / (1 << 20) as f64
            );
            self.sample("report", "10m", "html", round, "first_paint_ms", paint_ms);
            self.sample("report", "10m", "html", round, "chromium_wall_s", wall_s);
        }
        let _ = fs::remove_dir_all(&dump_dir);
        let m = |k: &str| median(&self.values("report", "10m", "html", k));
        let mut md = String::new();
        writeln!(md, "## HTML report of a {events}-event dump\n")?;
        writeln!(
            md,
            "The replay example's CSV dump ({:.0} MiB, {events} events) drawn by \
             `memscope-bpf report` (release), {rounds} rounds, median. First paint: the page's \
             own measure (`performance.now()`), from navigation start until every chart is drawn \
             (HTML parsed, ECharts evaluated; the self-check the tests read); chromium wall: `chromium --headless --dump-dom` from start to exit.\n",
            dump_bytes as f64 / (1 << 20) as f64
        )?;
        writeln!(
            md,
            "| build s | page MiB | first paint ms | chromium wall s |"
        )?;
        writeln!(md, "|---:|---:|---:|---:|")?;
        writeln!(
            md,
            "| {:.2} | {:.2} | {:.0} | {:.2} |",
            m("build_s"),
            m("bytes") / (1 << 20) as f64,
            m("first_paint_ms"),
            m("chromium_wall_s")
        )?;
        writeln!(md, "\nGoal: under 10 MB, first paint under 3 s.\n")?;
        self.md.push_str(&md);
        Ok(())
    }
}

/// Every regular file under `dir`.
fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(t) if t.is_file() => out.push(p),
                _ => {}
            }
        }
    }
    out
}
