//! `symbols`: warm symbolization and unwinding rates and the cold start on the largest shared
//! object (`symbols/examples/symbolize_bench.rs`).

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Result;

use super::{Bench, TAG, largest_shared_object, median, result_field, spread};
use crate::cmd;

impl Bench {
    pub(super) fn symbols(&mut self, target: &Path) -> Result<()> {
        println!("{TAG} symbolization and unwinding");
        let exe = target.join("release/examples/symbolize_bench");
        let secs = if self.opts.quick { "0.5" } else { "1" };
        let rounds = self.opts.rounds.min(3);
        let mut fixtures: Vec<PathBuf> = Vec::new();
        for (dir, pick) in [
            (self.lib.clone(), ".so"),
            (self.bin.clone(), "stack_workload_"),
        ] {
            let mut v: Vec<PathBuf> = fs::read_dir(&dir)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.is_file()
                        && p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.contains(pick))
                })
                .collect();
            v.sort();
            fixtures.extend(v);
        }
        let mut last: BTreeMap<&str, String> = BTreeMap::new();
        for round in 0..rounds {
            let mut runs: Vec<(&'static str, Vec<String>)> = vec![
                (
                    "self",
                    vec![
                        "symbolize".into(),
                        "--self".into(),
                        "--seconds".into(),
                        secs.into(),
                    ],
                ),
                (
                    "unwind",
                    vec!["unwind".into(), "--seconds".into(), secs.into()],
                ),
            ];
            if !fixtures.is_empty() {
                let mut a: Vec<String> = vec!["symbolize".into(), "--seconds".into(), secs.into()];
                a.extend(fixtures.iter().map(|p| p.display().to_string()));
                runs.insert(1, ("fixtures", a));
            }
            for (w, a) in runs {
                let mut c = Command::new(&exe);
                c.args(&a);
                let out = self.exec(c)?;
                let metrics: &[&'static str] = if w == "unwind" {
                    &[
                        "unwind_stacks_per_s",
                        "unwind_frames_per_s",
                        "resolve_stacks_per_s",
                        "dedup_stacks_per_s",
                    ]
                } else {
                    &["addr_per_s", "frames_per_s", "warmup_ms"]
                };
                for &m in metrics {
                    let v = result_field(&out.stdout, m).unwrap_or(f64::NAN);
                    self.sample("symbols", w, "warm", round, m, v);
                }
                let line = out
                    .stdout
                    .lines()
                    .find(|l| l.starts_with("RESULT "))
                    .unwrap_or("")
                    .to_string();
                println!("{TAG}   round {round} {w}: {line}");
                last.insert(w, line);
            }
        }
        let field = |w: &str, k: &str| {
            last.get(w)
                .and_then(|l| {
                    l.split_whitespace()
                        .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                })
                .unwrap_or("?")
                .to_string()
        };
        let mut md = String::new();
        writeln!(md, "## Symbolization and unwinding (user space)\n")?;
        writeln!(
            md,
            "`symbols/examples/symbolize_bench.rs` (`memscope_symbols` only, one thread, {rounds} \
             rounds of {secs} s, median (min-max)). Warm: after one pass over every address (each \
             object parsed, DWARF loaded), the same addresses again in a fixed shuffled order; \
             a frame is one output line (inlined functions add frames).\n"
        )?;
        writeln!(
            md,
            "| address set | addresses | with a source line | frames/address | first pass ms | warm addresses/s (min-max) | warm frames/s |"
        )?;
        writeln!(md, "|---|---:|---:|---:|---:|---:|---:|")?;
        for (w, desc) in [
            (
                "self",
                "every function of the bench process (Rust binary without DWARF, libc with its separate debug file, ld.so, libgcc_s), real maps",
            ),
            (
                "fixtures",
                "every function of the fixture libraries and stack workloads (C/C++, `-O2 -g`), mapped in a synthetic view",
            ),
        ] {
            let v = self.values("symbols", w, "warm", "addr_per_s");
            if v.is_empty() {
                continue;
            }
            let (lo, hi) = spread(&v);
            writeln!(
                md,
                "| {desc} | {} | {} | {} | {:.1} | {:.2} M ({:.2}-{:.2}) | {:.2} M |",
                field(w, "addresses"),
                field(w, "with_line"),
                field(w, "frames_per_address"),
                median(&self.values("symbols", w, "warm", "warmup_ms")),
                median(&v) / 1e6,
                lo / 1e6,
                hi / 1e6,
                median(&self.values("symbols", w, "warm", "frames_per_s")) / 1e6,
            )?;
        }
        let u = self.values("symbols", "unwind", "warm", "unwind_stacks_per_s");
        let r = self.values("symbols", "unwind", "warm", "resolve_stacks_per_s");
        let ((ulo, uhi), (rlo, rhi)) = (spread(&u), spread(&r));
        writeln!(
            md,
            "\nUnwinding (CFI, `memscope_symbols::unwind`) of one captured stack of the bench \
             process ({} frames, {} bytes of stack copied like BPF's copy, stop: {}, outermost \
             `{}`): {:.0} stacks/s ({:.0}-{:.0}), {:.2} M frames/s; unwind + symbolize every \
             frame (what the tracer's worker does per stack, minus formatting): {:.0} stacks/s \
             ({:.0}-{:.0}).\n",
            field("unwind", "depth"),
            field("unwind", "stack_bytes"),
            field("unwind", "stop"),
            field("unwind", "outermost"),
            median(&u),
            ulo,
            uhi,
            median(&self.values("symbols", "unwind", "warm", "unwind_frames_per_s")) / 1e6,
            median(&r),
            rlo,
            rhi,
        )?;
        let d = self.values("symbols", "unwind", "warm", "dedup_stacks_per_s");
        if d.iter().any(|v| v.is_finite()) {
            let (dlo, dhi) = spread(&d);
            writeln!(
                md,
                "What the tracer's stack worker does per stack (unwind with the unwind rules of \
                 each code address computed once per process, then the text of a stack already \
                 seen taken from a table; a new stack is symbolized once per address and \
                 formatted once): {:.0} stacks/s ({:.0}-{:.0}). Target (issue 14): 300k stacks/s \
                 on one core; this machine is shared, so rates here are wall-clock rates of a \
                 thread that may not have had its core to itself.\n",
                median(&d),
                dlo,
                dhi,
            )?;
        }
        // Cold start on the largest shared object.
        match largest_shared_object() {
            None => self
                .notes
                .push("cold start skipped: no shared object found".into()),
            Some((path, size)) => {
                println!("{TAG}   cold start: {} ({size} bytes)", path.display());
                let mut last = String::new();
                for round in 0..rounds {
                    for cache in ["dropped", "cached"] {
                        if cache == "dropped" {
                            // posix_fadvise(DONTNEED) on this file only; pages mapped by
                            // running processes stay resident.
                            let _ = cmd::probe(Command::new("dd").args([
                                &format!("if={}", path.display()),
                                "iflag=nocache",
                                "count=0",
                                "status=none",
                            ]));
                        }
                        let resident = cmd::probe(
                            Command::new("fincore")
                                .args(["--bytes", "--noheadings", "--output", "RES"])
                                .arg(&path),
                        )
                        .and_then(|s| s.trim().parse::<f64>().ok())
                        .unwrap_or(f64::NAN);
                        let mut c = Command::new(&exe);
                        c.arg("cold").arg(&path);
                        let out = self.exec(c)?;
                        for m in [
                            "total_ms",
                            "parse_ms",
                            "first_symbolize_ms",
                            "cfi_index_ms",
                            "second_symbolize_us",
                            "peak_rss_kib",
                        ] {
                            let v = result_field(&out.stdout, m).unwrap_or(f64::NAN);
                            self.sample("symbols", "cold", cache, round, m, v);
                        }
                        self.sample("symbols", "cold", cache, round, "resident_bytes", resident);
                        last = out
                            .stdout
                            .lines()
                            .find(|l| l.starts_with("RESULT "))
                            .unwrap_or("")
                            .to_string();
                        println!("{TAG}   round {round} cold ({cache} page cache): {last}");
                    }
                }
                let f = |k: &str| {
                    last.split_whitespace()
                        .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                        .unwrap_or("?")
                        .to_string()
                };
                writeln!(
                    md,
                    "Cold start on the largest ELF shared object under /usr/lib, /usr/lib64, \
                     /usr/local/lib and the rustup toolchains: `{}`, {size} bytes ({:.1} MiB), \
                     {} symbols, DWARF: {}, {} FDEs. A fresh `Symbolizer` and a view mapping the \
                     file, then: parse (symbol tables, segments, CFI sections), the first \
                     `symbolize` of an address in the middle of `.text` (loads DWARF when there \
                     is any; resolved to `{}`), and the CFI index (`fde_count`). *dropped*: the \
                     file's page cache evicted first with `dd iflag=nocache` (best effort: pages \
                     mapped by running processes stay; residency before the run shown); \
                     *cached*: run again right after. {rounds} rounds, median (min-max).\n",
                    path.display(),
                    size as f64 / (1 << 20) as f64,
                    f("symbols"),
                    f("has_dwarf"),
                    f("fdes"),
                    f("function").replace('_', " "),
                )?;
                writeln!(
                    md,
                    "| page cache | resident before MiB | total ms (min-max) | parse ms | first symbolize ms | CFI index ms | next address µs | peak RSS KiB |"
                )?;
                writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|")?;
                for cache in ["dropped", "cached"] {
                    let g = |m: &str| median(&self.values("symbols", "cold", cache, m));
                    let (lo, hi) = spread(&self.values("symbols", "cold", cache, "total_ms"));
                    writeln!(
                        md,
                        "| {cache} | {:.1} | {:.0} ({:.0}-{:.0}) | {:.0} | {:.1} | {:.1} | {:.1} | {:.0} |",
                        g("resident_bytes") / (1 << 20) as f64,
                        g("total_ms"),
                        lo,
                        hi,
                        g("parse_ms"),
                        g("first_symbolize_ms"),
                        g("cfi_index_ms"),
                        g("second_symbolize_us"),
                        g("peak_rss_kib"),
                    )?;
                }
                writeln!(md)?;
                self.notes.push(format!(
                    "cold start file: {} ({size} bytes)",
                    path.display()
                ));
            }
        }
        self.md.push_str(&md);
        Ok(())
    }
}
