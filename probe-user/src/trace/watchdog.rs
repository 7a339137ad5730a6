//! A watchdog that outlives the tracer, so no traced process stays stopped.
//!
//! In launch mode the BPF side stops a process (SIGSTOP) at exec and when it opens an
//! unplanned shared object, and only the tracer continues it. A tracer killed with SIGKILL, or
//! frozen (SIGSTOP, a debugger), would leave that process, and whoever waits for it, stopped
//! forever. The watchdog is a small forked process that holds nothing but a pipe from the
//! tracer and a descriptor of the traced-process map (`TRACED`, which thereby outlives the
//! tracer too); every other descriptor, the BPF programs' links included, is closed, so the
//! programs still go away with the tracer.
//!
//! - The tracer ends normally: it writes one byte, and the watchdog exits at once.
//! - The pipe closes without that byte (the tracer died): for [`AFTER_DEATH`] (while the
//!   programs detach) every traced process that is stopped is continued, then it exits.
//! - The tracer is stopped for more than [`FROZEN_AFTER`]: every traced process that is
//!   stopped is continued, for as long as the tracer stays stopped (their calls are traced
//!   again once it runs; libraries opened meanwhile may have had no probes yet).
//!
//! Every tracer also gives it the registry of holds at opens that tracers share
//! (`holders.rs`): the watchdog releases the tracer's own entries there (a process is
//! continued only if no other live tracer holds it, as the tracer itself would), so the
//! tracer, running again, knows it need not continue that process. A launch session's
//! watchdog continues the rest of its stopped traced set too, but not a process another live
//! tracer holds. The node agent's (`Watchdog::start_for_holds`) continues nothing else: no
//! other process on the host (the agent traces them all) is ever continued by it.
//!
//! It ignores SIGINT/SIGTERM/SIGHUP (a Ctrl-C for the tracer's process group must not take it
//! first) and writes nothing (stdout and stderr are /dev/null, so nobody waits on its output).

use std::{
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::trace::holders::{self, Holders, Registry};

/// How long the tracer may be stopped before the watchdog continues the traced processes.
pub const FROZEN_AFTER: Duration = Duration::from_millis(1000);
/// How long after the tracer's death stopped processes are still continued.
pub const AFTER_DEATH: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(50);

/// The tracer's end: dropping it without [`disarm`](Self::disarm) reads as a death.
pub struct Watchdog {
    pipe: OwnedFd,
    pub pid: u32,
}

impl Watchdog {
    /// Forks the watchdog. Must run while this process has one thread (before the async
    /// runtime starts).
    pub fn start(traced_map: BorrowedFd<'_>, holders: &Holders) -> Result<Watchdog> {
        Self::fork(Some(traced_map.as_raw_fd()), holders)
    }

    /// As `start`, for the agent: only its holds in the registry are released.
    pub fn start_for_holds(holders: &Holders) -> Result<Watchdog> {
        Self::fork(None, holders)
    }

    fn fork(traced_map: Option<i32>, holders: &Holders) -> Result<Watchdog> {
        // Its own open of the lock: flock locks belong to the open file, shared across fork.
        let lock = (holders.registry.lock >= 0)
            .then(holders::open_lock)
            .flatten();
        let registry = Registry {
            lock: lock.as_ref().map_or(-1, |l| l.as_raw_fd()),
            ..holders.registry
        };
        let mut fds = [0; 2];
        // SAFETY: valid out-array of two ints.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error()).context("pipe2");
        }
        // SAFETY: both fds were just created and are owned by nobody else.
        let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: no preconditions.
        let tracer = unsafe { libc::getpid() } as u32;
        // SAFETY: fork in a single-threaded process; the child runs plain code and exits.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error()).context("fork the watchdog");
        }
        if pid == 0 {
            let rd = rd.as_raw_fd();
            std::mem::forget(wr);
            std::mem::forget(lock);
            child(
                tracer,
                rd,
                Stopped {
                    traced: traced_map,
                    registry,
                },
            );
        }
        drop(rd);
        drop(lock);
        Ok(Watchdog {
            pipe: wr,
            pid: pid as u32,
        })
    }

    /// The tracer ends normally (it has continued everything itself): the watchdog exits.
    pub fn disarm(self) {
        // SAFETY: one byte from a valid buffer to our pipe.
        unsafe { libc::write(self.pipe.as_raw_fd(), b"x".as_ptr().cast(), 1) };
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(self.pid as i32, &mut status, 0) };
    }
}

/// What the watchdog may continue.
#[derive(Clone, Copy)]
struct Stopped {
    /// Launch mode's `TRACED`: each stopped process in it (that no other tracer holds).
    traced: Option<i32>,
    /// The tracer's holds at opens.
    registry: Registry,
}

/// The watchdog process. Never returns.
fn child(tracer: u32, pipe: i32, map: Stopped) -> ! {
    // SAFETY: plain syscalls on our own process.
    unsafe {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE] {
            libc::signal(sig, libc::SIG_IGN);
        }
        let keep: Vec<i32> = [pipe, map.registry.map, map.registry.lock]
            .into_iter()
            .chain(map.traced)
            .collect();
        close_all_but(&keep);
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        for fd in 0..3 {
            libc::dup2(null, fd);
        }
        if null > 2 {
            libc::close(null);
        }
    }
    let mut stopped_since: Option<Instant> = None;
    loop {
        let mut pfd = libc::pollfd {
            fd: pipe,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, POLL.as_millis() as i32) };
        if n > 0 {
            let mut b = 0u8;
            // SAFETY: one byte into a valid buffer.
            let r = unsafe { libc::read(pipe, (&mut b as *mut u8).cast(), 1) };
            if r == 1 {
                // SAFETY: exits this process only.
                unsafe { libc::_exit(0) };
            }
            if r == 0 {
                dead(map);
            }
        }
        // Also a death: a process forked by the tracer (not yet exec'd) may still hold the
        // pipe's write end, but we are reparented the moment the tracer dies.
        // SAFETY: no preconditions.
        if unsafe { libc::getppid() } as u32 != tracer {
            dead(map);
        }
        if matches!(state(tracer), Some('T' | 't')) {
            let since = *stopped_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= FROZEN_AFTER {
                continue_stopped(map);
            }
        } else {
            stopped_since = None;
        }
    }
}

/// The tracer is gone: continue stopped traced processes while its programs detach, then exit.
fn dead(map: Stopped) -> ! {
    let end = Instant::now() + AFTER_DEATH;
    while Instant::now() < end {
        continue_stopped(map);
        std::thread::sleep(POLL);
    }
    // SAFETY: exits this process only.
    unsafe { libc::_exit(0) }
}

/// Closes every descriptor but `keep` (the BPF links among them: they must die with the
/// tracer).
unsafe fn close_all_but(keep: &[i32]) {
    let fds: Vec<i32> = match std::fs::read_dir("/proc/self/fd") {
        Ok(rd) => rd
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect(),
        Err(_) => (3..4096).collect(),
    };
    for fd in fds {
        if !keep.contains(&fd) {
            // SAFETY: closing a descriptor of our own (a stale number fails harmlessly).
            unsafe { libc::close(fd) };
        }
    }
}

/// The state letter of `/proc/PID/stat`, `None` when the process is gone.
pub fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// Releases the tracer's holds of threads that are stopped (or gone: a thread the BPF side
/// recorded but has not stopped yet keeps its entry, or the tracer, thinking it released,
/// would never continue it); then SIGCONT to every process of `TRACED` that is stopped and
/// held by no other live tracer (a thread id continues its whole process).
fn continue_stopped(map: Stopped) {
    map.registry
        .release_own(|tid| matches!(state(tid), Some('T') | None));
    let Some(traced) = map.traced else {
        return;
    };
    for pid in map_keys(traced) {
        if state(pid) == Some('T') && !map.registry.held_by_others(pid) {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
    }
}

/// The keys (pids) of the `TRACED` hash map, through the bpf(2) syscall.
fn map_keys(map: i32) -> Vec<u32> {
    #[repr(C)]
    struct MapElemAttr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        next_key: u64,
        flags: u64,
    }
    const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
    let mut keys = Vec::new();
    let mut key: u32 = 0;
    let mut next: u32 = 0;
    let mut first = true;
    while keys.len() < 65536 {
        let attr = MapElemAttr {
            map_fd: map as u32,
            _pad: 0,
            key: if first { 0 } else { &key as *const u32 as u64 },
            next_key: &mut next as *mut u32 as u64,
            flags: 0,
        };
        // SAFETY: a valid attr for BPF_MAP_GET_NEXT_KEY; the kernel writes 4 bytes to `next`.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_GET_NEXT_KEY,
                &attr as *const MapElemAttr,
                std::mem::size_of::<MapElemAttr>(),
            )
        };
        if r != 0 {
            break;
        }
        keys.push(next);
        key = next;
        first = false;
    }
    keys
}
