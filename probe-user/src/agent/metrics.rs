//! `/metrics`: the agent's state, encoded by the `prometheus-client` crate from a registry
//! built afresh for each scrape, in the format the scraper asks for ([`Format::negotiate`]):
//! OpenMetrics 1.0.0 (`# UNIT`, `# EOF`) for a Prometheus that sends its usual `Accept`, the
//! Prometheus text format 0.0.4 for anything else (`curl`, older tools). The text format
//! passes `promtool check metrics` without a warning, OpenMetrics `prometheus_client`'s
//! OpenMetrics parser (tests/agent_fleet.rs).
//!
//! Labels are bounded: `pid`, `comm`, `device` and `owner`, and the process's `container` and
//! `pod_uid` (`cgroup.rs`; one value each per pid, so they add no series). A process appears
//! while it lives and for `--keep-exited` after; owners are the decompose owners. Stacks never
//! become label values; they are in the pprof endpoint.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::{Registry, Unit},
};

use super::state::Shared;

/// The two expositions a scraper can ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    /// The Prometheus text format 0.0.4: no `# UNIT` or `# EOF`, a counter's `# TYPE` and
    /// `# HELP` name its `_total` series.
    Text,
}

impl Format {
    /// The format an `Accept` header asks for, as Prometheus's own client picks it: the
    /// media ranges by falling quality (a tie keeps the header's order), and the first that
    /// names OpenMetrics (any version we write, or none) wins over the first that names text
    /// or anything. No header, or nothing we know: the text format.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Text;
        };
        let mut ranges: Vec<(f32, Format)> = Vec::new();
        for range in accept.split(',') {
            let mut params = range.split(';').map(str::trim);
            let media = params.next().unwrap_or("").to_ascii_lowercase();
            let mut q = 1.0f32;
            let mut version_ok = true;
            for p in params {
                match p.split_once('=') {
                    Some((k, v)) if k.trim().eq_ignore_ascii_case("q") => {
                        q = v.trim().parse().unwrap_or(0.0);
                    }
                    Some((k, v)) if k.trim().eq_ignore_ascii_case("version") => {
                        version_ok = matches!(v.trim(), "0.0.1" | "1.0.0");
                    }
                    _ => {}
                }
            }
            if q <= 0.0 {
                continue;
            }
            let format = match media.as_str() {
                "application/openmetrics-text" if version_ok => Format::OpenMetrics,
                "application/openmetrics-text" => continue,
                _ => Format::Text,
            };
            ranges.push((q, format));
        }
        // Stable: equal qualities keep the client's order.
        ranges.sort_by(|a, b| b.0.total_cmp(&a.0));
        ranges.first().map_or(Format::Text, |r| r.1)
    }

    /// The Content-Type of the exposition.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

type Labels = Vec<(&'static str, String)>;

/// A family; with a unit its name gets the unit's suffix (`memscope_live` + bytes is
/// `memscope_live_bytes`) and OpenMetrics a `# UNIT` line.
fn gauge_family(
    reg: &mut Registry,
    name: &str,
    unit: Option<Unit>,
    help: &str,
) -> Family<Labels, Gauge> {
    let f = Family::<Labels, Gauge>::default();
    match unit {
        Some(u) => reg.register_with_unit(name, help, u, f.clone()),
        None => reg.register(name, help, f.clone()),
    }
    f
}

fn counter_family(
    reg: &mut Registry,
    name: &str,
    unit: Option<Unit>,
    help: &str,
) -> Family<Labels, Counter> {
    let f = Family::<Labels, Counter>::default();
    match unit {
        Some(u) => reg.register_with_unit(name, help, u, f.clone()),
        None => reg.register(name, help, f.clone()),
    }
    f
}

fn as_i64(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

/// The agent's own CPU time (user + system) in seconds, from getrusage.
pub fn self_cpu_seconds() -> f64 {
    // SAFETY: getrusage with a valid out-pointer.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Renders the exposition in `format`.
pub fn render(shared: &Arc<Shared>, format: Format) -> String {
    let mut reg = Registry::default();
    let live_bytes = gauge_family(
        &mut reg,
        "memscope_live",
        Some(Unit::Bytes),
        "Bytes live now (at exit for an exited process) by device and owner (CANN@<module> for \
         driver memory, PTA, PTA_WORKSPACE, MINDSPORE, ATB for framework pool regions; the two \
         layers overlap)",
    );
    let live_blocks = gauge_family(
        &mut reg,
        "memscope_live_blocks",
        None,
        "Blocks live now by device and owner",
    );
    let peak = gauge_family(
        &mut reg,
        "memscope_peak",
        Some(Unit::Bytes),
        "Highest total live bytes of the device after any one event",
    );
    let suspect_bytes = gauge_family(
        &mut reg,
        "memscope_leak_suspect",
        Some(Unit::Bytes),
        "Bytes of blocks still live --leak-steps steps after the step they were allocated in",
    );
    let suspect_blocks = gauge_family(
        &mut reg,
        "memscope_leak_suspect_blocks",
        None,
        "Blocks still live --leak-steps steps after the step they were allocated in",
    );
    let leaking = gauge_family(
        &mut reg,
        "memscope_leak_suspected",
        None,
        "1 when the process has leak suspects",
    );
    let step = gauge_family(
        &mut reg,
        "memscope_step",
        None,
        "The current mstx step (0 before the first)",
    );
    let exited = gauge_family(
        &mut reg,
        "memscope_process_exited",
        None,
        "1 once the process has exited (its numbers are final)",
    );
    let allocations = counter_family(
        &mut reg,
        "memscope_allocations",
        None,
        "Successful allocations (driver blocks, handles, pool regions)",
    );
    let frees = counter_family(
        &mut reg,
        "memscope_frees",
        None,
        "Successful frees (driver blocks, handles, pool regions)",
    );
    let allocated = counter_family(
        &mut reg,
        "memscope_allocated",
        Some(Unit::Bytes),
        "Bytes allocated, by device",
    );
    let cpu = Counter::<f64, AtomicU64>::default();
    reg.register_with_unit(
        "memscope_agent_cpu",
        "CPU time the agent itself has used (user + system)",
        Unit::Seconds,
        cpu.clone(),
    );
    cpu.inc_by(self_cpu_seconds());
    let hold = Counter::<f64, AtomicU64>::default();
    reg.register(
        "memscope_agent_hold_seconds",
        "Time processes spent held at vendor library opens, in all",
        hold.clone(),
    );
    hold.inc_by(shared.counters.hold_ns.load(Ordering::Relaxed) as f64 / 1e9);
    let c = &shared.counters;
    for (name, help, v) in [
        (
            "memscope_agent_events",
            "Events the agent received from its probes",
            shared.events.load(Ordering::Relaxed),
        ),
        (
            "memscope_agent_events_lost",
            "Events lost (ring buffer full, too many calls in flight)",
            shared.lost.load(Ordering::Relaxed),
        ),
        (
            "memscope_agent_sampled_stacks",
            "Allocations whose stack was resolved (sampled)",
            c.sampled_stacks.load(Ordering::Relaxed),
        ),
        (
            "memscope_agent_dropped_stacks",
            "Sampled allocations whose stack was not unwound: the unwinder was behind",
            c.dropped_stacks.load(Ordering::Relaxed),
        ),
        (
            "memscope_agent_unsampled_allocations",
            "Allocations counted without resolving their stack",
            c.unsampled_allocations.load(Ordering::Relaxed),
        ),
        (
            "memscope_agent_processes_seen",
            "Processes picked up since the agent started",
            c.processes_seen.load(Ordering::Relaxed),
        ),
        (
            "memscope_agent_holds",
            "Processes held at the open of a vendor library until its probes were in place",
            c.holds.load(Ordering::Relaxed),
        ),
        (
            "memscope_agent_holds_released_by_watchdog",
            "Holds the watchdog ended because the agent was frozen or gone",
            c.holds_by_watchdog.load(Ordering::Relaxed),
        ),
    ] {
        let counter = Counter::<u64>::default();
        reg.register(name, help, counter.clone());
        counter.inc_by(v);
    }

    let procs = shared.processes.lock().unwrap_or_else(|e| e.into_inner());
    let processes = Gauge::<i64>::default();
    reg.register(
        "memscope_agent_processes",
        "Processes in /metrics (live, and exited ones kept for --keep-exited)",
        processes.clone(),
    );
    processes.set(procs.len() as i64);
    for p in procs.values() {
        let base = || -> Labels {
            let mut l = vec![("pid", p.pid.to_string()), ("comm", p.comm.clone())];
            l.extend(p.container.labels().map(|(k, v)| (k, v.to_string())));
            l
        };
        let with = |extra: &[(&'static str, &str)]| -> Labels {
            let mut l = base();
            l.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
            l
        };
        for ((dev, owner), a) in &p.live {
            let l = with(&[("device", dev), ("owner", owner)]);
            live_bytes.get_or_create(&l).set(as_i64(a.bytes));
            live_blocks.get_or_create(&l).set(as_i64(a.blocks));
        }
        for ((dev, owner), a) in &p.suspects {
            let l = with(&[("device", dev), ("owner", owner)]);
            suspect_bytes.get_or_create(&l).set(as_i64(a.bytes));
            suspect_blocks.get_or_create(&l).set(as_i64(a.blocks));
        }
        for (dev, bytes) in &p.peak {
            peak.get_or_create(&with(&[("device", dev)]))
                .set(as_i64(*bytes));
        }
        for (dev, bytes) in &p.allocated_bytes {
            allocated
                .get_or_create(&with(&[("device", dev)]))
                .inc_by(*bytes);
        }
        leaking
            .get_or_create(&base())
            .set(!p.suspects.is_empty() as i64);
        step.get_or_create(&base()).set(p.step as i64);
        exited.get_or_create(&base()).set(p.exited.is_some() as i64);
        allocations.get_or_create(&base()).inc_by(p.allocations);
        frees.get_or_create(&base()).inc_by(p.frees);
    }
    drop(procs);
    let mut text = String::new();
    encode(&mut text, &reg).expect("writing to a String cannot fail");
    match format {
        Format::OpenMetrics => text,
        Format::Text => to_text_format(&text),
    }
}

/// The 0.0.4 text format of an OpenMetrics exposition: it has no `# UNIT` or `# EOF`, and a
/// counter's metadata names its sample (`memscope_frees_total`), which is all it has. Label
/// values and help texts escape alike in both.
fn to_text_format(open_metrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = open_metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open_metrics.len());
    for line in open_metrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| Some((p, line.strip_prefix(p)?)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(prefix);
                out.push_str(name);
                if counters.contains(name) {
                    out.push_str("_total");
                }
                out.push(' ');
                out.push_str(tail);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What scrapers send: Prometheus 2.x's `scrapeAcceptHeader` (copied by tools that scrape
    /// like it), Prometheus configured for the text format only, curl, a browser.
    #[test]
    fn accept_headers_pick_the_format() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                          version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        let old_prometheus =
            "application/openmetrics-text; version=0.0.1,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(old_prometheus)), Format::OpenMetrics);
        let text_only = "text/plain;version=0.0.4;q=1,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(text_only)), Format::Text);
        assert_eq!(Format::negotiate(Some("*/*")), Format::Text);
        assert_eq!(Format::negotiate(None), Format::Text);
        let browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
        assert_eq!(Format::negotiate(Some(browser)), Format::Text);
        // Quality beats order; q=0 is "not this"; a version we do not write is not taken.
        let prefers_text = "application/openmetrics-text;q=0.2, text/plain;q=0.9";
        assert_eq!(Format::negotiate(Some(prefers_text)), Format::Text);
        let refuses = "application/openmetrics-text;q=0";
        assert_eq!(Format::negotiate(Some(refuses)), Format::Text);
        let future = "application/openmetrics-text;version=2.0.0";
        assert_eq!(Format::negotiate(Some(future)), Format::Text);
        assert_eq!(
            Format::negotiate(Some("Application/OpenMetrics-Text")),
            Format::OpenMetrics
        );
    }

    #[test]
    fn the_text_format_names_counters_by_their_sample() {
        let om = "# HELP a_bytes Live.\n# TYPE a_bytes gauge\n# UNIT a_bytes bytes\na_bytes{pid=\"1\"} 5\n\
                  # HELP b Calls.\n# TYPE b counter\nb_total{pid=\"1\"} 7\n# EOF\n";
        assert_eq!(
            to_text_format(om),
            "# HELP a_bytes Live.\n# TYPE a_bytes gauge\na_bytes{pid=\"1\"} 5\n\
             # HELP b_total Calls.\n# TYPE b_total counter\nb_total{pid=\"1\"} 7\n"
        );
    }
}
