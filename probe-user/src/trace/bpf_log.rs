//! The BPF side's own diagnostics through aya-log: off unless `--log-level=debug` (the level is
//! a load-time constant, so with logging off the verifier drops the log statements), and when
//! on, forwarded as the tracer's debug lines (`bpf: ...`).

use anyhow::{Context, Result, anyhow};
use aya::Ebpf;

/// The BPF side's aya-log level (`AYA_LOG_LEVEL`, a load-time constant): debug with
/// `--log-level=debug`, else 0, which turns every BPF log statement off; the verifier then
/// drops their branches: with logging off only the load and test of the level stay.
pub(super) fn level() -> u8 {
    if crate::log::enabled(crate::settings::LogLevel::Debug) {
        aya_log::Level::Debug as u8
    } else {
        0
    }
}

/// Prints the BPF side's log records as debug lines (`bpf: ...`), from a thread that waits on
/// the log ring.
pub(super) fn forward(ebpf: &mut Ebpf) -> Result<()> {
    let mut logger = aya_log::EbpfLogger::init_with_logger(ebpf, BpfLogLines)
        .map_err(|e| anyhow!("cannot read the BPF side's log: {e}"))?;
    std::thread::Builder::new()
        .name("bpf-log".into())
        .spawn(move || {
            use std::os::fd::AsRawFd;
            loop {
                let mut pfd = libc::pollfd {
                    fd: logger.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; the ring's fd lives as long as `logger`.
                unsafe { libc::poll(&mut pfd, 1, 100) };
                logger.flush();
            }
        })
        .context("cannot start the BPF log thread")?;
    Ok(())
}

/// aya-log's records, as the tracer's own debug lines.
struct BpfLogLines;

impl log::Log for BpfLogLines {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        crate::log::debug(&format!("bpf: {}", record.args()));
    }

    fn flush(&self) {}
}
