//! Checks on what the user asked us to trace, made before any BPF work: a `--pid` that is a
//! thread (mapped to its process), pid 1 and kernel threads (refused), a program we could
//! not execute (refused).

use std::{ffi::CString, os::unix::ffi::OsStrExt, path::Path};

/// `PF_KTHREAD` in the flags of `/proc/PID/stat`.
const PF_KTHREAD: u64 = 0x0020_0000;

/// The process to attach to for `--pid pid`: itself, or for a thread id its process (the
/// second value says so). Pid 1 and kernel threads are refused with the reason.
pub fn attach_pid(pid: u32) -> Result<(u32, Option<String>), String> {
    if pid == 1 {
        return Err(
            "refusing --pid 1: that is init (the whole system hangs on it); attach to the \
             process that uses the NPU"
                .to_string(),
        );
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("cannot read /proc/{pid}/stat: {e}"))?;
    // Fields after the command (which may hold spaces and parentheses): state is field 3,
    // flags field 9.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| format!("unexpected /proc/{pid}/stat"))?;
    let flags: u64 = rest
        .split_whitespace()
        .nth(6)
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| format!("unexpected /proc/{pid}/stat"))?;
    if flags & PF_KTHREAD != 0 {
        return Err(format!(
            "refusing --pid {pid}: it is a kernel thread ({}), which has no user-space memory \
             to trace",
            comm(pid)
        ));
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("cannot read /proc/{pid}/status: {e}"))?;
    let tgid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("no Tgid in /proc/{pid}/status"))?;
    if tgid == pid {
        return Ok((pid, None));
    }
    if tgid == 1 {
        return attach_pid(1);
    }
    Ok((
        tgid,
        Some(format!(
            "{pid} is a thread of process {tgid} ({}): tracing process {tgid}, all its threads",
            comm(tgid)
        )),
    ))
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim_end().to_string())
        .unwrap_or_else(|_| "?".to_string())
}

/// Refuses a program the kernel would not execute for us: not a regular file, no execute
/// permission (for root: no execute bit at all), or on a `noexec` mount.
pub fn check_executable(program: &Path) -> Result<(), String> {
    let meta =
        std::fs::metadata(program).map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    if !meta.is_file() {
        return Err(format!(
            "cannot run {}: not a regular file",
            program.display()
        ));
    }
    let c = CString::new(program.as_os_str().as_bytes())
        .map_err(|_| format!("cannot run {}: NUL in path", program.display()))?;
    // SAFETY: `c` is NUL-terminated. AT_EACCESS: checked with our effective ids (root gets
    // EACCES only when no execute bit is set or the mount is noexec).
    if unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::X_OK, libc::AT_EACCESS) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "cannot run {}: not executable ({e}; check its mode and that its file system is \
             not mounted noexec)",
            program.display()
        ));
    }
    Ok(())
}

/// True while `/proc/PID` exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_map_to_their_process() {
        let me = std::process::id();
        // SAFETY: no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let other = std::thread::spawn(|| unsafe { libc::gettid() } as u32)
            .join()
            .unwrap();
        // The spawned thread is gone; this test's own thread (not main) is a thread of `me`.
        let _ = other;
        if tid != me {
            let (p, note) = attach_pid(tid).unwrap();
            assert_eq!(p, me);
            assert!(note.unwrap().contains(&format!("thread of process {me}")));
        }
        assert_eq!(attach_pid(me).unwrap(), (me, None));
        assert!(attach_pid(1).unwrap_err().contains("init"));
    }
}
