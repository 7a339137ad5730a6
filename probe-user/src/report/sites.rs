//! Where the memory is: allocation sites and stacks of live blocks (`analyze --by-site`,
//! `--by-stack`), folded stacks for `flamegraph.pl` and speedscope's JSON.
//!
//! The site of a block is its user's site (`analysis::sites`): the Python line of the
//! program's own code when the row has a Python stack, else the innermost C frame outside
//! vendor and framework code and allocator wrappers. A block without a stack is counted under
//! `[no call stack: trace with --call-stack=c]`.

use std::collections::HashMap;

use super::escape;
use super::model::{LiveBlock, Model, Stacks};
use crate::analysis::sites::{parse_frame, parse_py_frame};

pub use crate::analysis::sites::{NO_SITE, NO_STACK};

/// The frames of a block's stacks, outermost first, without addresses:
/// `main;outer;middle (stack_workload.c:70)`. The Python frames (`step (train.py:42)`) when
/// there are any and the C column does not hold them already (`mixed`), else the C frames.
pub fn folded_frames(stacks: &Stacks) -> Vec<String> {
    let mixed = stacks.c.contains("[python] ");
    let py: Vec<String> = if mixed {
        Vec::new()
    } else {
        stacks
            .python
            .lines()
            .filter_map(parse_py_frame)
            .map(|f| format!("{} ({}:{})", f.function, short_location(f.file), f.line))
            .collect()
    };
    let mut v: Vec<String> = if !py.is_empty() {
        py
    } else if stacks.c.trim().is_empty() {
        return vec![NO_STACK.to_owned()];
    } else {
        stacks
            .c
            .lines()
            .filter_map(parse_frame)
            .map(|f| match f.location {
                Some(loc) => format!("{} ({})", f.function, short_location(loc)),
                None => f.function.to_owned(),
            })
            .collect()
    };
    for f in &mut v {
        *f = escape::frame(f);
    }
    v.reverse();
    v
}

fn short_location(loc: &str) -> &str {
    loc.rsplit('/').next().unwrap_or(loc)
}

/// Bytes and blocks per key, largest first (ties by key).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SiteRow {
    pub key: String,
    pub bytes: u64,
    pub blocks: u64,
}

/// Live bytes per site (or per whole stack with `by_stack`), largest first.
pub fn by_site(model: &Model, blocks: &[LiveBlock], by_stack: bool) -> Vec<SiteRow> {
    let mut site_cache: HashMap<u32, String> = HashMap::new();
    let mut acc: HashMap<String, (u64, u64)> = HashMap::new();
    for b in blocks {
        let key = site_cache
            .entry(b.stack)
            .or_insert_with(|| {
                let s = model.stack(b.stack);
                if by_stack {
                    if s.is_empty() {
                        NO_STACK.to_owned()
                    } else {
                        s.text()
                    }
                } else {
                    s.site()
                }
            })
            .clone();
        let e = acc.entry(key).or_default();
        e.0 += b.size;
        e.1 += 1;
    }
    let mut rows: Vec<SiteRow> = acc
        .into_iter()
        .map(|(key, (bytes, blocks))| SiteRow { key, bytes, blocks })
        .collect();
    rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.key.cmp(&b.key)));
    rows
}

/// `flamegraph.pl` input: `owner;outermost;...;innermost bytes`, one line per distinct stack.
pub fn folded(model: &Model, blocks: &[LiveBlock]) -> String {
    let mut acc: HashMap<String, u64> = HashMap::new();
    for b in blocks {
        let mut frames = vec![escape::frame(model.name(b.owner))];
        frames.extend(folded_frames(model.stack(b.stack)));
        *acc.entry(frames.join(";")).or_default() += b.size;
    }
    let mut lines: Vec<(String, u64)> = acc.into_iter().collect();
    lines.sort();
    let mut s = String::new();
    for (k, v) in lines {
        s.push_str(&format!("{k} {v}\n"));
    }
    s
}

/// speedscope's file format (https://www.speedscope.app/file-format-schema.json): one sampled
/// profile per snapshot, each sample a stack weighted by its bytes.
pub fn speedscope(model: &Model, profiles: &[(String, Vec<LiveBlock>)]) -> serde_json::Value {
    let mut frames: Vec<String> = Vec::new();
    let mut frame_ids: HashMap<String, usize> = HashMap::new();
    let mut out_profiles = Vec::new();
    for (name, blocks) in profiles {
        let mut samples = Vec::new();
        let mut weights = Vec::new();
        let mut total = 0u64;
        for b in blocks {
            let mut stack = vec![model.name(b.owner).to_owned()];
            stack.extend(folded_frames(model.stack(b.stack)));
            let ids: Vec<usize> = stack
                .into_iter()
                .map(|f| {
                    *frame_ids.entry(f.clone()).or_insert_with(|| {
                        frames.push(f);
                        frames.len() - 1
                    })
                })
                .collect();
            samples.push(ids);
            weights.push(b.size);
            total += b.size;
        }
        out_profiles.push(serde_json::json!({
            "type": "sampled",
            "name": name,
            "unit": "bytes",
            "startValue": 0,
            "endValue": total,
            "samples": samples,
            "weights": weights,
        }));
    }
    serde_json::json!({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": { "frames": frames.iter().map(|f| serde_json::json!({"name": f})).collect::<Vec<_>>() },
        "profiles": out_profiles,
        "name": "memscope-bpf live bytes",
        "exporter": concat!("memscope-bpf ", env!("CARGO_PKG_VERSION")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::analysis::sites::tests::STACK;

    fn c_only(c: &str) -> Stacks {
        Stacks {
            c: c.to_owned(),
            python: String::new(),
        }
    }

    #[test]
    fn folded_frames_are_outermost_first() {
        assert_eq!(
            folded_frames(&c_only(STACK)),
            [
                "__libc_start_call_main",
                "main (stack_workload.c:99)",
                "middle (stack_workload.c:72)",
                "leaf (stack_workload.c:65)",
                "hal_pick (hal.c:90)",
                "halMemAlloc (hal.c:210)",
            ]
        );
    }

    #[test]
    fn folded_frames_of_a_python_process_are_its_python_frames() {
        let s = Stacks {
            c: STACK.to_owned(),
            python: "/v/site-packages/torch/nn/functional.py(9): linear\n\
                     /home/u/train.py(42): step\n\
                     /home/u/train.py(90): <module>\n"
                .to_owned(),
        };
        assert_eq!(
            folded_frames(&s),
            [
                "<module> (train.py:90)",
                "step (train.py:42)",
                "linear (functional.py:9)"
            ]
        );
    }
}
