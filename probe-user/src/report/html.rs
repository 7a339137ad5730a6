//! The HTML report: one file, no network. The page is ECharts (vendored, pinned: see
//! `probe-user/assets/echarts/README.md`), our script and styles, and the run reduced to a JSON
//! document; the script draws it. Everything heavy is reduced here, in Rust: curves to the
//! minimum and maximum of each of [`super::model::COLUMNS`] pixel columns, tables to their
//! largest entries, flame charts to the frames that hold at least 1/2000 of their total.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::Result;
use serde_json::{Value, json};

use super::{
    escape,
    model::{LiveBlock, Model, Moment, Stacks, TrackKey},
    sites::{self, SiteRow},
};
use crate::{
    offline::compare,
    output::{
        DeviceKey,
        leaks::{PoolHeld, TensorLeak},
    },
    settings::Levels,
};

/// ECharts 6.1.0 `dist/echarts.min.js`, as published on npm (checked by a test).
pub const ECHARTS_JS: &str = include_str!("../../assets/echarts/echarts.min.js");
pub const ECHARTS_VERSION: &str = "6.1.0";
const REPORT_JS: &str = include_str!("../../assets/report/report.js");
const REPORT_CSS: &str = include_str!("../../assets/report/report.css");

/// Largest blocks listed as live at the peak, sites per table, leaks listed.
const PEAK_BLOCKS: usize = 50;
const SITES: usize = 30;
const TIMELINE_SITES: usize = 15;
const LEAKS: usize = 1000;

fn secs(model: &Model, ts: u64) -> f64 {
    ((ts.saturating_sub(model.t0)) as f64 / 1e3).round() / 1e6
}

/// A flame tree: `{n: name, v: bytes, c: [children]}`, children largest first.
#[derive(Default)]
struct Node {
    name: String,
    value: u64,
    children: Vec<usize>,
    index: HashMap<String, usize>,
}

fn flame_tree(items: impl IntoIterator<Item = (Vec<String>, u64)>) -> Value {
    let mut nodes = vec![Node {
        name: "all".to_owned(),
        ..Default::default()
    }];
    for (frames, bytes) in items {
        let mut cur = 0;
        nodes[0].value += bytes;
        for f in frames {
            let next = match nodes[cur].index.get(&f) {
                Some(&i) => i,
                None => {
                    let i = nodes.len();
                    nodes.push(Node {
                        name: f.clone(),
                        ..Default::default()
                    });
                    nodes[cur].children.push(i);
                    nodes[cur].index.insert(f, i);
                    i
                }
            };
            nodes[next].value += bytes;
            cur = next;
        }
    }
    let min = nodes[0].value / 2000;
    fn emit(nodes: &[Node], i: usize, min: u64) -> Value {
        let mut kids: Vec<usize> = nodes[i].children.clone();
        kids.sort_by(|a, b| {
            nodes[*b]
                .value
                .cmp(&nodes[*a].value)
                .then_with(|| nodes[*a].name.cmp(&nodes[*b].name))
        });
        let mut c: Vec<Value> = Vec::new();
        let mut small = 0u64;
        for k in kids {
            if nodes[k].value >= min.max(1) {
                c.push(emit(nodes, k, min));
            } else {
                small += nodes[k].value;
            }
        }
        if small > 0 {
            c.push(json!({"n": "[small]", "v": small}));
        }
        if c.is_empty() {
            json!({"n": nodes[i].name, "v": nodes[i].value})
        } else {
            json!({"n": nodes[i].name, "v": nodes[i].value, "c": c})
        }
    }
    emit(&nodes, 0, min)
}

fn stack_frames(model: &Model, owner: u32, stack: u32) -> Vec<String> {
    let mut v = vec![escape::frame(model.name(owner))];
    v.extend(sites::folded_frames(model.stack(stack)));
    v
}

fn block_json(model: &Model, b: &LiveBlock, site_cache: &mut HashMap<u32, String>) -> Value {
    let site = site_cache
        .entry(b.stack)
        .or_insert_with(|| model.stack(b.stack).site())
        .clone();
    json!({"size": b.size, "owner": model.name(b.owner), "addr": format!("{:#018x}", b.addr),
        "alloc_id": b.alloc_id, "t": secs(model, b.ts), "step": b.step, "tid": b.tid,
        "site": site, "stack": model.stack(b.stack).text()})
}

/// A leaked tensor: the program's line first (what the user asks), then the block.
fn tensor_leak_json(model: &Model, t: &TensorLeak) -> Value {
    let b = &t.block;
    let stacks = Stacks::of_block(b);
    let why = t.why("at the end");
    json!({"site": stacks.site(), "stack": stacks.text(), "step": b.step, "size": b.size,
        "pool": b.event_type(), "addr": format!("{:#018x}", b.addr),
        "alloc_id": b.allocation_id, "t": secs(model, b.ts_ns), "tid": b.tid, "why": why})
}

/// What a pool held at the end: its segments are kept on purpose (cached), not leaked.
fn pool_held_json(h: &PoolHeld) -> Value {
    json!({"pool": h.pool_name(), "segments": h.segments, "segment_bytes": h.segment_bytes,
        "live_blocks": h.live_blocks, "live_bytes": h.live_bytes, "cached_bytes": h.cached_bytes(),
        "allocated": h.reported.map(|r| r.allocated), "reserved": h.reported.map(|r| r.reserved)})
}

fn sites_json(rows: &[SiteRow], n: usize) -> Value {
    Value::Array(
        rows.iter()
            .take(n)
            .map(|r| json!({"site": r.key, "bytes": r.bytes, "blocks": r.blocks}))
            .collect(),
    )
}

/// The per-site breakdown at each local maximum of the timeline, per track: one replay that
/// keeps live bytes per site, read at each maximum.
pub fn timeline_sites(model: &Model, by_stack: bool) -> BTreeMap<TrackKey, Vec<Vec<SiteRow>>> {
    use super::model::Kind;
    let mut triggers: Vec<(usize, TrackKey, usize)> = Vec::new();
    for (key, t) in &model.tracks {
        for (n, m) in t.timeline.iter().enumerate() {
            triggers.push((m.event, *key, n));
        }
    }
    triggers.sort();
    let mut out: BTreeMap<TrackKey, Vec<Vec<SiteRow>>> = model
        .tracks
        .iter()
        .map(|(k, t)| (*k, vec![Vec::new(); t.timeline.len()]))
        .collect();
    // Site of each stack, as an index into `site_names`.
    let mut site_of_stack: HashMap<u32, usize> = HashMap::new();
    let mut site_names: Vec<String> = Vec::new();
    let mut site_ids: HashMap<String, usize> = HashMap::new();
    let mut sums: HashMap<TrackKey, HashMap<usize, (u64, u64)>> = HashMap::new();
    // (allocation id, size, site, track) of the live blocks, by process and address.
    type Live = Vec<(u64, u64, usize, TrackKey)>;
    let mut live: HashMap<(u32, u64), Live> = HashMap::new();
    let mut next = 0;
    for (i, e) in model.events.iter().enumerate() {
        if next >= triggers.len() {
            break;
        }
        match e.kind {
            Kind::Malloc => {
                let site = *site_of_stack.entry(e.stack).or_insert_with(|| {
                    let s = model.stack(e.stack);
                    let name = if by_stack {
                        if s.is_empty() {
                            sites::NO_STACK.to_owned()
                        } else {
                            s.text()
                        }
                    } else {
                        s.site()
                    };
                    *site_ids.entry(name.clone()).or_insert_with(|| {
                        site_names.push(name);
                        site_names.len() - 1
                    })
                });
                let key = TrackKey {
                    pid: e.pid,
                    device: e.device,
                };
                let s = sums.entry(key).or_default().entry(site).or_default();
                s.0 += e.size;
                s.1 += 1;
                live.entry((e.pid, e.addr))
                    .or_default()
                    .push((e.alloc_id, e.size, site, key));
            }
            Kind::Free => {
                if let Some(v) = live.get_mut(&(e.pid, e.addr)) {
                    let pos = if e.alloc_id != 0 {
                        v.iter().rposition(|b| b.0 == e.alloc_id || b.0 == 0)
                    } else {
                        v.len().checked_sub(1)
                    };
                    if let Some(pos) = pos {
                        let (_, size, site, key) = v.remove(pos);
                        if v.is_empty() {
                            live.remove(&(e.pid, e.addr));
                        }
                        if let Some(s) = sums.get_mut(&key).and_then(|m| m.get_mut(&site)) {
                            s.0 -= size;
                            s.1 -= 1;
                        }
                    }
                }
            }
            _ => {}
        }
        while next < triggers.len() && triggers[next].0 == i {
            let (_, key, n) = triggers[next];
            let mut rows: Vec<SiteRow> = sums
                .get(&key)
                .map(|m| {
                    m.iter()
                        .filter(|(_, v)| v.1 > 0)
                        .map(|(s, v)| SiteRow {
                            key: site_names[*s].clone(),
                            bytes: v.0,
                            blocks: v.1,
                        })
                        .collect()
                })
                .unwrap_or_default();
            rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.key.cmp(&b.key)));
            out.get_mut(&key).expect("trigger of a known track")[n] = rows;
            next += 1;
        }
    }
    out
}

/// The JSON document the page draws.
pub fn data(model: &Model, inputs: &[String], compare: Option<&CompareInput>) -> Value {
    let keys: Vec<TrackKey> = model.tracks.keys().copied().collect();
    let peak_moments: Vec<Moment> = keys
        .iter()
        .map(|k| match model.tracks[k].peak_event {
            Some(i) => Moment::AfterEvent(i),
            None => Moment::End,
        })
        .collect();
    let peak_snaps = model.snapshots(&peak_moments);
    let tl_sites = timeline_sites(model, false);
    let mut site_cache: HashMap<u32, String> = HashMap::new();
    let mut tracks = Vec::new();
    let (mut leak_blocks, mut leak_bytes) = (0u64, 0u64);
    let (mut tensor_blocks, mut tensor_bytes, mut cached_bytes) = (0u64, 0u64, 0u64);
    for (n, key) in keys.iter().enumerate() {
        let t = &model.tracks[key];
        let empty = Vec::new();
        let at_peak: &Vec<LiveBlock> = peak_snaps[n].get(key).unwrap_or(&empty);
        let mut largest: Vec<&LiveBlock> = at_peak.iter().collect();
        largest.sort_by(|a, b| b.size.cmp(&a.size).then(a.ts.cmp(&b.ts)));
        let leaks = model.leaks.get(key).unwrap_or(&empty);
        let lb: u64 = leaks.iter().map(|b| b.size).sum();
        leak_blocks += leaks.len() as u64;
        leak_bytes += lb;
        let exit = model.exit.get(&key.pid);
        let tensor_leaks: Vec<Value> = exit
            .into_iter()
            .flat_map(|m| m.tensor_leaks.iter())
            .filter(|t| DeviceKey::from_id(t.block.device) == key.device)
            .map(|t| {
                tensor_bytes += t.block.size;
                tensor_blocks += 1;
                tensor_leak_json(model, t)
            })
            .collect();
        let pools: Vec<Value> = exit
            .into_iter()
            .flat_map(|m| m.pools.iter())
            .filter(|h| DeviceKey::from_id(h.device) == key.device)
            .map(|h| {
                cached_bytes += h.cached_bytes();
                pool_held_json(h)
            })
            .collect();
        let mut totals: HashMap<(u32, u32), u64> = HashMap::new();
        // Tensors where the process had pools (what its code asked for), else driver blocks.
        let allocation = if t.pool_peak > 0 {
            super::model::Kind::PoolMalloc
        } else {
            super::model::Kind::Malloc
        };
        for e in &model.events {
            if e.kind == allocation && e.pid == key.pid && e.device == key.device {
                *totals.entry((e.name, e.stack)).or_default() += e.size;
            }
        }
        let mut totals: Vec<((u32, u32), u64)> = totals.into_iter().collect();
        totals.sort();
        let flame_total = flame_tree(
            totals
                .into_iter()
                .map(|((o, s), v)| (stack_frames(model, o, s), v)),
        );
        let flame_live = flame_tree(
            at_peak
                .iter()
                .map(|b| (stack_frames(model, b.owner, b.stack), b.size)),
        );
        let timeline: Vec<Value> = t
            .timeline
            .iter()
            .enumerate()
            .map(|(i, m)| {
                json!({"start_s": m.start_ns as f64 / 1e9, "t_s": secs(model, m.ts),
                    "bytes": m.bytes, "sites": sites_json(&tl_sites[key][i], TIMELINE_SITES)})
            })
            .collect();
        let by_owner: Vec<Vec<u64>> = (0..t.owners.len())
            .map(|o| {
                t.points
                    .iter()
                    .map(|p| p.by_owner.get(o).copied().unwrap_or(0))
                    .collect()
            })
            .collect();
        tracks.push(json!({
            "pid": key.pid,
            "device": key.device_label(),
            "owners": t.owners.iter().zip(&t.driver_owner)
                .map(|(o, d)| json!({"name": model.name(*o), "driver": d})).collect::<Vec<_>>(),
            "t": t.points.iter().map(|p| secs(model, p.ts)).collect::<Vec<_>>(),
            "by_owner": by_owner,
            "steps": model.steps.get(&key.pid).map(|v| v.iter().map(|s| secs(model, *s)).collect::<Vec<_>>()).unwrap_or_default(),
            "peak": t.peak,
            "peak_t": secs(model, t.peak_ts),
            "pool_peak": t.pool_peak,
            "end_bytes": t.end_bytes,
            "mallocs": t.mallocs,
            "frees": t.frees,
            "peak_live_count": at_peak.len(),
            "peak_live": largest.iter().take(PEAK_BLOCKS).map(|b| block_json(model, b, &mut site_cache)).collect::<Vec<_>>(),
            "peak_sites": sites_json(&sites::by_site(model, at_peak, false), SITES),
            "leaks": leaks.iter().take(LEAKS).map(|b| block_json(model, b, &mut site_cache)).collect::<Vec<_>>(),
            "leak_count": leaks.len(),
            "leak_bytes": lb,
            "tensor_leaks": tensor_leaks.into_iter().take(LEAKS).collect::<Vec<_>>(),
            "pools": pools,
            "timeline": timeline,
            "flame_live": flame_live,
            "flame_total": flame_total,
        }));
    }
    let rows: u64 = model.files.iter().map(|f| f.1).sum();
    json!({
        "inputs": inputs,
        "rows": rows,
        "span_s": secs(model, model.t1),
        "timeline_ms": model.timeline_ms,
        "leak_blocks": leak_blocks,
        "leak_bytes": leak_bytes,
        "tensor_leak_blocks": tensor_blocks,
        "tensor_leak_bytes": tensor_bytes,
        "cached_bytes": cached_bytes,
        "tracks": tracks,
        "compare": compare.map(|c| compare_json(model, c)),
        "generator": concat!("memscope-bpf ", env!("CARGO_PKG_VERSION")),
    })
}

/// The second run of a comparison, with the dump pairs to compare op by op.
pub struct CompareInput {
    pub name: String,
    pub base_name: String,
    pub model: Model,
    /// (base dump, compare dump) of the same device, when each run has one dump per device.
    pub pairs: Vec<(std::path::PathBuf, std::path::PathBuf)>,
}

fn compare_json(base: &Model, c: &CompareInput) -> Value {
    // Per device: the track with the highest peak of each run (pids differ between runs).
    fn by_device(m: &Model) -> BTreeMap<String, &super::model::Track> {
        let mut out: BTreeMap<String, &super::model::Track> = BTreeMap::new();
        for (k, t) in &m.tracks {
            let e = out.entry(k.device_label()).or_insert(t);
            if t.peak > e.peak {
                *e = t;
            }
        }
        out
    }
    fn leak_bytes(m: &Model, dev: &str) -> u64 {
        m.leaks
            .iter()
            .filter(|(k, _)| k.device_label() == dev)
            .flat_map(|(_, v)| v.iter().map(|b| b.size))
            .sum()
    }
    let (a, b) = (by_device(base), by_device(&c.model));
    let mut devices = Vec::new();
    let mut names: Vec<&String> = a.keys().chain(b.keys()).collect();
    names.sort();
    names.dedup();
    for d in names {
        let curve = |m: &Model, t: Option<&&super::model::Track>| -> Vec<(f64, u64)> {
            t.map(|t| t.points.iter().map(|p| (secs(m, p.ts), p.driver)).collect())
                .unwrap_or_default()
        };
        devices.push(json!({
            "device": d,
            "peak_base": a.get(d).map_or(0, |t| t.peak),
            "peak_other": b.get(d).map_or(0, |t| t.peak),
            "leak_base": leak_bytes(base, d),
            "leak_other": leak_bytes(&c.model, d),
            "base": curve(base, a.get(d)).into_iter().map(|(t, v)| json!([t, v])).collect::<Vec<_>>(),
            "other": curve(&c.model, b.get(d)).into_iter().map(|(t, v)| json!([t, v])).collect::<Vec<_>>(),
        }));
    }
    let mut ops: Vec<Vec<String>> = Vec::new();
    for (pa, pb) in &c.pairs {
        // Op compare needs operator rows; a run without them just has no table.
        if let Ok(lines) = compare::compare_files(pa, pb, &Levels::default()) {
            if ops.is_empty() {
                ops.push(lines.get(1).map(|h| split(h)).unwrap_or_default());
            }
            ops.extend(lines.iter().skip(2).take(2000).map(|l| split(l)));
        }
    }
    json!({"base": c.base_name, "other": c.name, "devices": devices, "ops": ops})
}

fn split(line: &str) -> Vec<String> {
    line.split(',').map(str::to_owned).collect()
}

/// A fresh value for the page's script nonce (128 bits, hex): only the page's own two
/// script elements run, and no inline handler at all, whatever text a run put in the page.
fn script_nonce() -> String {
    let mut bytes = [0u8; 16];
    // SAFETY: getrandom writes at most bytes.len() bytes into the buffer.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        // No entropy source: still a policy without 'unsafe-inline' (handlers stay off).
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        bytes = (t ^ (u128::from(std::process::id()) << 64)).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The page, with `data` embedded.
pub fn page(data: &Value) -> String {
    let json = escape::json_in_html(data);
    let nonce = script_nonce();
    let mut s = String::with_capacity(ECHARTS_JS.len() + json.len() + 16384);
    s.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n");
    s.push_str(&format!("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; img-src data:\">\n"));
    s.push_str("<title>memscope-bpf memory report</title>\n<style>\n");
    s.push_str(REPORT_CSS);
    s.push_str(&format!("</style>\n<script nonce=\"{nonce}\">\n"));
    s.push_str(ECHARTS_JS);
    s.push_str(
        "\n</script>\n</head><body>\n<main id=\"report\"></main>\n<pre id=\"selfcheck\"></pre>\n",
    );
    s.push_str("<script type=\"application/json\" id=\"report-data\">");
    s.push_str(&json);
    s.push_str(&format!("</script>\n<script nonce=\"{nonce}\">\n"));
    s.push_str(REPORT_JS);
    s.push_str("</script>\n</body></html>\n");
    s
}

/// Writes the report of `model` to `out`.
pub fn write(
    model: &Model,
    inputs: &[String],
    compare: Option<&CompareInput>,
    out: &Path,
) -> Result<u64> {
    let page = page(&data(model, inputs, compare));
    super::write_output(out, page.as_bytes())?;
    Ok(page.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vendored_echarts_is_the_pinned_release() {
        // sha256 of dist/echarts.min.js in echarts-6.1.0.tgz (npm integrity
        // sha512-q0yaFPggC9FUdsWH4blavRWFmxdrIodbkoKNAjJudAI6CA9gNPxHtV2RcZNEepZVlk4yvBYkOkbk6HIVpIyHZA==).
        const SHA256: &str = "b66b25aeb4df84e33199dc21694014d336d222cbd9deb0e5a7c14bd6aa0d0fd0";
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/echarts/echarts.min.js");
        let out = std::process::Command::new("sha256sum")
            .arg(path)
            .output()
            .expect("sha256sum (coreutils) runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.split_whitespace().next(), Some(SHA256), "{path}");
        assert!(ECHARTS_JS.contains("Apache License"));
        assert!(ECHARTS_JS.contains(&format!("\"{ECHARTS_VERSION}\"")));
    }

    #[test]
    fn flame_tree_sums_and_prunes() {
        let t = flame_tree(vec![
            (vec!["PTA".to_owned(), "main".to_owned()], 1000),
            (vec!["PTA".to_owned(), "f".to_owned()], 3000),
            (vec!["CANN".to_owned()], 1),
        ]);
        assert_eq!(t["v"], 4001);
        assert_eq!(t["c"][0]["n"], "PTA");
        assert_eq!(t["c"][0]["c"][0]["n"], "f");
        assert_eq!(t["c"][0]["c"][0]["v"], 3000);
        // 1 byte is under 1/2000 of the total: folded into [small].
        assert_eq!(t["c"][1]["n"], "[small]");
    }

    #[test]
    fn page_escapes_script_ends() {
        let p = page(&json!({"x": "</script><b>"}));
        assert!(p.contains("\\u003c/script\\u003e\\u003cb\\u003e"));
        assert_eq!(p.matches("</script>").count(), 3);
    }

    /// Issue 27: text of a run never becomes markup, and the policy runs no inline handler
    /// (the tooltips are HTML: a name escaped wrongly there must still run nothing).
    #[test]
    fn page_policy_runs_only_its_own_scripts() {
        let p = page(&json!({"x": "<img src=x onerror=alert(1)>"}));
        assert!(
            !p.contains("<img src=x"),
            "markup from the data is in the page"
        );
        let csp = p
            .lines()
            .find(|l| l.contains("Content-Security-Policy"))
            .unwrap();
        let script_src = csp.split(';').find(|d| d.contains("script-src")).unwrap();
        assert!(!script_src.contains("unsafe"), "{script_src}");
        let nonce = script_src
            .split("'nonce-")
            .nth(1)
            .unwrap()
            .trim_end_matches('\'');
        assert_eq!(nonce.len(), 32);
        assert_eq!(p.matches(&format!("<script nonce=\"{nonce}\">")).count(), 2);
        assert_ne!(
            page(&json!({})).split("'nonce-").nth(1),
            csp.split("'nonce-").nth(1)
        );
    }
}
