//! Releasing probes: links of a process that left, and everything at the tracer's end. No
//! breakpoint of a multi-uprobe link outlives the tracer (see docs/design.md, "Shutdown").

use aya::programs::UProbe;

use super::{Bpf, UPROBE_PROGRAMS, program};

impl Bpf {
    /// Removes every uprobe now (multi-uprobe links closed, perf links detached), waiting
    /// for the kernel's teardown; the rest stays loaded. Benchmarks time this.
    pub fn detach_uprobes(&mut self) {
        self.close_links();
        self.scoped_requests.clear();
        for prog in UPROBE_PROGRAMS {
            if let Ok(up) = program(&mut self.ebpf, prog)
                .and_then(|p| <&mut UProbe>::try_from(p).map_err(anyhow::Error::from))
                && up.fd().is_ok()
            {
                let _ = up.unload();
            }
        }
    }

    /// Drops the probes of process `pid` (`Scope::Traced`): it exited, or we detach from it.
    /// Closing a link waits for a grace period, so it happens on other threads; a process we
    /// detach from has its breakpoints back out once [`Bpf::close_links`] has joined them.
    pub fn drop_process_probes(&mut self, pid: u32) {
        self.unlinking.retain(|t| !t.is_finished());
        self.unwatch_code_deaths(pid);
        if let Some(links) = self.process_links.remove(&pid) {
            self.unlinking.extend(
                links
                    .into_iter()
                    .filter_map(|(_, link)| close_in_background(link)),
            );
        }
    }

    /// Closes the link on `pid`'s `code_dealloc` (`watch_code_deaths`), if it has one.
    pub(super) fn unwatch_code_deaths(&mut self, pid: u32) {
        if let Some(link) = self.code_gone_links.remove(&pid) {
            self.unlinking.extend(close_in_background(link));
        }
    }

    /// Closes every multi-uprobe link and waits until all are closed, those of processes that
    /// left included: their breakpoints are then out of every process. One thread per link,
    /// so that the grace periods the kernel waits for overlap (~one in all, not one per link).
    fn close_links(&mut self) {
        let started = std::time::Instant::now();
        let mut links: Vec<_> = std::mem::take(&mut self.links)
            .into_iter()
            .map(|(_, link)| link)
            .collect();
        links.extend(
            self.process_links
                .drain()
                .flat_map(|(_, links)| links.into_iter().map(|(_, link)| link)),
        );
        links.extend(self.code_gone_links.drain().map(|(_, link)| link));
        let count = links.len() + self.unlinking.len();
        self.unlinking
            .extend(links.into_iter().filter_map(close_in_background));
        for thread in self.unlinking.drain(..) {
            let _ = thread.join();
        }
        if count > 0 {
            crate::log::debug(&format!(
                "{count} multi-uprobe link(s) closed in {:.0} ms",
                started.elapsed().as_secs_f64() * 1e3
            ));
        }
    }

    /// Releases every probe at the tracer's end; call it last, once all output is written
    /// (nothing is traced any more: the traced set is empty by then).
    ///
    /// Multi-uprobe links are closed before this returns (`close_links`), so no breakpoint of
    /// theirs outlives the tracer. Perf links cost a grace period each (~0.1 s here), so
    /// detaching a few dozen takes seconds: a forked child keeps copies of their descriptors
    /// until this process has exited, then exits itself, and that slow work happens after the
    /// caller is gone.
    pub fn detach_in_background(mut self) {
        self.close_links();
        // Never dropped here (forgotten below).
        self.holders.leave();
        let mut fds = [0; 2];
        // SAFETY: plain syscalls; the child only calls read, dup2, open and _exit.
        unsafe {
            if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                return; // falls back to detaching in the foreground (Drop)
            }
            let pid = libc::fork();
            if pid == 0 {
                libc::close(fds[1]);
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                for fd in 0..3 {
                    libc::dup2(null, fd);
                }
                let mut b = 0u8;
                // EOF once the parent (holding the write end) has exited.
                while libc::read(fds[0], (&mut b as *mut u8).cast(), 1) > 0 {}
                libc::_exit(0);
            }
            libc::close(fds[0]);
            if pid < 0 {
                libc::close(fds[1]);
                return;
            }
        }
        // The parent's descriptors close at exit, cheaply: the child still holds them.
        std::mem::forget(self);
    }
}

impl Drop for Bpf {
    fn drop(&mut self) {
        self.close_links();
    }
}

/// Closes `link` on a thread of its own (`None`: no thread could be made, and it is closed here).
pub(super) fn close_in_background(
    link: std::os::fd::OwnedFd,
) -> Option<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("unlink".into())
        .spawn(move || drop(link))
        .ok()
}
