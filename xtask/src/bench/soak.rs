//! The `agent-soak` section: thousands of short traced jobs through one node agent
//! (`probe-user/tests/agent_soak.rs` at full size, `MEMSCOPE_SOAK_JOBS`): the agent's
//! descriptors, threads and resident memory before and after, which must come back to where
//! they were. `cargo xtask test` runs the same test with 300 jobs. Written to
//! docs/benchmarks-agent-soak.md.

use std::fmt::Write as _;

use anyhow::{Context, Result, bail};

use super::{Bench, TAG, tagged_field};

impl Bench {
    pub(super) fn agent_soak(&mut self) -> Result<()> {
        let jobs: u64 = if self.opts.quick { 1000 } else { 5000 };
        println!("{TAG} agent-soak: {jobs} short jobs through one agent");
        let mut test = crate::cargo(&self.repo, &self.ready);
        test.args([
            "test",
            "--release",
            "-p",
            "memscope-bpf",
            "--test",
            "agent_soak",
            "--",
            "--nocapture",
        ])
        .env("MEMSCOPE_SOAK_JOBS", jobs.to_string())
        .env("TMPDIR", &self.scratch);
        let out = test.output().context("run the soak test")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "the soak test failed:\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let line = stdout
            .lines()
            .find(|l| l.starts_with("SOAK "))
            .context("no SOAK line from the soak test")?;
        let field = |k: &str| tagged_field(line, "SOAK ", k).unwrap_or(f64::NAN);
        // `fds=A->B`: the parts around the arrow.
        let pair = |k: &str| -> (String, String) {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                .and_then(|v| v.split_once("->"))
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .unwrap_or_default()
        };
        let secs = field("secs");
        let (fds, threads, rss) = (pair("fds"), pair("threads"), pair("rss_kib"));
        let held = field("job_fds_held");
        println!("{TAG}   {line}");
        for (metric, (a, b)) in [("fds", &fds), ("threads", &threads), ("rss_kib", &rss)] {
            for (config, v) in [("before", a), ("after", b)] {
                let v: f64 = v.parse().unwrap_or(f64::NAN);
                self.sample("agent-soak", metric, config, 0, "value", v);
            }
        }
        self.sample("agent-soak", "jobs", "all", 0, "seconds", secs);
        self.sample("agent-soak", "jobs", "all", 0, "job_fds_held", held);
        let mut md = String::new();
        writeln!(
            md,
            "## Node agent soak\n\n`memscope-bpf agent` (stacks on, `--max-exited 16`) while \
             {jobs} short traced jobs run one after another (`workload --loop-ms 20`: HAL \
             allocations and frees for 20 ms; {:.0} s in all), measured after 20 warm-up jobs \
             and again once the last job's exit is in /metrics \
             (`probe-user/tests/agent_soak.rs`, which asserts the bounds: at most 2 open \
             on the jobs' executable, 16 more copies of any file, 8 more threads, 1 GiB more \
             resident memory). The agent traces \
             every process of the machine: on a shared one, others' jobs (their libraries \
             parsed for their stacks, their own probe links) count in the totals; the \
             descriptors still open on the jobs' own executable are theirs alone (one: the \
             symbolizer's parsed copy; before the fix, one per job).\n\n\
             | | before | after |\n|---|---|---|\n\
             | open descriptors | {} | {} |\n\
             | of them on the jobs' executable | - | {held:.0} |\n\
             | threads | {} | {} |\n\
             | resident memory (KiB) | {} | {} |\n",
            secs, fds.0, fds.1, threads.0, threads.1, rss.0, rss.1
        )?;
        self.md.push_str(&md);
        let path = self.repo.join("docs/benchmarks-agent-soak.md");
        let mut doc = String::from(
            "# Benchmarks: the node agent under thousands of short jobs\n\nWritten by \
             `cargo xtask bench --only agent-soak",
        );
        if self.opts.quick {
            doc.push_str(" --quick");
        }
        writeln!(
            doc,
            "` on {} (kernel {}).\n",
            super::harm::chrono_like_now(),
            super::harm::kernel_release()
        )?;
        doc.push_str(&md);
        std::fs::write(&path, doc)?;
        println!("{TAG} wrote {}", path.display());
        Ok(())
    }
}
