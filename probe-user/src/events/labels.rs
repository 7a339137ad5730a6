//! Owner labels for `--analysis=decompose` (spec §2.7). A block's owner is its framework
//! (`PTA`, `ATB`, ...) followed by the non-empty label levels, joined with `@`:
//! COMPONENT (1), PROCESS (2), DETAIL_1 (3), DETAIL_2 (4) and USER_DEFINED_1..3 (5..7).
//!
//! msMemScope takes labels through its in-process Python API. memscope-bpf never runs code in
//! the target, so a program sends them as mstx marks (`mstxMarkA`, any mstx build), in the
//! style of msMemScope's ATen protocol:
//!
//! * `memscope-label-push: level=<1..7>;label=<text>` labels what this thread allocates next;
//! * `memscope-label-pop: level=<1..7>;label=<text>` ends it;
//! * `memscope-label-addr: ptr=<address>;level=<1..7>;label=<text>` relabels the live PTA
//!   block that contains the address (msMemScope's `describe_addr`).
//!
//! Levels 1-4 are per-thread stacks: the newest label of a level wins, the same label pushed
//! again is counted (and needs as many pops), at most 3 labels per level (more are refused
//! with a message). Levels 5-7 are one user stack: its labels fill levels 5, 6, 7 in push
//! order; a 4th is dropped silently. Labels are at most 128 bytes and cannot start with `@`.
//! An ATen access tags its block `ops` at DETAIL_2 when that level is empty (a weak tag).

use std::sync::Arc;

/// Levels 1..=7; index 0 is level 1.
pub type Labels = [Option<Arc<str>>; 7];

pub const DETAIL_2: usize = 4;
const MAX_PER_LEVEL: usize = 3;
const MAX_LABEL: usize = 128;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelMark {
    Push {
        level: usize,
        label: String,
    },
    Pop {
        level: usize,
        label: String,
    },
    Addr {
        ptr: u64,
        level: usize,
        label: String,
    },
}

fn field<'a>(body: &'a str, key: &str) -> Option<&'a str> {
    body.split(';').find_map(|kv| {
        kv.trim()
            .strip_prefix(key)
            .and_then(|v| v.strip_prefix('='))
            .map(str::trim)
    })
}

/// Parses a `memscope-label-*` mark; `Err` says what is wrong with it.
pub fn parse_mark(text: &str) -> Result<LabelMark, String> {
    let rest = text
        .strip_prefix("memscope-label-")
        .ok_or("not a label mark")?;
    let (verb, body) = rest.split_once(':').ok_or("no ':' after the verb")?;
    let level: usize = field(body, "level")
        .and_then(|l| l.parse().ok())
        .filter(|l| (1..=7).contains(l))
        .ok_or("level must be 1..7")?;
    let label = field(body, "label").ok_or("no label")?;
    if label.is_empty() || label.len() > MAX_LABEL || label.starts_with('@') {
        return Err(format!(
            "label {label:?}: 1 to {MAX_LABEL} bytes, not starting with '@'"
        ));
    }
    let label = label.to_string();
    match verb {
        "push" => Ok(LabelMark::Push { level, label }),
        "pop" => Ok(LabelMark::Pop { level, label }),
        "addr" => {
            let ptr = field(body, "ptr")
                .and_then(|p| match p.strip_prefix("0x") {
                    Some(h) => u64::from_str_radix(h, 16).ok(),
                    None => p.parse().ok(),
                })
                .ok_or("addr needs ptr=<address>")?;
            Ok(LabelMark::Addr { ptr, level, label })
        }
        v => Err(format!("unknown verb {v:?}")),
    }
}

/// The labels one thread has pushed.
#[derive(Clone, Debug, Default)]
pub struct ThreadLabels {
    /// Levels 1-4: (label, times pushed), newest last.
    fixed: [Vec<(Arc<str>, u32)>; 4],
    /// Levels 5-7, in push order.
    user: Vec<Arc<str>>,
}

impl ThreadLabels {
    pub fn push(&mut self, level: usize, label: &str) -> Result<(), String> {
        if level >= 5 {
            if self.user.len() < MAX_PER_LEVEL {
                self.user.push(label.into());
            }
            return Ok(());
        }
        let stack = &mut self.fixed[level - 1];
        if let Some(e) = stack.iter_mut().find(|(l, _)| &**l == label) {
            e.1 += 1;
            return Ok(());
        }
        if stack.len() >= MAX_PER_LEVEL {
            return Err(format!(
                "level {level} already holds {MAX_PER_LEVEL} labels: {label:?} ignored"
            ));
        }
        stack.push((label.into(), 1));
        Ok(())
    }

    pub fn pop(&mut self, level: usize, label: &str) {
        if level >= 5 {
            if let Some(i) = self.user.iter().rposition(|l| &**l == label) {
                self.user.remove(i);
            }
            return;
        }
        let stack = &mut self.fixed[level - 1];
        if let Some(i) = stack.iter().position(|(l, _)| &**l == label) {
            stack[i].1 -= 1;
            if stack[i].1 == 0 {
                stack.remove(i);
            }
        }
    }

    /// The labels a block allocated now gets; `None` when there are none.
    pub fn snapshot(&self) -> Option<Box<Labels>> {
        let mut out: Labels = Default::default();
        for (i, stack) in self.fixed.iter().enumerate() {
            out[i] = stack.last().map(|(l, _)| l.clone());
        }
        for (i, l) in self.user.iter().enumerate() {
            out[4 + i] = Some(l.clone());
        }
        out.iter().any(Option::is_some).then(|| Box::new(out))
    }
}

/// `framework@l1@l2...` over the non-empty levels.
pub fn compose(framework: &str, labels: Option<&Labels>) -> String {
    let mut s = framework.to_string();
    for l in labels.into_iter().flatten().flatten() {
        s.push('@');
        s.push_str(l);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_parse_and_bad_ones_say_why() {
        assert_eq!(
            parse_mark("memscope-label-push: level=1;label=vllm"),
            Ok(LabelMark::Push {
                level: 1,
                label: "vllm".into()
            })
        );
        assert_eq!(
            parse_mark("memscope-label-addr: ptr=0x10;level=3;label=weights"),
            Ok(LabelMark::Addr {
                ptr: 16,
                level: 3,
                label: "weights".into()
            })
        );
        assert!(parse_mark("memscope-label-push: level=0;label=x").is_err());
        assert!(parse_mark("memscope-label-push: level=8;label=x").is_err());
        assert!(parse_mark("memscope-label-push: level=2;label=@x").is_err());
        assert!(
            parse_mark(&format!(
                "memscope-label-push: level=2;label={}",
                "x".repeat(129)
            ))
            .is_err()
        );
        assert!(parse_mark("memscope-label-drop: level=2;label=x").is_err());
        assert!(parse_mark("memscope-label-addr: level=2;label=x").is_err());
    }

    #[test]
    fn stacks_newest_wins_refcounts_limits_and_user_levels() {
        let mut t = ThreadLabels::default();
        assert!(t.snapshot().is_none());
        t.push(1, "vllm").unwrap();
        t.push(2, "serve").unwrap();
        t.push(2, "warmup").unwrap();
        t.push(5, "mine").unwrap();
        assert_eq!(
            compose("PTA", t.snapshot().as_deref()),
            "PTA@vllm@warmup@mine"
        );
        // The same label again is counted: one pop leaves it.
        t.push(1, "vllm").unwrap();
        t.pop(1, "vllm");
        t.pop(2, "warmup");
        assert_eq!(
            compose("PTA", t.snapshot().as_deref()),
            "PTA@vllm@serve@mine"
        );
        t.push(2, "a").unwrap();
        t.push(2, "b").unwrap();
        assert!(t.push(2, "c").is_err());
        for l in ["u2", "u3", "u4"] {
            t.push(6, l).unwrap();
        }
        assert_eq!(
            compose("PTA", t.snapshot().as_deref()),
            "PTA@vllm@b@mine@u2@u3"
        );
        t.pop(1, "vllm");
        t.pop(5, "mine");
        assert_eq!(compose("ATB", t.snapshot().as_deref()), "ATB@b@u2@u3");
    }
}
