//! End-to-end: `report` draws a traced run in headless Chromium (no console errors, every chart
//! with data and painted pixels, the peak and leak figures equal to the run's own), the Perfetto
//! export is well-formed trace-event JSON whose counters peak at the run's peak, and
//! `analyze --by-site/--at/--timeline` agree with a workload that logs its own allocations with
//! their call sites and times. A ten-million-event replay is drawn too (size checked; its paint
//! time is measured in `cargo xtask bench --only report`).
//!
//! Screenshots and pages are kept under `target/tmp/report-artifacts/`.

mod common;

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    process::Command,
};

use common::chromium::{chrome, dump_dom, require_chromium};
use common::{TRACER, bin, find_files, require_root, run_tracer, scratch, serial};
use memscope_bpf::{
    output::DeviceKey,
    report::{
        html,
        model::{Builder, Event, Kind},
    },
};
use serde_json::Value;

fn artifacts() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report-artifacts");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// What the page reported about itself, and the DOM after the scripts ran.
struct Rendered {
    check: Value,
    dom: String,
}

/// Renders `html` twice: once for the DOM (and the self-check), once for a screenshot.
fn render(html: &Path, png: &Path, scratch_dir: &Path) -> Rendered {
    let profile = scratch_dir.join("chrome-profile");
    let dom = dump_dom(html, &profile);
    let start = dom
        .find("<pre id=\"selfcheck\">")
        .expect("selfcheck element")
        + "<pre id=\"selfcheck\">".len();
    let end = start + dom[start..].find("</pre>").unwrap();
    let text = dom[start..end]
        .replace("&quot;", "\"")
        .replace("&amp;", "&");
    assert!(
        !text.is_empty(),
        "the page's script never finished (no self-check) in {}",
        html.display()
    );
    let check: Value = serde_json::from_str(&text).expect("selfcheck JSON");
    let _ = std::fs::remove_file(png);
    let out = chrome(html, &[format!("--screenshot={}", png.display())], &profile);
    assert!(
        out.status.success(),
        "chromium --screenshot failed: {out:?}"
    );
    let shot = std::fs::metadata(png).expect("screenshot written");
    assert!(
        shot.len() > 10_000,
        "screenshot of {} is blank-sized",
        html.display()
    );
    Rendered { check, dom }
}

/// The JSON document a page embeds.
fn report_data(page: &Path) -> Value {
    let text = std::fs::read_to_string(page).unwrap();
    let start = text.find("id=\"report-data\">").unwrap() + "id=\"report-data\">".len();
    let end = start + text[start..].find("</script>").unwrap();
    serde_json::from_str(&text[start..end].replace("<\\/", "</")).unwrap()
}

/// No errors, and every chart has data and painted pixels; returns the chart ids.
fn assert_drawn(r: &Rendered, what: &str) -> Vec<String> {
    assert_eq!(
        r.check["errors"],
        Value::Array(vec![]),
        "{what}: errors on the page"
    );
    let charts = r.check["charts"].as_array().expect("charts");
    assert!(!charts.is_empty(), "{what}: no chart");
    for c in charts {
        assert!(
            c["points"].as_u64().unwrap() > 0,
            "{what}: chart without data: {c}"
        );
        assert!(
            c["painted"].as_u64().unwrap() > 0,
            "{what}: chart not painted: {c}"
        );
    }
    charts
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect()
}

/// A figure the page shows: `<b data-check="NAME" data-track="TRACK" ...>TEXT</b>`.
struct Figure {
    /// The exact value: `data-bytes` for a byte tile, else the text.
    value: u64,
    text: String,
    /// The hover text (`title`), if any.
    title: Option<String>,
}

/// The `data-check="NAME"` figures in the DOM, by track ("" for the page totals).
fn tiles(dom: &str, name: &str) -> BTreeMap<String, Figure> {
    let mut out = BTreeMap::new();
    let needle = format!("data-check=\"{name}\"");
    // The whole tag: attributes may come before data-check too.
    for (pos, _) in dom.match_indices(&needle) {
        let tag_start = dom[..pos].rfind('<').unwrap();
        let tag_end = pos + dom[pos..].find('>').unwrap();
        let tag = &dom[tag_start..tag_end];
        let attr = |a: &str| {
            tag.split(&format!(" {a}=\""))
                .nth(1)
                .map(|t| t[..t.find('"').unwrap()].to_owned())
        };
        let value_end = tag_end + dom[tag_end..].find('<').unwrap();
        let text = dom[tag_end + 1..value_end].trim().to_owned();
        let exact = attr("data-bytes").unwrap_or_else(|| text.clone());
        let value = exact
            .parse()
            .unwrap_or_else(|_| panic!("{name}: '{exact}'"));
        let figure = Figure {
            value,
            text,
            title: attr("title"),
        };
        out.insert(attr("data-track").unwrap_or_default(), figure);
    }
    out
}

/// The exact values of the `data-check="NAME"` figures, by track.
fn figures(dom: &str, name: &str) -> BTreeMap<String, u64> {
    tiles(dom, name)
        .into_iter()
        .map(|(k, f)| (k, f.value))
        .collect()
}

/// Byte tiles show KiB/MiB/GiB (as the page's axes do) with the exact count on hover.
fn assert_byte_tile(f: &Figure, what: &str) {
    let shown = human_bytes(f.value);
    assert_eq!(f.text, shown, "{what}: the tile's text");
    assert_eq!(
        f.title.as_deref(),
        Some(format!("{} bytes", f.value).as_str()),
        "{what}: the tile's hover text"
    );
}

/// Binary units with two decimals, computed here independently of the page's script.
fn human_bytes(b: u64) -> String {
    if b < 1024 {
        return format!("{b} B");
    }
    let units = ["KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64 / 1024.0;
    let mut i = 0;
    while v >= 1024.0 && i < units.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.2} {}", units[i])
}

/// The tracer's own running sum: the largest `used` of the HAL rows, per device.
fn used_peaks(dir: &Path) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for f in find_files(dir, "memscope_dump_") {
        // The library's reader: these dumps carry multi-line C stacks.
        for r in memscope_bpf::offline::reader::read_rows(&f).unwrap() {
            if r.event_type == "HAL" && (r.event == "MALLOC" || r.event == "FREE") {
                let used: u64 = r.attr("used").unwrap().parse().unwrap();
                let dev = match r.device {
                    DeviceKey::Npu(n) => n.to_string(),
                    other => panic!("HAL row on {other:?}"),
                };
                let e = out.entry(dev).or_default();
                *e = (*e).max(used);
            }
        }
    }
    out
}

/// Checks the trace-event format (the JSON object form of the Chrome trace-event spec) and
/// returns the largest `driver total` counter per device.
fn validate_trace(trace: &Value) -> BTreeMap<String, u64> {
    let evs = trace["traceEvents"].as_array().expect("traceEvents array");
    assert!(!evs.is_empty());
    let mut peaks: BTreeMap<String, u64> = BTreeMap::new();
    let mut open_async: HashMap<(String, u64), i64> = HashMap::new();
    for e in evs {
        let ph = e["ph"].as_str().unwrap_or_else(|| panic!("no ph: {e}"));
        assert!(e["pid"].is_u64(), "pid: {e}");
        if ph != "M" {
            assert!(e["tid"].is_u64(), "tid: {e}");
            let ts = e["ts"].as_f64().unwrap_or_else(|| panic!("ts: {e}"));
            assert!(ts >= 0.0, "{e}");
        }
        assert!(e["name"].is_string(), "name: {e}");
        match ph {
            "M" => assert!(e["args"]["name"].is_string(), "{e}"),
            "C" => {
                let args = e["args"].as_object().expect("counter args");
                assert!(!args.is_empty());
                for v in args.values() {
                    assert!(v.is_u64(), "counter value {v} in {e}");
                }
                if let Some(v) = args.get("driver total") {
                    let dev = e["name"]
                        .as_str()
                        .unwrap()
                        .strip_prefix("memory device ")
                        .expect("counter name")
                        .to_owned();
                    let p = peaks.entry(dev).or_default();
                    *p = (*p).max(v.as_u64().unwrap());
                }
            }
            "X" => assert!(e["dur"].as_f64().unwrap() >= 0.0, "{e}"),
            "i" => assert!(
                ["g", "p", "t"].contains(&e["s"].as_str().unwrap()),
                "instant scope: {e}"
            ),
            "b" | "e" => {
                let key = (
                    e["cat"].as_str().expect("async cat").to_owned(),
                    e["id"].as_u64().expect("async id"),
                );
                *open_async.entry(key).or_default() += if ph == "b" { 1 } else { -1 };
            }
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    for (k, n) in open_async {
        assert_eq!(n, 0, "async slice {k:?} not closed");
    }
    peaks
}

#[test]
fn report_of_the_demo_run_in_chromium_and_perfetto() {
    if !require_root("report_of_the_demo_run_in_chromium_and_perfetto") {
        return;
    }
    let _g = serial();
    let dir = scratch("report-demo");
    let out_dir = dir.join("out");
    let demo = bin("demo_train");
    let out = run_tracer(&[
        &format!("--output-path={}", out_dir.display()),
        "--call-stack=c",
        "--report",
        "--",
        demo.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // The workload's own account of its leak, and the tracer's leak report.
    assert!(
        stdout.contains("leaked 6 blocks, 12582912 bytes"),
        "{stdout}"
    );
    assert!(
        stderr.contains(
            "leak report: 0 tensor(s) leaked, 0 bytes; 6 driver block(s) no pool owns leaked, \
             12.00 MiB (12582912 bytes)"
        ),
        "{stderr}"
    );
    // --report wrote the page at the end of the run.
    let at_end = find_files(&out_dir, "report.html");
    assert_eq!(at_end.len(), 1, "{stderr}");

    let art = artifacts();
    // -o names the directory (as in every mode); the files are named after the page.
    let demo_dir = art.join("demo");
    let page = demo_dir.join("memscope_report.html");
    let r = Command::new(TRACER)
        .args(["report", "-i"])
        .arg(&out_dir)
        .arg("-o")
        .arg(&demo_dir)
        .args(["--format=html,perfetto,folded,speedscope"])
        .output()
        .unwrap();
    assert!(r.status.success(), "{r:?}");
    // Both pages draw the same run: the same tracks, figure for figure.
    assert!(
        report_data(&page)["tracks"] == report_data(&at_end[0])["tracks"],
        "report and --report drew the run differently"
    );

    let rendered = render(&page, &art.join("demo.png"), &dir);
    let ids = assert_drawn(&rendered, "demo");
    // Two devices, four charts each: memory, timeline, two flame charts.
    assert_eq!(ids.len(), 8, "{ids:?}");

    let peaks = used_peaks(&out_dir);
    assert_eq!(peaks.len(), 2, "{peaks:?}");
    let shown = figures(&rendered.dom, "peak");
    let shown_by_dev: BTreeMap<String, u64> = shown
        .iter()
        .map(|(k, v)| (k.rsplit('/').next().unwrap().to_owned(), *v))
        .collect();
    assert_eq!(
        shown_by_dev, peaks,
        "peaks on the page vs the tracer's used"
    );
    assert_eq!(figures(&rendered.dom, "leak-blocks")[""], 6);
    assert_eq!(figures(&rendered.dom, "leak-bytes")[""], 12582912);
    // Every byte tile in human units with the exact bytes on hover: 12 MiB leaked, the peaks.
    let leaked = &tiles(&rendered.dom, "leak-bytes")[""];
    assert_eq!(leaked.text, "12.00 MiB");
    assert_byte_tile(leaked, "leak-bytes");
    for name in ["peak", "end-bytes"] {
        let shown = tiles(&rendered.dom, name);
        assert_eq!(shown.len(), 2, "{name}: one per device");
        for (track, f) in &shown {
            assert_byte_tile(f, &format!("{name} of {track}"));
        }
    }
    // Driver bytes at the end, over the devices: what the workload says it leaked.
    let end: u64 = figures(&rendered.dom, "end-bytes").values().sum();
    assert_eq!(end, 12582912);
    let per_track: u64 = figures(&rendered.dom, "track-leaks").values().sum();
    assert_eq!(per_track, 6);

    // Perfetto: well-formed, counters peak at the run's peak per device, 6 leak instants.
    let trace: Value = serde_json::from_slice(
        &std::fs::read(demo_dir.join("memscope_report.perfetto.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(validate_trace(&trace), peaks);
    let leaks = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cat"] == "leak")
        .count();
    assert_eq!(leaks, 6);
    // 5 "step start" ranges, as slices.
    let steps = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "b" && e["name"] == "step start")
        .count();
    assert_eq!(steps, 5);

    // Folded stacks at exit: the 6 leaked blocks, 12 MiB, all from alloc_on_device.
    let folded = std::fs::read_to_string(demo_dir.join("memscope_report.exit.folded")).unwrap();
    let total: u64 = folded
        .lines()
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, 12582912, "{folded}");
    assert!(
        folded.lines().all(|l| l.contains("alloc_on_device")),
        "{folded}"
    );
    let speedscope: Value = serde_json::from_slice(
        &std::fs::read(demo_dir.join("memscope_report.speedscope.json")).unwrap(),
    )
    .unwrap();
    let exit_bytes: u64 = speedscope["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"].as_str().unwrap().starts_with("live at exit"))
        .map(|p| p["endValue"].as_u64().unwrap())
        .sum();
    assert_eq!(exit_bytes, 12582912);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One line of site_workload's log.
#[derive(Debug)]
enum Logged {
    Alloc {
        t: u64,
        addr: u64,
        size: u64,
        site: String,
    },
    Free {
        t: u64,
        addr: u64,
    },
}

fn parse_site_log(path: &Path) -> Vec<Logged> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let f = common::log_fields(l);
            let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
            if l.starts_with("ALLOC ") {
                Logged::Alloc {
                    t: f["t_ns"].parse().unwrap(),
                    addr: hex(f["addr"]),
                    size: f["size"].parse().unwrap(),
                    // "src/site_workload.c:74" -> "site_workload.c:74"
                    site: f["site"].rsplit('/').next().unwrap().to_owned(),
                }
            } else {
                Logged::Free {
                    t: f["t_ns"].parse().unwrap(),
                    addr: hex(f["addr"]),
                }
            }
        })
        .collect()
}

/// Live bytes and blocks per site after the first `n` log lines.
fn sites_after(log: &[Logged], n: usize) -> BTreeMap<String, (u64, u64)> {
    let mut live: HashMap<u64, (u64, String)> = HashMap::new();
    for l in &log[..n] {
        match l {
            Logged::Alloc {
                addr, size, site, ..
            } => {
                live.insert(*addr, (*size, site.clone()));
            }
            Logged::Free { addr, .. } => {
                live.remove(addr).expect("the log frees what it allocated");
            }
        }
    }
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (size, site) in live.values() {
        let e = out.entry(site.clone()).or_default();
        e.0 += size;
        e.1 += 1;
    }
    out
}

/// `analyze --by-site` lines: `<bytes> bytes <n> block(s)  <site>`, site shortened to its
/// file name.
fn parse_by_site(stdout: &str) -> BTreeMap<String, (u64, u64)> {
    stdout
        .lines()
        .filter(|l| l.contains(" block(s)  "))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (
                w[4].rsplit('/').next().unwrap().to_owned(),
                (w[0].parse().unwrap(), w[2].parse().unwrap()),
            )
        })
        .collect()
}

#[test]
fn by_site_and_timeline_match_the_workloads_own_log() {
    if !require_root("by_site_and_timeline_match_the_workloads_own_log") {
        return;
    }
    let _g = serial();
    let dir = scratch("report-sites");
    let out_dir = dir.join("out");
    let log_path = dir.join("sites.log");
    let workload = bin("site_workload");
    let out = run_tracer(&[
        &format!("--output-path={}", out_dir.display()),
        "--call-stack=c",
        "--",
        workload.to_str().unwrap(),
        "--log",
        log_path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let log = parse_site_log(&log_path);
    assert_eq!(log.len(), 59);
    let dumps = find_files(&out_dir, "memscope_dump_");
    assert_eq!(dumps.len(), 1);
    let dump = dumps[0].to_str().unwrap();
    let analyze = |extra: &[&str], name: &str| {
        let o = Command::new(TRACER)
            .args(["analyze", "-q", "-i", dump, "-o"])
            .arg(dir.join(name))
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };

    // At the end: the weights (line of load_weights) and the two activations kept.
    let at_exit = parse_by_site(&analyze(&["--by-site"], "a1"));
    assert_eq!(at_exit, sites_after(&log, log.len()));
    assert_eq!(at_exit.len(), 2, "{at_exit:?}");

    // At the peak: the log's own running maximum.
    let (mut cur, mut best, mut best_n) = (0u64, 0u64, 0usize);
    let mut sizes: HashMap<u64, u64> = HashMap::new();
    for (n, l) in log.iter().enumerate() {
        match l {
            Logged::Alloc { addr, size, .. } => {
                sizes.insert(*addr, *size);
                cur += size;
            }
            Logged::Free { addr, .. } => cur -= sizes.remove(addr).unwrap(),
        }
        if cur > best {
            (best, best_n) = (cur, n + 1);
        }
    }
    let at_peak = parse_by_site(&analyze(&["--by-site", "--at=peak"], "a2"));
    assert_eq!(at_peak, sites_after(&log, best_n));
    assert_eq!(at_peak.values().map(|v| v.0).sum::<u64>(), best);
    assert_eq!(at_peak.len(), 3, "all three sites are live at the peak");

    // At 0.25 s: after burst 2 (at 0.24 s), before burst 3 (at 0.34 s).
    let t0 = match &log[0] {
        Logged::Alloc { t, .. } => *t,
        _ => unreachable!(),
    };
    let t_of = |l: &Logged| match l {
        Logged::Alloc { t, .. } | Logged::Free { t, .. } => *t,
    };
    let n_at = log.iter().filter(|l| t_of(l) <= t0 + 250_000_000).count();
    let at_quarter = parse_by_site(&analyze(&["--by-site", "--at=0.25"], "a3"));
    assert_eq!(at_quarter, sites_after(&log, n_at));

    // --by-stack: whole stacks, the weights' one through load_weights and main.
    let by_stack = analyze(&["--by-stack"], "a4");
    assert!(by_stack.contains("load_weights at "), "{by_stack}");
    assert!(by_stack.contains("main at "), "{by_stack}");

    // Timeline: the local maximum of each 100 ms interval from the first event, as the log
    // has it (bursts sit 40 ms into their interval, far from either edge).
    analyze(&["--timeline"], "a5");
    let csv = std::fs::read_to_string(dir.join("a5/memscope_timeline_100ms.csv")).unwrap();
    let mut expected: BTreeMap<u64, (u64, String)> = BTreeMap::new();
    let mut live: HashMap<u64, (u64, String)> = HashMap::new();
    let mut cur = 0u64;
    for l in &log {
        match l {
            Logged::Alloc {
                addr, size, site, ..
            } => {
                live.insert(*addr, (*size, site.clone()));
                cur += size;
            }
            Logged::Free { addr, .. } => cur -= live.remove(addr).unwrap().0,
        }
        let iv = (t_of(l) - t0) / 100_000_000 * 100;
        if expected.get(&iv).is_none_or(|e| cur > e.0) {
            // The site holding the most at that moment.
            let mut by: BTreeMap<String, u64> = BTreeMap::new();
            for (s, site) in live.values() {
                *by.entry(site.clone()).or_default() += s;
            }
            // Ties go to the first name, as the tool sorts (largest first, then by name).
            let top = by
                .iter()
                .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
                .unwrap()
                .0
                .clone();
            expected.insert(iv, (cur, top));
        }
    }
    let got: BTreeMap<u64, (u64, String)> = csv
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (
                f[2].parse().unwrap(),
                (
                    f[4].parse().unwrap(),
                    f[5].rsplit('/').next().unwrap().to_owned(),
                ),
            )
        })
        .collect();
    assert_eq!(got, expected, "{csv}");
    assert_eq!(got.len(), 6);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ten million events through the same model, drawn in Chromium. The generator knows the
/// truth: a ring of 64 live blocks per device, the oldest freed when a new one comes.
#[test]
fn report_of_ten_million_events() {
    const EVENTS: u64 = 10_000_000;
    const RING: usize = 64;
    if !require_chromium("report_of_ten_million_events") {
        return;
    }
    let dir = scratch("report-10m");
    let mut b = Builder::new();
    let owners = [b.intern("CANN@APP"), b.intern("CANN@HCCL")];
    let stacks: Vec<u32> = (0..8)
        .map(|i| {
            b.intern_stack(
                &format!(
                    "0x0000000000401000 halMemAlloc at /x/hal.c:10\n\
                 0x0000000000402000 layer{i} at /app/model.c:{}\n\
                 0x0000000000403000 main at /app/main.c:5",
                    100 + i
                ),
                "",
            )
        })
        .collect();
    let mut rings: [std::collections::VecDeque<(u64, u64)>; 2] = Default::default();
    let mut cur = [0u64; 2];
    let mut peak = [0u64; 2];
    let mut next_addr = [0x1000_0000_0000u64, 0x2000_0000_0000u64];
    let mut n = 0u64;
    let mut i = 0u64;
    while n < EVENTS {
        let d = (i % 2) as usize;
        let ts = 1_700_000_000_000_000_000 + n * 10_000; // 10 µs apart: 100 s
        if rings[d].len() == RING {
            let (addr, size) = rings[d].pop_front().unwrap();
            cur[d] -= size;
            b.push(Event {
                ts,
                addr,
                size,
                alloc_id: 0,
                pid: 7,
                tid: 7 + d as u32,
                name: 0,
                stack: 0,
                pool: 0,
                device: DeviceKey::Npu(d as u32),
                kind: Kind::Free,
            });
            n += 1;
        }
        let size = 4096 * (1 + (i * 7919 % 997));
        let addr = next_addr[d];
        next_addr[d] += 1 << 24;
        rings[d].push_back((addr, size));
        cur[d] += size;
        peak[d] = peak[d].max(cur[d]);
        b.push(Event {
            ts: 1_700_000_000_000_000_000 + n * 10_000,
            addr,
            size,
            alloc_id: 0,
            pid: 7,
            tid: 7 + d as u32,
            name: owners[(i / 7 % 2) as usize],
            stack: stacks[(i % 8) as usize],
            pool: 0,
            device: DeviceKey::Npu(d as u32),
            kind: Kind::Malloc,
        });
        n += 1;
        i += 1;
    }
    let model = b.finish(100);
    assert_eq!(model.events.len() as u64, n);
    let page = html::page(&html::data(&model, &["synthetic 10M".to_owned()], None));
    assert!(
        page.len() < 10 * 1024 * 1024,
        "the 10M-event report is {} bytes",
        page.len()
    );
    let art = artifacts();
    let path = art.join("replay-10m.html");
    std::fs::write(&path, &page).unwrap();
    let rendered = render(&path, &art.join("replay-10m.png"), &dir);
    assert_eq!(assert_drawn(&rendered, "10M").len(), 8);
    let shown = figures(&rendered.dom, "peak");
    assert_eq!(shown["7/0"], peak[0]);
    assert_eq!(shown["7/1"], peak[1]);
    assert_eq!(figures(&rendered.dom, "leak-blocks")[""], 2 * RING as u64);
    let leaked: u64 = rings.iter().flatten().map(|(_, s)| s).sum();
    assert_eq!(figures(&rendered.dom, "leak-bytes")[""], leaked);
    let _ = std::fs::remove_dir_all(&dir);
}
