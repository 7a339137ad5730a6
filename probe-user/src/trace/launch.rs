//! Starting the target: fork, hold the child at a gate until the probes are attached, then exec.
//! The child is in the traced set before it runs a single instruction of the target program.

use std::{
    ffi::{CString, OsString},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
};

use anyhow::{Context, Result, bail};

/// A forked child waiting at the gate.
pub struct GatedChild {
    pub pid: u32,
    go: OwnedFd,
    exec_error: OwnedFd,
}

fn pipe_cloexec() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: valid out-array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe2");
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Who the launched program runs as, when not as us.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the user's, from the group database).
    pub groups: Vec<u32>,
    pub user: String,
}

impl Credentials {
    /// The user who ran `sudo` (`SUDO_UID`, `SUDO_GID`, and that user's groups), when we run
    /// as root under sudo on behalf of someone else.
    pub fn sudo_user() -> Result<Option<Credentials>> {
        // SAFETY: no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Ok(None);
        }
        let Some(uid) = std::env::var("SUDO_UID").ok() else {
            return Ok(None);
        };
        let uid: u32 = uid
            .parse()
            .with_context(|| format!("SUDO_UID '{uid}' is not a user id"))?;
        if uid == 0 {
            return Ok(None);
        }
        let gid: u32 = match std::env::var("SUDO_GID") {
            Ok(g) => g
                .parse()
                .with_context(|| format!("SUDO_GID '{g}' is not a group id"))?,
            Err(_) => bail!("SUDO_UID is set but SUDO_GID is not"),
        };
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: valid out-pointers and buffer of the given length.
        unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found) };
        if found.is_null() {
            bail!("SUDO_UID {uid} is no user in the password database");
        }
        // SAFETY: pw_name points into `buf`, NUL-terminated.
        let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) }.to_owned();
        let mut groups = vec![0 as libc::gid_t; 256];
        let mut n = groups.len() as libc::c_int;
        // SAFETY: valid name and a groups array of `n` entries.
        if unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut n) } < 0 {
            groups.resize(n.max(0) as usize, 0);
            // SAFETY: as above, with the size it asked for.
            unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        }
        groups.truncate(n.max(0) as usize);
        Ok(Some(Credentials {
            uid,
            gid,
            groups,
            user: name.to_string_lossy().into_owned(),
        }))
    }
}

/// Forks a child that will exec `program` with `args` (args[0] included) once released.
pub fn spawn_gated(program: &Path, args: &[OsString]) -> Result<GatedChild> {
    spawn_gated_as(program, args, None)
}

/// [`spawn_gated`], the program running as `creds` (groups, gid, then uid are set in the
/// child before exec; a failure there is reported like a failed exec).
pub fn spawn_gated_as(
    program: &Path,
    args: &[OsString],
    creds: Option<&Credentials>,
) -> Result<GatedChild> {
    // Everything the child needs is allocated before fork: after it, only async-signal-safe calls.
    let path = CString::new(program.as_os_str().as_bytes()).context("program path contains NUL")?;
    let argv_owned: Vec<CString> = args
        .iter()
        .map(|a| CString::new(a.as_bytes()).context("argument contains NUL"))
        .collect::<Result<_>>()?;
    let mut argv: Vec<*const libc::c_char> = argv_owned.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());

    let (go_rd, go_wr) = pipe_cloexec()?;
    let (err_rd, err_wr) = pipe_cloexec()?;
    // SAFETY: fork in a single-threaded process (called before the async runtime starts).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("fork");
    }
    if pid == 0 {
        // Child: wait for the go byte (EOF means the tracer died: do not run untraced; for
        // that EOF to come, our copy of the write end must be closed).
        unsafe {
            libc::close(go_wr.as_raw_fd());
            let mut b = 0u8;
            let n = libc::read(go_rd.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
            if n != 1 {
                libc::_exit(127);
            }
            let dropped = match creds {
                None => true,
                Some(c) => {
                    libc::setgroups(c.groups.len(), c.groups.as_ptr()) == 0
                        && libc::setresgid(c.gid, c.gid, c.gid) == 0
                        && libc::setresuid(c.uid, c.uid, c.uid) == 0
                }
            };
            if dropped {
                libc::execv(path.as_ptr(), argv.as_ptr());
            }
            let errno = *libc::__errno_location();
            libc::write(err_wr.as_raw_fd(), (&errno as *const i32).cast(), 4);
            libc::_exit(127);
        }
    }
    drop(go_rd);
    drop(err_wr);
    Ok(GatedChild {
        pid: pid as u32,
        go: go_wr,
        exec_error: err_rd,
    })
}

impl GatedChild {
    /// Lets the child exec; fails if exec itself failed.
    pub fn release(self) -> Result<()> {
        let b = 1u8;
        // SAFETY: valid fd and one-byte buffer.
        let n = unsafe { libc::write(self.go.as_raw_fd(), (&b as *const u8).cast(), 1) };
        if n != 1 {
            bail!(
                "cannot release the target process: {}",
                std::io::Error::last_os_error()
            );
        }
        drop(self.go);
        let mut errno = 0i32;
        // SAFETY: valid fd and 4-byte buffer. EOF (0) means exec succeeded (CLOEXEC closed it).
        let n = unsafe {
            libc::read(
                self.exec_error.as_raw_fd(),
                (&mut errno as *mut i32).cast(),
                4,
            )
        };
        if n == 4 {
            let mut status = 0;
            // SAFETY: reap the failed child.
            unsafe { libc::waitpid(self.pid as i32, &mut status, 0) };
            bail!(
                "cannot execute the program: {}",
                std::io::Error::from_raw_os_error(errno)
            );
        }
        Ok(())
    }

    /// Abandons the launch: the child sees EOF at the gate and exits without running anything.
    pub fn abort(self) {
        let pid = self.pid as i32;
        drop(self);
        let mut status = 0;
        // SAFETY: reap our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
    }
}

/// Orphaned grandchildren are reparented to us (so we can reap them and see the tree end).
pub fn become_subreaper() {
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
}

/// Reaps every exited child without blocking; returns the exit code of `main_child` if it
/// was among them (128 + signal for a killed child, as shells report it).
pub fn reap_children(main_child: u32) -> Option<i32> {
    let mut result = None;
    loop {
        let mut status = 0;
        // SAFETY: non-blocking wait for any child.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            break;
        }
        if pid as u32 == main_child {
            result = Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else if libc::WIFSIGNALED(status) {
                128 + libc::WTERMSIG(status)
            } else {
                1
            });
        }
    }
    result
}
