//! The `memscope-bpf` command: parse options, start or find the target, attach, run the
//! session, print the summary. The work is done by the library (`src/lib.rs`).

use std::{ffi::OsString, path::PathBuf, process::ExitCode};

use anyhow::{Context, Result, bail};

use memscope_bpf::{
    cli,
    cli::{Mode, Options},
    log, offline, output, report, session,
    session::{EndReason, Session, SessionConfig},
    settings::DataFormat,
    state::{StepFilter, TrackOptions},
    trace::attach,
    trace::attach::{Planner, TargetEnv},
    trace::bpf,
    trace::launch,
    trace::tracefs,
};

/// Exit code for a usage error (bad option, missing pid or program, bad output directory).
const EXIT_USAGE: u8 = 2;
/// Exit code when tracing itself could not start (not root, BPF load failure).
const EXIT_FAILURE: u8 = 1;

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let opts = match cli::parse_from(argv) {
        Ok(o) => o,
        Err(e) if e.exit_code == 0 => {
            log::stdout_line(&e.message);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            log::line(&format!("memscope-bpf: {}", e.message));
            return ExitCode::from(e.exit_code.clamp(1, 255) as u8);
        }
    };
    if let Mode::Agent(agent) = opts.mode {
        return memscope_bpf::agent::main(agent);
    }
    log::set_level(opts.log_level);
    for w in &opts.warnings {
        log::warn(w);
    }
    match run(opts) {
        Ok(code) => ExitCode::from(code),
        // `analyze --by-site | head`: the reader had what it wanted; nothing failed.
        Err(e) if reader_went_away(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let usage = e.downcast_ref::<UsageError>().is_some();
            log::line(&format!("memscope-bpf: error: {e:#}"));
            ExitCode::from(if usage { EXIT_USAGE } else { EXIT_FAILURE })
        }
    }
}

/// Whether `e` is a write to stdout whose reader closed the pipe.
fn reader_went_away(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The tracer's own CPU time so far (user + system, every thread; not its children).
fn own_cpu_seconds() -> f64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    let u = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr());
        u.assume_init()
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// An error in what the user asked for (as opposed to a failure of the machine).
#[derive(Debug)]
struct UsageError(String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

fn run(opts: Options) -> Result<u8> {
    match &opts.mode {
        Mode::Compare { inputs } => {
            return run_offline(&opts, |o| {
                offline::compare::run(&o.offline(), inputs)?;
                Ok(())
            });
        }
        Mode::Analyze { input } => {
            return run_offline(&opts, |o| {
                offline::analyze::run(&o.offline(), input)?;
                if o.sites != report::SitesRequest::default() {
                    report::analyze(input, &o.sites, &o.output_dir)?;
                }
                Ok(())
            });
        }
        Mode::Report { request } => {
            report::run(request).map_err(|e| match e.downcast_ref::<offline::InputError>() {
                Some(ie) => usage(ie.to_string()),
                None => e,
            })?;
            return Ok(0);
        }
        _ => {}
    }
    for (given, what) in [(opts.watch.is_some(), "--watch")] {
        if given {
            log::warn(&format!(
                "{what} is accepted for compatibility but not implemented yet; ignored"
            ));
        }
    }

    // Resolve what to run before anything irreversible happens.
    let launch = match &opts.mode {
        Mode::Launch { program, args } => {
            let resolved = attach::find_program(program)
                .map(|p| p.canonicalize().unwrap_or(p))
                .ok_or_else(|| {
                    usage(format!(
                        "program not found or not executable: {}",
                        program.to_string_lossy()
                    ))
                })?;
            memscope_bpf::trace::target::check_executable(&resolved).map_err(usage)?;
            let mut argv: Vec<OsString> = vec![program.clone()];
            argv.extend(args.iter().cloned());
            Some((resolved, argv))
        }
        _ => None,
    };
    // `--pid` of a thread means its process; pid 1 and kernel threads are refused.
    let attach_pid = match &opts.mode {
        Mode::Attach { pid } => {
            let (pid, note) = memscope_bpf::trace::target::attach_pid(*pid).map_err(usage)?;
            if let Some(note) = note {
                log::warn(&note);
            }
            Some(pid)
        }
        _ => None,
    };
    // Under sudo the program runs as the user who ran it, and the results are theirs.
    let run_as = match &opts.mode {
        Mode::Launch { .. } if !opts.as_root => {
            launch::Credentials::sudo_user().map_err(|e| usage(format!("{e:#}")))?
        }
        _ => None,
    };
    if let Some(c) = &run_as {
        output::fsutil::give_results_to(c.uid, c.gid);
        log::info(&format!(
            "running the program as {} (uid {}, gid {}; --as-root keeps root)",
            c.user, c.uid, c.gid
        ));
    }
    let made_dirs = output::fsutil::MadeDirs::before_making(&opts.output_dir);
    output::fsutil::check_writable(&opts.output_dir)
        .map_err(|e| usage(format!("invalid output directory: {e:#}")))?;

    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "memscope-bpf needs root (CAP_BPF and CAP_PERFMON) to load BPF programs; run it with sudo"
        );
    }
    let tracefs = tracefs::ensure_mounted()?;
    let mut offsets = tracefs::read_offsets(tracefs)?;
    // Launch mode may hold the target at exec and at the open of an unplanned shared object
    // until it has probes; attach mode never signals the target.
    offsets.stop_on_discovery = matches!(opts.mode, Mode::Launch { .. }) as u32;
    let stack_depth = opts
        .call_stack
        .c_depth
        .filter(|d| *d > 0)
        .map(|d| d as usize);
    // Both the frame-pointer walk and a stack copy (CFI); `MEMSCOPE_BPF_STACK_MODE=fp` keeps
    // only the walk (benchmarks compare the two).
    offsets.capture_stacks = match (
        stack_depth,
        std::env::var("MEMSCOPE_BPF_STACK_MODE").as_deref(),
    ) {
        (None, _) => 0,
        (Some(_), Ok("fp")) => 1,
        // For the benchmark: the 8 KiB copy of before, not reaching the interpreter loop.
        (Some(_), Ok("copy-8k")) => 3,
        (Some(_), _) => 2,
    };
    let python_depth = opts
        .call_stack
        .python_depth
        .filter(|d| *d > 0)
        .map(|d| d as usize);
    // BPF reads no frame past the depth asked for.
    offsets.python_stacks = python_depth.map_or(0, |d| d.min(probe_common::PY_MAX_FRAMES) as u32);
    let mut python = python_depth.map(|depth| {
        let mut py = memscope_bpf::events::pystacks::PyStacks::new(depth);
        py.allocations_only = opts.call_stack.allocations_only;
        py
    });
    let (mut bpf, ring) = bpf::Bpf::load(&offsets, opts.ring_buffer_mib.saturating_mul(1 << 20))?;
    if opts.call_stack.allocations_only {
        // The default line: walked at each allocation, not at frees or other calls.
        bpf.stacks_for_allocations(0)?;
    }
    // Launch mode stops processes that only we continue: a watchdog continues them if we die
    // or freeze (src/trace/watchdog.rs).
    let watchdog = match opts.mode {
        Mode::Launch { .. } => Some(memscope_bpf::trace::watchdog::Watchdog::start(
            bpf.traced_map_fd(),
            &bpf.holders,
        )?),
        _ => None,
    };
    let mut planner = Planner::new(opts.libs.clone());
    // Held at exit(), a process's stacks can still be resolved (its mappings, the code objects
    // of Python samples still on their way).
    planner.hold_at_exit = stack_depth.is_some() && matches!(opts.mode, Mode::Launch { .. });
    planner.hold_at_python_exit =
        python_depth.is_some() && matches!(opts.mode, Mode::Launch { .. });
    planner.scope = bpf::probe_scope();
    planner.trace_ops = opts.dump_events.launch && opts.levels.op;
    if planner.scope == bpf::Scope::Traced && matches!(opts.mode, Mode::Launch { .. }) {
        // Each new process gets its own probes; hold it until they are in place.
        bpf.hold_children();
    }

    // MindSpore's device memory taken before a `--pid` attach (`trace/mindspore.rs`).
    let mut driver_before = None;
    let child = match (&opts.mode, launch) {
        (Mode::Launch { .. }, Some((program, argv))) => {
            launch::become_subreaper();
            let gated = launch::spawn_gated_as(&program, &argv, run_as.as_ref())?;
            let pid = gated.pid;
            let setup = (|| -> Result<()> {
                bpf.trace_process(pid)?;
                // Every process reads this when it starts; it is not a library.
                bpf.mark_known_path(b"/etc/ld.so.cache");
                let env = TargetEnv::current();
                planner.plan_launch(&mut bpf, &program, &env)?;
                if let Some(interp) = attach::script_interpreter(&program) {
                    planner.plan_launch(&mut bpf, &interp, &env)?;
                }
                Ok(())
            })();
            if let Err(e) = setup {
                gated.abort();
                return Err(e);
            }
            report_plan(&mut planner);
            log::info(&format!("tracing {} (pid {pid})", program.display()));
            gated.release()?;
            Some(pid)
        }
        (Mode::Attach { .. }, _) => {
            let pid = attach_pid.expect("resolved above");
            bpf.trace_process(pid)?;
            planner
                .plan_process(&mut bpf, pid)
                .with_context(|| format!("cannot plan probes for pid {pid}"))?;
            report_plan(&mut planner);
            match memscope_bpf::trace::mindspore::before_attach(pid) {
                Ok(before) => driver_before = before.map(|b| (pid, b)),
                Err(why) => log::warn(&format!(
                    "MindSpore's device memory taken before the attach is not counted in total: {why}"
                )),
            }
            // Its interpreter is there already: Python stacks from the first call on.
            if let Some(py) = &mut python {
                py.enable(&mut bpf, pid, true);
            }
            if !memscope_bpf::trace::target::process_alive(pid) {
                return Err(usage(format!(
                    "process {pid} exited before tracing started"
                )));
            }
            log::info(&format!(
                "attached to pid {pid}; Ctrl-C detaches and writes the results"
            ));
            None
        }
        _ => unreachable!("compare and analyze handled above"),
    };
    made_dirs.keep();

    let cfg = SessionConfig {
        output_dir: opts.output_dir.clone(),
        config_json: memscope_bpf::output::config_json::config_json(&opts.recorded()),
        format: opts.format,
        track: TrackOptions {
            dump: opts.dump_events,
            devices: opts.devices,
            steps: StepFilter::new(&opts.steps),
            step_analyses: opts.analysis.leaks && opts.steps.is_empty(),
            oom_top_k: opts.analysis.oom_top_k,
            decompose: opts.analysis.decompose,
            inefficient: opts.analysis.inefficient,
            write_op_launch: opts.dump_events.launch && opts.levels.op,
            write_kernel_launch: opts.dump_events.launch && opts.levels.kernel,
            row_attrs: true,
        },
        leaks: opts.analysis.leaks,
        driver_before,
        child,
        stack_depth,
        python,
        mixed: opts.call_stack.mixed,
        rotate: opts
            .max_file_mib
            .map(|m| (u64::from(m) << 20, opts.max_files)),
        observer: None,
        snapshot: opts.memory_snapshot,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(Session::new(bpf, planner, cfg).run(ring))?;
    // Everything traced has been continued: the watchdog can go.
    if let Some(w) = watchdog {
        w.disarm();
    }

    print_summary(&result, &opts.output_dir, opts.analysis.oom_top_k.is_some());
    if let Some(file) = &opts.report_at_end {
        write_report_at_end(&result, file.as_deref());
    }
    for (name, runs, ns) in result.bpf.program_stats() {
        log::info(&format!(
            "bpf program {name}: {runs} runs, {:.0} ns per run",
            ns as f64 / runs as f64
        ));
    }
    let mut code = match result.end {
        EndReason::Signal(sig) => 128 + sig as u8,
        EndReason::TargetExited => result.child_status.unwrap_or(0).clamp(0, 255) as u8,
    };
    // The target's own failure says more; otherwise lost output must not look like success.
    let loss = &result.write_loss;
    if code == 0 && loss.anything_lost() {
        code = EXIT_FAILURE;
    }
    // Everything is written: let a background process pay for unregistering the uprobes
    // (the probes keep firing, filtered out, until it is done). Benchmarks need them gone when
    // the tracer exits: MEMSCOPE_BPF_DETACH=foreground waits for the teardown.
    if std::env::var("MEMSCOPE_BPF_DETACH").as_deref() == Ok("foreground") {
        drop(result.bpf);
    } else {
        result.bpf.detach_in_background();
    }
    Ok(code)
}

/// `--compare` and `analyze`: no tracing, no root. A bad input (unreadable, malformed) is a
/// usage error (exit 2) naming the file and line.
fn run_offline(opts: &Options, work: impl FnOnce(&Options) -> Result<()>) -> Result<u8> {
    if opts.format == DataFormat::Db {
        log::debug("--format applies to tracing only; the offline output is CSV");
    }
    output::fsutil::check_writable(&opts.output_dir)
        .map_err(|e| usage(format!("invalid output directory: {e:#}")))?;
    work(opts).map_err(|e| match e.downcast_ref::<offline::InputError>() {
        Some(ie) => usage(ie.to_string()),
        None => e,
    })?;
    Ok(0)
}

/// `--report[=FILE]`: the HTML report of every process traced, in the first process's
/// directory unless FILE is given. A failure is a warning: the trace itself is written.
fn write_report_at_end(r: &session::SessionResult, file: Option<&std::path::Path>) {
    let dirs: Vec<&PathBuf> = r
        .processes
        .iter()
        .filter(|(_, _, rows, _)| *rows > 0)
        .map(|(_, _, _, dir)| dir)
        .collect();
    let Some(first) = dirs.first() else {
        log::warn("--report: no rows were written, so there is nothing to draw");
        return;
    };
    let out = file.map_or_else(|| first.join("report.html"), std::path::Path::to_path_buf);
    let result = (|| -> Result<u64> {
        let mut b = report::model::Builder::new();
        for d in &dirs {
            for f in report::model::dump_files(d)? {
                b.read_file(&f)?;
            }
        }
        let model = b.finish(report::model::DEFAULT_TIMELINE_MS);
        let names: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        report::html::write(&model, &names, None, &out)
    })();
    match result {
        Ok(size) => log::info(&format!(
            "report: {} ({:.1} MiB)",
            out.display(),
            size as f64 / (1 << 20) as f64
        )),
        Err(e) => log::warn(&format!(
            "--report: could not write {}: {e:#}",
            out.display()
        )),
    }
}

fn report_plan(planner: &mut Planner) {
    for w in planner.warnings.drain(..) {
        log::warn(&w);
    }
    for d in planner.debug.drain(..) {
        log::debug(&d);
    }
    if planner.attached.is_empty() {
        log::warn(
            "no probed library found yet; probes are added when the target loads one (or use --lib)",
        );
    }
    for a in &planner.attached {
        log::debug(&format!("{}: {}", a.path.display(), a.symbols.join(", ")));
    }
}

fn print_summary(r: &session::SessionResult, output_dir: &std::path::Path, oom_analysis: bool) {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for (pid, stats, rows, dir) in &r.processes {
        log::info(&format!(
            "pid {pid}: {rows} rows; {} malloc, {} free, {} create, {} release, {} mark, {} range",
            stats.mallocs, stats.frees, stats.creates, stats.releases, stats.marks, stats.ranges
        ));
        if stats.pool_mallocs + stats.ops + stats.launches + stats.atb_kernels + stats.accesses > 0
        {
            let mut line = format!(
                "pid {pid}: {} pool malloc, {} pool free, {} operator, {} kernel launch, {} ATB kernel, {} access",
                stats.pool_mallocs,
                stats.pool_frees,
                stats.ops,
                stats.launches,
                stats.atb_kernels,
                stats.accesses
            );
            if stats.nested_launches > 0 {
                line.push_str(&format!(
                    " ({} runtime launch(es) inside aclrt* launches counted once)",
                    stats.nested_launches
                ));
            }
            log::info(&line);
        }
        if stats.unmatched_accesses > 0 {
            log::info(&format!(
                "pid {pid}: {} access(es) to addresses in no known pool block (not written as rows)",
                stats.unmatched_accesses
            ));
        }
        if stats.unmatched_frees > 0 {
            log::warn(&format!(
                "pid {pid}: {} free(s) of addresses never seen allocated (allocated before tracing started?)",
                stats.unmatched_frees
            ));
        }
        if stats.failed_allocs > 0 || stats.failed_frees > 0 {
            log::info(&format!(
                "pid {pid}: {} failed allocation(s), {} failed free(s) (not written as rows)",
                stats.failed_allocs, stats.failed_frees
            ));
        }
        if stats.filtered > 0 {
            log::info(&format!(
                "pid {pid}: {} event(s) on devices --device leaves out (pinned host memory is \
                 device cpu: --device=npu,cpu)",
                stats.filtered
            ));
        }
        if stats.ooms > 0 {
            log::warn(&format!(
                "pid {pid}: {} allocation(s) failed for lack of device memory (OOM_DETAIL rows{})",
                stats.ooms,
                if oom_analysis {
                    " in the dump"
                } else {
                    "; --analysis=oom reports the live blocks"
                }
            ));
        }
        if stats.double_mallocs > 0 {
            log::warn(&format!(
                "pid {pid}: {} allocation(s) returned an address still live (a free was missed)",
                stats.double_mallocs
            ));
        }
        if *rows > 0 {
            dirs.push(dir.clone());
        }
    }
    if !r.leaks.is_empty() {
        for line in output::leaks::format_report(&r.leaks, 20).lines() {
            log::info(line);
        }
    }
    for p in r.leaks.iter().filter(|p| !p.pool_report.is_empty()) {
        log::info(&format!("pid {}: framework memory pools", p.pid));
        for line in p.pool_report.lines() {
            log::info(line);
        }
    }
    let c = r.counters;
    if c.lost_events() > 0 {
        log::warn(&format!(
            "{} event(s) lost: {} ring buffer full, {} calls in flight overflow, {} batch regions",
            c.lost_events(),
            c.ringbuf_full,
            c.pending_full,
            c.batch_dropped
        ));
    } else if r.write_loss.rows_lost == 0 {
        log::info(&format!("{} events, none lost", r.events));
    }
    let loss = &r.write_loss;
    if loss.rows_lost > 0 {
        log::error(&format!(
            "{} events, but {} row(s) could not be written ({} failed write(s); first: {}); \
             the files hold every other row, each whole",
            r.events,
            loss.rows_lost,
            loss.failed_writes,
            loss.first_error.as_deref().unwrap_or("?")
        ));
    }
    if loss.reports_lost > 0 {
        log::error(&format!(
            "{} report file(s) could not be written (see above)",
            loss.reports_lost
        ));
    }
    if loss.rows_lost == 0 && loss.failed_writes > loss.reports_lost {
        log::warn(&format!(
            "{} write(s) failed ({}) but were retried: every row is in the files",
            loss.failed_writes,
            loss.first_error.as_deref().unwrap_or("?")
        ));
    }
    let late =
        memscope_bpf::events::decode::STRINGS_READ_LATE.load(std::sync::atomic::Ordering::Relaxed);
    let unread =
        memscope_bpf::events::decode::STRINGS_UNREAD.load(std::sync::atomic::Ordering::Relaxed);
    if late > 0 {
        log::debug(&format!(
            "{late} mstx message(s) in pages the target had not touched yet, read from /proc/PID/mem"
        ));
    }
    if unread > 0 {
        log::warn(&format!(
            "{unread} mstx message(s) could not be read (written with an empty name)"
        ));
    }
    let copies =
        memscope_bpf::events::stacks::STACK_COPIES.load(std::sync::atomic::Ordering::Relaxed);
    let copied =
        memscope_bpf::events::stacks::STACK_COPY_BYTES.load(std::sync::atomic::Ordering::Relaxed);
    if let Some(each) = copied.checked_div(copies) {
        log::info(&format!(
            "{copies} call stack(s) copied for unwinding, {} each on average (tracer CPU {:.2} s)",
            memscope_bpf::output::leaks::human_bytes(each),
            own_cpu_seconds()
        ));
    }
    if c.stacks_shed > 0 {
        log::warn(&format!(
            "{} call stack(s) taken without a copy of the stack (the ring buffer was over half \
             full): frame-pointer frames only; a larger --ring-buffer-mib keeps more",
            c.stacks_shed
        ));
    }
    if dirs.is_empty() {
        log::info(&format!(
            "no memory events recorded; nothing written under {}",
            output_dir.display()
        ));
    } else {
        for d in dirs {
            log::info(&format!("results: {}", d.display()));
        }
    }
}
