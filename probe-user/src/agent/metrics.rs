//! `/metrics`: the agent's state in the OpenMetrics text format (which Prometheus scrapes),
//! encoded by the `prometheus-client` crate from a registry built afresh for each scrape.
//!
//! Labels are bounded: `pid`, `comm`, `device` and `owner` only (a process appears while it
//! lives and for `--keep-exited` after; owners are the decompose owners). Stacks never become
//! label values; they are in the pprof endpoint.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::state::Shared;

/// The Content-Type of the exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(&'static str, String)>;

fn gauge_family(reg: &mut Registry, name: &str, help: &str) -> Family<Labels, Gauge> {
    let f = Family::<Labels, Gauge>::default();
    reg.register(name, help, f.clone());
    f
}

fn counter_family(reg: &mut Registry, name: &str, help: &str) -> Family<Labels, Counter> {
    let f = Family::<Labels, Counter>::default();
    reg.register(name, help, f.clone());
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

/// Renders the exposition.
pub fn render(shared: &Arc<Shared>) -> String {
    let mut reg = Registry::default();
    let live_bytes = gauge_family(
        &mut reg,
        "memscope_live_bytes",
        "Bytes live now (at exit for an exited process) by device and owner (CANN@<module> for \
         driver memory, PTA, PTA_WORKSPACE, MINDSPORE, ATB for framework pool regions; the two \
         layers overlap)",
    );
    let live_blocks = gauge_family(
        &mut reg,
        "memscope_live_blocks",
        "Blocks live now by device and owner",
    );
    let peak = gauge_family(
        &mut reg,
        "memscope_peak_bytes",
        "Highest total live bytes of the device after any one event",
    );
    let suspect_bytes = gauge_family(
        &mut reg,
        "memscope_leak_suspect_bytes",
        "Bytes of blocks still live --leak-steps steps after the step they were allocated in",
    );
    let suspect_blocks = gauge_family(
        &mut reg,
        "memscope_leak_suspect_blocks",
        "Blocks still live --leak-steps steps after the step they were allocated in",
    );
    let leaking = gauge_family(
        &mut reg,
        "memscope_leak_suspected",
        "1 when the process has leak suspects",
    );
    let step = gauge_family(
        &mut reg,
        "memscope_step",
        "The current mstx step (0 before the first)",
    );
    let exited = gauge_family(
        &mut reg,
        "memscope_process_exited",
        "1 once the process has exited (its numbers are final)",
    );
    let allocations = counter_family(
        &mut reg,
        "memscope_allocations",
        "Successful allocations (driver blocks, handles, pool regions)",
    );
    let frees = counter_family(
        &mut reg,
        "memscope_frees",
        "Successful frees (driver blocks, handles, pool regions)",
    );
    let allocated = counter_family(
        &mut reg,
        "memscope_allocated_bytes",
        "Bytes allocated, by device",
    );
    let cpu = Counter::<f64, AtomicU64>::default();
    reg.register(
        "memscope_agent_cpu_seconds",
        "CPU time the agent itself has used (user + system)",
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
        let base = || -> Labels { vec![("pid", p.pid.to_string()), ("comm", p.comm.clone())] };
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
    text
}
