//! Where the memory is: allocation sites and stacks of live blocks (`analyze --by-site`,
//! `--by-stack`), folded stacks for `flamegraph.pl` and speedscope's JSON.
//!
//! The site of a block is the `file:line` of the innermost frame of its C stack that is not
//! in a vendor or framework library: the driver and runtime entry points (`hal*`, `acl*`,
//! `rt*`, `mstx*`, `drv*`), frames in the same source file as such an entry point (their static
//! helpers), and frames from the CANN, torch, torch_npu and ATB trees or the C/C++ runtime.
//! A block without a stack is counted under `[no call stack: trace with --call-stack=c]`.

use std::collections::HashMap;

use super::escape;
use super::model::{LiveBlock, Model};

pub const NO_STACK: &str = "[no call stack: trace with --call-stack=c]";
pub const NO_SITE: &str = "[only vendor frames]";

/// One parsed frame line of a `Call Stack(C)` (docs/call-stacks.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    pub function: &'a str,
    /// `file:line`, when the frame was symbolized with a line.
    pub location: Option<&'a str>,
    pub file: Option<&'a str>,
}

pub fn parse_frame(line: &str) -> Option<Frame<'_>> {
    let line = line.trim();
    if line.is_empty() || line == "[truncated]" {
        return None;
    }
    // "0x<16 hex> rest"
    let rest = match line.split_once(' ') {
        Some((a, r)) if a.starts_with("0x") => r,
        _ => line,
    };
    let rest = rest.strip_prefix("[inlined] ").unwrap_or(rest);
    match rest.rsplit_once(" at ") {
        Some((f, loc)) => {
            let file = loc.rsplit_once(':').map(|(f, _)| f);
            Some(Frame {
                function: f,
                location: Some(loc),
                file,
            })
        }
        None => Some(Frame {
            function: rest,
            location: None,
            file: None,
        }),
    }
}

const VENDOR_PREFIXES: [&str; 6] = ["hal", "acl", "rt", "mstx", "drv", "Mki::"];
const VENDOR_PATHS: [&str; 10] = [
    "/Ascend/",
    "/ascend-toolkit/",
    "/site-packages/torch/",
    "/site-packages/torch_npu/",
    "torch_npu/csrc/",
    "c10/",
    "/atb/",
    "/include/c++/",
    "glibc",
    "/libc",
];
const VENDOR_MODULES: [&str; 9] = [
    "libascend",
    "libacl",
    "libruntime",
    "libms_tools_ext",
    "libtorch",
    "libc10",
    "libatb",
    "libc.so",
    "libstdc++",
];

fn vendor_function(f: &str) -> bool {
    let name = f.split(['(', ' ', '<']).next().unwrap_or(f);
    VENDOR_PREFIXES.iter().any(|p| {
        name.starts_with(p)
            && name[p.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_uppercase() || c == '_' || p.ends_with("::"))
    }) || name.starts_with("at::")
        || name.starts_with("c10::")
        || name.starts_with("atb::")
        || name.starts_with("std::")
        || name.starts_with("__")
}

/// The site of a stack: the `file:line` (or the function, when no line is known) of the
/// innermost frame outside vendor and framework code.
pub fn site_of(stack: &str) -> String {
    if stack.trim().is_empty() {
        return NO_STACK.to_owned();
    }
    let frames: Vec<Frame> = stack.lines().filter_map(parse_frame).collect();
    let vendor_files: Vec<&str> = frames
        .iter()
        .filter(|f| vendor_function(f.function))
        .filter_map(|f| f.file)
        .collect();
    let is_vendor = |f: &Frame| {
        vendor_function(f.function)
            || f.file.is_some_and(|file| {
                vendor_files.contains(&file) || VENDOR_PATHS.iter().any(|p| file.contains(p))
            })
            || (f.location.is_none() && VENDOR_MODULES.iter().any(|m| f.function.starts_with(m)))
    };
    for f in &frames {
        if is_vendor(f) {
            continue;
        }
        return match f.location {
            Some(loc) => loc.to_owned(),
            None => f.function.to_owned(),
        };
    }
    NO_SITE.to_owned()
}

/// The frames of a stack, outermost first, without the vendor frames below the site and
/// without addresses: `main;outer;middle (stack_workload.c:70)`.
pub fn folded_frames(stack: &str) -> Vec<String> {
    if stack.trim().is_empty() {
        return vec![NO_STACK.to_owned()];
    }
    let mut v: Vec<String> = stack
        .lines()
        .filter_map(parse_frame)
        .map(|f| match f.location {
            Some(loc) => format!("{} ({})", f.function, short_location(loc)),
            None => f.function.to_owned(),
        })
        .map(|s| escape::frame(&s))
        .collect();
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
                        s.to_owned()
                    }
                } else {
                    site_of(s)
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
            let mut stack = vec![escape::frame(model.name(b.owner))];
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

    const STACK: &str = "0x00007f0000001000 halMemAlloc at /src/tests/fixtures/src/hal.c:210\n\
        0x00007f0000001100 hal_pick at /src/tests/fixtures/src/hal.c:90\n\
        0x000055d0c0a01358 [inlined] leaf at /src/stack_workload.c:65\n\
        0x000055d0c0a01358 middle at /src/stack_workload.c:72\n\
        0x000055d0c0a0137d main at /src/stack_workload.c:99\n\
        0x00007f1e2c827249 __libc_start_call_main";

    #[test]
    fn site_is_the_innermost_frame_outside_vendor_code() {
        // hal_pick is in hal.c, where halMemAlloc lives: a vendor helper, skipped.
        assert_eq!(site_of(STACK), "/src/stack_workload.c:65");
        assert_eq!(site_of(""), NO_STACK);
        assert_eq!(
            site_of("0x0000000000001000 halMemAlloc at /x/hal.c:3"),
            NO_SITE
        );
        assert_eq!(
            site_of("0x0000000000001000 libascend_hal.so+0x1f0\n0x0000000000002000 app_fn"),
            "app_fn"
        );
        // `rtos_init` is not a runtime entry point (`rt` + lower case).
        assert_eq!(
            site_of("0x0000000000001000 rtos_init at /app/r.c:4"),
            "/app/r.c:4"
        );
    }

    #[test]
    fn folded_frames_are_outermost_first() {
        assert_eq!(
            folded_frames(STACK),
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
}
