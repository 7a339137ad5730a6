//! `insn`: uprobe cost by the probed function's first instruction (tracefs uprobe events on
//! `tests/fixtures/bench/uprobe_insns.S`): which instructions the kernel emulates,
//! single-steps or refuses.

use std::{fmt::Write as _, fs, path::Path, process::Command};

use anyhow::{Context, Result};

use super::{Bench, TAG, fmt_ns, median, spread};
use crate::cmd;

impl Bench {
    pub(super) fn insn(&mut self) -> Result<()> {
        println!("{TAG} uprobe cost by first instruction");
        let tracing = Path::new("/sys/kernel/tracing");
        if !tracing.join("uprobe_events").exists() {
            let _ = Command::new("mount")
                .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
                .status();
        }
        let exe = self.bin.join("insn_cost");
        let names = cmd::output(Command::new(&exe).arg("--list"))?;
        let nm = cmd::output(Command::new("nm").arg(&exe))?;
        let iters = if self.opts.quick { "5000" } else { "20000" };
        let rounds = self.opts.rounds.min(3);
        let _ = fs::write(tracing.join("tracing_on"), "0");
        let mut rows = Vec::new();
        for name in names.lines() {
            let Some(addr) = nm
                .lines()
                .find(|l| l.split_whitespace().nth(2) == Some(name))
                .and_then(|l| u64::from_str_radix(l.split_whitespace().next()?, 16).ok())
            else {
                continue;
            };
            // PIE with the text segment mapped at its file offset (checked by the Makefile's
            // plain link): the symbol value is the file offset.
            let event = format!("msbench_{name}");
            let def = format!("p:msbench/{event} {}:{addr:#x}\n", exe.display());
            let run = |probe: bool| -> Result<f64> {
                if probe {
                    fs::OpenOptions::new()
                        .append(true)
                        .open(tracing.join("uprobe_events"))
                        .and_then(|mut f| std::io::Write::write_all(&mut f, def.as_bytes()))
                        .context("defining a tracefs uprobe")?;
                    fs::write(tracing.join(format!("events/msbench/{event}/enable")), "1")?;
                }
                let out = cmd::output(Command::new(&exe).args([name, iters]));
                if probe {
                    let _ = fs::write(tracing.join(format!("events/msbench/{event}/enable")), "0");
                    let _ = fs::OpenOptions::new()
                        .append(true)
                        .open(tracing.join("uprobe_events"))
                        .and_then(|mut f| {
                            std::io::Write::write_all(
                                &mut f,
                                format!("-:msbench/{event}\n").as_bytes(),
                            )
                        });
                }
                Ok(out?.trim().parse()?)
            };
            for round in 0..rounds {
                let base = run(false)?;
                let probed = run(true)?;
                self.sample("insn", name, "untraced", round, "ns_per_call", base);
                self.sample("insn", name, "uprobe", round, "ns_per_call", probed);
                self.sample("insn", name, "uprobe", round, "cost_ns", probed - base);
            }
            rows.push(name.to_string());
        }
        let nop = median(&self.values("insn", "ins_nop", "uprobe", "cost_ns"));
        let mut md = String::new();
        writeln!(
            md,
            "## Uprobe cost by the probed function's first instruction\n"
        )?;
        writeln!(
            md,
            "`tests/fixtures/bench/uprobe_insns.S`: one function per instruction form, called \
             {iters} times in a loop, untraced and with a tracefs uprobe on its first instruction \
             ({rounds} rounds, median). Class: *refused* when the probe never traps (the kernel \
             declined to install it), *emulated* when the cost is under 3x that of `nop` (run \
             in the trap handler), else *single-stepped* (executed out of line, second trap).\n"
        )?;
        writeln!(
            md,
            "| function | first instruction | untraced ns/call | uprobe ns/call | uprobe cost ns (min-max) | class |"
        )?;
        writeln!(md, "|---|---|---:|---:|---:|---|")?;
        for name in &rows {
            let base = median(&self.values("insn", name, "untraced", "ns_per_call"));
            let probed = median(&self.values("insn", name, "uprobe", "ns_per_call"));
            let costs = self.values("insn", name, "uprobe", "cost_ns");
            let cost = median(&costs);
            let (lo, hi) = spread(&costs);
            let class = if cost < 200.0 {
                "refused"
            } else if cost < 3.0 * nop {
                "emulated"
            } else {
                "single-stepped"
            };
            writeln!(
                md,
                "| `{name}` | {} | {} | {} | {} ({}-{}) | {class} |",
                insn_text(name),
                fmt_ns(base),
                fmt_ns(probed),
                fmt_ns(cost),
                fmt_ns(lo),
                fmt_ns(hi)
            )?;
        }
        self.md.push_str(&md);
        self.md.push('\n');
        Ok(())
    }
}

fn insn_text(name: &str) -> &'static str {
    match name {
        "ins_nop" => "`nop` (90)",
        "ins_nop2" => "`xchg %ax,%ax` (66 90)",
        "ins_nop3" => "`nopl (%rax)` (0f 1f 00)",
        "ins_nop4" => "`nopl 0(%rax)` (0f 1f 40 00)",
        "ins_nop5" => "`nopl 0(%rax,%rax,1)` (0f 1f 44 00 00)",
        "ins_endbr64" => "`endbr64`",
        "ins_push_rbp" => "`push %rbp`",
        "ins_push_r12" => "`push %r12` (41 54)",
        "ins_push_imm" => "`push $0`",
        "ins_mov_rsp" => "`mov %rsp,%rax`",
        "ins_test" => "`test %rdi,%rdi`",
        "ins_cmp" => "`cmp $0,%rdi`",
        "ins_xor" => "`xor %eax,%eax`",
        "ins_mov_rr" => "`mov %rdi,%rax`",
        "ins_mov_imm" => "`mov $1,%eax`",
        "ins_mov_load" => "`mov (%rsp),%rax`",
        "ins_mov_store" => "`mov %rdi,-8(%rsp)`",
        "ins_lea" => "`lea 8(%rdi),%rax`",
        "ins_lea_rip" => "`lea x(%rip),%rax`",
        "ins_sub_rsp" => "`sub $8,%rsp`",
        "ins_jcc" => "`je rel8`",
        "ins_jmp" => "`jmp rel8`",
        "ins_call" => "`call rel32`",
        "ins_ret" => "`ret`",
        "ins_lock" => "`lock addl $0,-8(%rsp)`",
        _ => "?",
    }
}
