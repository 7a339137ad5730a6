//! `memscope-bpf agent`: the always-on node agent.
//!
//! One agent per node traces every process that maps a probed library (CANN, torch_npu,
//! MindSpore, CUDA), those running when it starts and those started later, and serves what it
//! knows over HTTP:
//!
//! * discovery: every process on the host joins the BPF traced set (existing ones now, new
//!   ones through the fork tracepoint), so exec and shared-object opens of every process reach
//!   the planner, and the probes are system-wide (`Scope::AllProcesses`): a library gets its
//!   uprobes once, by inode, and fires in every process that maps it. A process is *picked
//!   up* at its first call into a probed library; processes that never call one cost an
//!   uprobe-free exec/open event and nothing else.
//! * state: the session (`session/`) and the per-process state (`state/`) do the work
//!   as for a single run; the agent is a session [`Observer`](crate::session::Observer)
//!   (`state.rs`) that writes no files and keeps a bounded summary per process.
//! * sampling (`sampling.rs`): stacks are copied (in BPF) and resolved for a byte-weighted
//!   Poisson sample of allocations only; counters are exact.
//! * containers (`cgroup.rs`): each process's container and pod, read from its cgroup path
//!   once when it is picked up, label its series and its profile samples.
//! * endpoints (`http.rs`): `/metrics` (`metrics.rs`, via prometheus-client: OpenMetrics when
//!   the `Accept` header asks for it, else the 0.0.4 text format), `/ready`,
//!   `/debug/pprof/heap` (`pprof.rs`, gzipped profile.proto).
//!
//! * the hold (`trace::hold`, `--hold`): a process that opens a vendor library not yet
//!   probed for it is stopped at that open until the file's probes are in place, so no job's
//!   first allocation is missed; a watchdog (`trace::watchdog`, given the `HELD` map)
//!   continues held processes if the agent freezes or dies. Off by default (it would release
//!   early a process that a launch or `--pid` session holds at the same open); then no
//!   process is ever stopped or signalled (`stop_on_discovery` stays off).
//!
//! A second front end beside `main`: uses `session`, `trace`, `events`, `state`, `analysis`
//! (sites), `output`, `settings` and `log` (its options are parsed by `cli`, which it never
//! uses back); nothing uses it but `main` and `cli` (its subcommand).

pub mod cgroup;
pub mod http;
pub mod metrics;
pub mod options;
pub mod pprof;
pub mod sampling;
pub mod state;

use std::{process::ExitCode, sync::Arc};

use anyhow::{Context, Result, bail};

use crate::{
    log,
    session::{Session, SessionConfig},
    settings::{DeviceFilter, EventSet},
    state::{StepFilter, TrackOptions},
    trace::attach::Planner,
    trace::bpf::{self, Scope},
    trace::{hold, tracefs, watchdog::Watchdog},
};

use options::AgentOptions;
use state::{AgentObserver, Shared};

/// Entry point for `memscope-bpf agent ARGS...`, once `cli` has parsed them.
pub fn main(opts: AgentOptions) -> ExitCode {
    log::set_level(opts.log_level);
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::line(&format!("memscope-bpf: error: {e:#}"));
            ExitCode::from(1)
        }
    }
}

/// Raises the soft limit on open files to the hard one: the agent pins the mapped files of
/// the processes it resolves stacks for, and under systemd's default soft limit (1,024) a
/// busy node runs out (the unit sets `LimitNOFILE` too).
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            let before = lim.rlim_cur;
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                log::debug(&format!(
                    "open-file limit raised from {before} to {}",
                    lim.rlim_max
                ));
            }
        }
    }
}

/// Every process id in /proc.
fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn run(opts: &AgentOptions) -> Result<()> {
    // Bind first: a busy or bad address is the most likely mistake and costs nothing to find.
    let listener = std::net::TcpListener::bind(opts.listen)
        .with_context(|| format!("cannot listen on {}", opts.listen))?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the agent needs root (CAP_BPF and CAP_PERFMON) to load BPF programs");
    }
    let shared = Arc::new(Shared {
        memory_snapshots: opts.memory_snapshot.then(Default::default),
        ..Shared::default()
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    raise_fd_limit();
    // Before the server's thread: the watchdog is forked while we have one thread.
    let loaded = load(opts)?;
    let hosts = http::AllowedHosts::new(&opts.allow_hosts);
    let server = http::serve(listener, shared.clone(), opts.sample_bytes, hosts, stop_rx);
    log::info(&format!(
        "serving /metrics, /ready and /debug/pprof/heap on http://{}",
        opts.listen
    ));

    let (bpf, ring, watchdog) = loaded;
    let result = trace(opts, &shared, bpf, ring);
    let _ = stop_tx.send(true);
    // The listener closes with the server's thread: before the detacher below is forked,
    // or that child would hold the port for its lifetime (a `systemctl restart` then fails
    // with "Address already in use").
    let _ = server.join();
    let result = result.inspect(|bpf| {
        // Whatever the drain left held (nothing, normally) goes on before we leave.
        if bpf.holds.is_some() {
            bpf.holders.registry.release_own(|_| true);
        }
    });
    if let Some(w) = watchdog {
        if result.is_ok() {
            w.disarm();
        } else {
            // Dropped without disarming: it continues anything still held while we exit.
            drop(w);
        }
    }
    let bpf = result?;
    // As for a single run (main.rs): benchmarks need the probes gone when the agent exits.
    if std::env::var("MEMSCOPE_BPF_DETACH").as_deref() == Ok("foreground") {
        drop(bpf);
    } else {
        bpf.detach_in_background();
    }
    Ok(())
}

type Loaded = (
    bpf::Bpf,
    aya::maps::RingBuf<aya::maps::MapData>,
    Option<Watchdog>,
);

/// Loads the BPF side, with the hold at vendor library opens and its watchdog unless
/// `--no-hold`.
fn load(opts: &AgentOptions) -> Result<Loaded> {
    let tracefs = tracefs::ensure_mounted()?;
    let mut offsets = tracefs::read_offsets(tracefs)?;
    // No stop at exec or at other opens: the agent watches jobs it did not start.
    offsets.stop_on_discovery = 0;
    let hold = opts.holds() && can_continue_anyone();
    offsets.hold_vendor_opens = hold as u32;
    offsets.capture_stacks = if opts.stack_depth > 0 { 2 } else { 0 };
    // Python frames come with the C stacks of the same sampled calls (mixed view).
    offsets.python_stacks =
        python_depth(opts).map_or(0, |d| d.min(probe_common::PY_MAX_FRAMES) as u32);
    let (mut bpf, ring) = bpf::Bpf::load(&offsets, opts.ring_buffer_mib << 20)?;
    let mut watchdog = None;
    if hold {
        let holds = hold::Holds::new(&mut bpf)?;
        watchdog = Some(Watchdog::start_for_holds(&bpf.holders)?);
        bpf.holds = Some(holds);
    }
    Ok((bpf, ring, watchdog))
}

/// Whether we may send SIGCONT to any process (CAP_KILL: root without it cannot signal
/// another user's job outside its session, e.g. under a systemd unit's capability list). A
/// hold we could not end would leave the job stopped for good, so without it none is taken.
fn can_continue_anyone() -> bool {
    const CAP_KILL: u32 = 5;
    let effective = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))?
                .trim()
                .to_string();
            u64::from_str_radix(&hex, 16).ok()
        });
    match effective {
        Some(caps) if caps & (1 << CAP_KILL) != 0 => true,
        _ => {
            log::warn(
                "no CAP_KILL: the agent could not continue another user's process, so it \
                 holds none at a vendor library's open (their first calls may be missed); \
                 give it CAP_KILL (deploy/memscope-bpf-agent.service does)",
            );
            false
        }
    }
}

fn python_depth(opts: &AgentOptions) -> Option<usize> {
    (opts.python_depth > 0 && opts.stack_depth > 0).then_some(opts.python_depth)
}

/// Traces until a signal; returns the BPF side, still attached, for the caller to release.
fn trace(
    opts: &AgentOptions,
    shared: &Arc<Shared>,
    mut bpf: bpf::Bpf,
    ring: aya::maps::RingBuf<aya::maps::MapData>,
) -> Result<bpf::Bpf> {
    let stack_depth = (opts.stack_depth > 0).then_some(opts.stack_depth);
    let python_depth = python_depth(opts);
    if stack_depth.is_some() {
        bpf.stacks_for_allocations(opts.sample_bytes)?;
    }
    let mut planner = Planner::new(opts.libs.clone());
    planner.scope = Scope::AllProcesses;
    planner.remember_searches = true;
    // The agent writes no OP_LAUNCH rows.
    planner.trace_ops = false;
    planner.attach_explicit(&mut bpf)?;

    // Every process joins the traced set; the fork tracepoint adds their future children.
    // Two passes: a process forked by a not-yet-added parent during the first is in the second.
    let me = std::process::id();
    for _ in 0..2 {
        for pid in all_pids().into_iter().filter(|p| *p != me) {
            let _ = bpf.trace_process(pid);
        }
    }
    let mut mapping = 0;
    for pid in all_pids().into_iter().filter(|p| *p != me) {
        let before = planner.attached.len();
        planner.scan_maps(&mut bpf, pid, &mut Vec::new())?;
        mapping += (planner.attached.len() > before) as usize;
    }
    for w in planner.warnings.drain(..) {
        log::warn(&w);
    }
    for a in &planner.attached {
        log::info(&format!(
            "probing {} ({} function(s))",
            a.path.display(),
            a.symbols.len()
        ));
    }
    log::info(&format!(
        "watching {} process(es); {} probed librar(y/ies) so far ({mapping} found mapped); \
         new processes and libraries are picked up as they appear",
        bpf.traced_processes().len(),
        planner.attached.len()
    ));
    // Holds start now, with the session about to drain the ring (the opens until now are
    // planned as before holds existed), and before /ready says so.
    if let Some(holds) = &mut bpf.holds {
        holds.hold_at(&hold::vendor_names(&opts.libs))?;
    }
    shared
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);

    let observer = AgentObserver::new(shared.clone(), opts);
    let cfg = SessionConfig {
        output_dir: std::env::temp_dir(),
        config_json: String::new(),
        driver_before: None,
        format: crate::settings::DataFormat::Csv,
        track: TrackOptions {
            dump: EventSet {
                alloc: true,
                free: true,
                launch: false,
                access: false,
            },
            devices: DeviceFilter {
                all_npu: true,
                npu_mask: 0,
                cpu: true,
            },
            steps: StepFilter::new(&[]),
            // The per-step analyses keep per-step history: not for an unbounded run.
            step_analyses: false,
            oom_top_k: None,
            decompose: false,
            inefficient: false,
            write_op_launch: false,
            write_kernel_launch: false,
            // The observer reads `Row::size`; no file is written.
            row_attrs: false,
        },
        leaks: false,
        child: None,
        stack_depth,
        python: python_depth.map(crate::events::pystacks::PyStacks::new),
        mixed: python_depth.is_some(),
        rotate: None,
        observer: Some(Box::new(observer)),
        snapshot: false,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(Session::new(bpf, planner, cfg).run(ring))?;
    let c = result.counters;
    shared
        .events
        .store(result.events, std::sync::atomic::Ordering::Relaxed);
    log::info(&format!(
        "stopped: {} events, {} lost; agent CPU {:.2} s",
        result.events,
        c.lost_events(),
        metrics::self_cpu_seconds()
    ));
    if let Some(path) = &opts.heap_profile_out {
        let procs = shared.processes.lock().unwrap_or_else(|e| e.into_inner());
        let profile = pprof::heap_profile(procs.values(), opts.sample_bytes);
        std::fs::write(path, profile)
            .with_context(|| format!("cannot write the heap profile {}", path.display()))?;
        log::info(&format!("heap profile written to {}", path.display()));
    }
    Ok(result.bpf)
}
