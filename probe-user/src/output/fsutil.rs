//! Creating output directories and files through directory file descriptors.
//!
//! The tracer runs as root and writes into directories a user may own. Everything below the
//! output root is created relative to an open directory descriptor (`mkdirat`, then `openat`
//! with `O_NOFOLLOW | O_DIRECTORY`, the result checked to be the directory we just made and
//! its mode set with `fchmod`), and files with `openat(O_CREAT | O_EXCL | O_NOFOLLOW)`. A
//! user who renames or swaps a freshly created directory for a symlink therefore cannot make
//! us create, chmod or write anything elsewhere: we keep writing into the directory we
//! opened, wherever it has moved. No permission is ever changed by path.
//!
//! The output root itself is resolved one component at a time from `/` (or the working
//! directory) without following symlinks, except symlinks owned by root or by us (ones no
//! other user can have planted); it must be owned by root, by us or by the user who ran
//! `sudo`.

use std::{
    ffi::CString,
    fs::File,
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Component, Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context, Result, bail};

pub const DIR_MODE: u32 = 0o750;
pub const FILE_MODE: u32 = 0o640;

/// Symlinks followed while resolving one output root (as the kernel's MAXSYMLINKS).
const MAX_SYMLINKS: usize = 40;

/// How many `_<n>` suffixes are tried before giving up on a unique name.
const MAX_UNIQUE_TRIES: u32 = 1000;

/// An open directory (the descriptor is shared by clones) and the path it was reached by,
/// kept for messages only: nothing is ever opened through it.
#[derive(Clone, Debug)]
pub struct Dir {
    fd: Arc<OwnedFd>,
    path: PathBuf,
}

fn cstr(name: &str) -> Result<CString> {
    CString::new(name).with_context(|| format!("bad file name {name:?}"))
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        bail!("bad file name {name:?}");
    }
    Ok(())
}

fn fstat(fd: i32) -> io::Result<libc::stat> {
    // SAFETY: fstat writes into a zeroed stat we own.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st)
    }
}

fn fstatat_nofollow(dirfd: i32, name: &CString) -> io::Result<libc::stat> {
    // SAFETY: fstatat writes into a zeroed stat we own; `name` is NUL-terminated.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstatat(dirfd, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st)
    }
}

fn openat(dirfd: i32, name: &CString, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: `name` is NUL-terminated; the returned descriptor is owned by the OwnedFd.
    let fd = unsafe { libc::openat(dirfd, name.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by openat and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fchmod(fd: i32, mode: u32) -> io::Result<()> {
    // SAFETY: plain syscall on a descriptor we own.
    if unsafe { libc::fchmod(fd, mode) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn euid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() }
}

/// The user who ran `sudo`, when we run under it.
pub fn sudo_uid() -> Option<u32> {
    if euid() != 0 {
        return None;
    }
    std::env::var("SUDO_UID").ok()?.parse().ok()
}

/// Who what we create is given to (`fchown`), when not to us: the user who ran sudo.
static OWNER: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();

/// Everything created from now on is given to `uid:gid` (results of a sudo run belong to the
/// user who ran it). Set once, before any output is created.
pub fn give_results_to(uid: u32, gid: u32) {
    let _ = OWNER.set((uid, gid));
}

fn hand_over(fd: i32) -> io::Result<()> {
    if let Some(&(uid, gid)) = OWNER.get() {
        // SAFETY: plain syscall on a descriptor we own.
        if unsafe { libc::fchown(fd, uid, gid) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A directory we made (owned by us, or by whom we gave it to).
fn ours(uid: u32) -> bool {
    uid == euid() || OWNER.get().is_some_and(|&(u, _)| u == uid)
}

/// Owners whose directories and symlinks we trust on the way to the output root.
fn trusted_owner(uid: u32) -> bool {
    uid == 0 || uid == euid()
}

const DIR_FLAGS: i32 = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;

impl Dir {
    /// The path this directory was reached by (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// A path that names `name` inside this very directory whatever happened to its path
    /// since (for libraries that only take paths, SQLite).
    pub fn fd_path(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}/{name}", self.fd()))
    }

    /// Opens (creating what is missing, mode 0750) the output root `path`, resolving it
    /// without following symlinks a user other than root or us could have planted, and
    /// refusing a root owned by another user.
    pub fn open_root(path: &Path) -> Result<Dir> {
        let fd = resolve(path, true)?;
        let st = fstat(fd.as_raw_fd())?;
        let uid = st.st_uid;
        if !(trusted_owner(uid) || Some(uid) == sudo_uid()) {
            bail!(
                "{} is owned by uid {uid}, neither root nor you: refusing to write there; \
                 pick a directory you own",
                path.display()
            );
        }
        Ok(Dir {
            fd: Arc::new(fd),
            path: path.to_path_buf(),
        })
    }

    /// Creates the new directory `name` (mode 0750) and opens it; fails if anything is
    /// already there.
    pub fn create_dir(&self, name: &str) -> Result<Dir> {
        self.try_create_dir(name)
            .with_context(|| format!("cannot create directory {}", self.path.join(name).display()))
    }

    fn try_create_dir(&self, name: &str) -> io::Result<Dir> {
        check_name(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let c = CString::new(name)?;
        // SAFETY: `c` is NUL-terminated.
        if unsafe { libc::mkdirat(self.fd(), c.as_ptr(), DIR_MODE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = openat(self.fd(), &c, DIR_FLAGS, 0)?;
        // Between mkdirat and openat the name may have been replaced (by whoever owns this
        // directory) with a directory of theirs: only the one we made is ours to use.
        let st = fstat(fd.as_raw_fd())?;
        if st.st_uid != euid() {
            // Nothing we create carries another owner before `hand_over` below.
            return Err(io::Error::other(format!(
                "{} was replaced while being created",
                self.path.join(name).display()
            )));
        }
        fchmod(fd.as_raw_fd(), DIR_MODE)?;
        hand_over(fd.as_raw_fd())?;
        Ok(Dir {
            fd: Arc::new(fd),
            path: self.path.join(name),
        })
    }

    /// Opens the directory `name`, creating it if missing. An existing one must be a real
    /// directory (not a symlink) owned by us.
    pub fn open_or_create_dir(&self, name: &str) -> Result<Dir> {
        match self.try_create_dir(name) {
            Ok(d) => return Ok(d),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("cannot create directory {}", self.path.join(name).display())
                });
            }
        }
        let shown = self.path.join(name);
        let c = cstr(name)?;
        let fd = openat(self.fd(), &c, DIR_FLAGS, 0).map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => {
                anyhow::anyhow!(
                    "refusing to write through {} (not a directory)",
                    shown.display()
                )
            }
            _ => anyhow::Error::from(e).context(format!("cannot open {}", shown.display())),
        })?;
        let st = fstat(fd.as_raw_fd())?;
        if !ours(st.st_uid) {
            bail!(
                "{} is owned by uid {}, not by us: refusing to write there",
                shown.display(),
                st.st_uid
            );
        }
        Ok(Dir {
            fd: Arc::new(fd),
            path: shown,
        })
    }

    /// Creates a new directory named `<stem><suffix>`, or `<stem>_<n><suffix>` for the first
    /// free n: two runs in one second (or a name someone planted) never share a directory.
    pub fn create_unique_dir(&self, stem: &str, suffix: &str) -> Result<Dir> {
        let mut last = None;
        for n in 0..MAX_UNIQUE_TRIES {
            let name = unique_name(stem, suffix, n);
            match self.try_create_dir(&name) {
                Ok(d) => return Ok(d),
                // Taken, or taken over (moved, replaced) before we opened it: try the next
                // name; what we made and lost stays behind, empty.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        None | Some(libc::EEXIST | libc::ELOOP | libc::ENOTDIR | libc::ENOENT)
                    ) =>
                {
                    last = Some(e)
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!(
                            "cannot create directory {}",
                            self.path.join(&name).display()
                        )
                    });
                }
            }
        }
        Err(last.unwrap()).with_context(|| {
            format!(
                "no free name for {}{suffix} in {}",
                stem,
                self.path.display()
            )
        })
    }

    /// Creates the new file `name` (mode 0640); fails if anything, a symlink included, is
    /// already there. Returns its path (for messages) and the open file.
    pub fn create_file(&self, name: &str) -> Result<(PathBuf, File)> {
        let shown = self.path.join(name);
        let file = self
            .try_create_file(name)
            .with_context(|| format!("cannot create {}", shown.display()))?;
        Ok((shown, file))
    }

    fn try_create_file(&self, name: &str) -> io::Result<File> {
        check_name(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let c = CString::new(name)?;
        let fd = openat(
            self.fd(),
            &c,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            FILE_MODE,
        )?;
        fchmod(fd.as_raw_fd(), FILE_MODE)?;
        hand_over(fd.as_raw_fd())?;
        Ok(File::from(fd))
    }

    /// Creates `<stem><ext>`, or `<stem>_<n><ext>` for the first free n.
    pub fn create_unique_file(&self, stem: &str, ext: &str) -> Result<(PathBuf, File)> {
        self.create_unique_file_from(stem, ext, 0)
            .map(|(path, file, _)| (path, file))
    }

    /// As [`Dir::create_unique_file`], trying n from `first` on (0 is the bare name);
    /// returns the n taken too.
    pub fn create_unique_file_from(
        &self,
        stem: &str,
        ext: &str,
        first: u32,
    ) -> Result<(PathBuf, File, u32)> {
        for n in first..first.saturating_add(MAX_UNIQUE_TRIES) {
            let name = unique_name(stem, ext, n);
            match self.try_create_file(&name) {
                Ok(f) => return Ok((self.path.join(name), f, n)),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("cannot create {}", self.path.join(name).display())
                    });
                }
            }
        }
        bail!("no free name for {stem}{ext} in {}", self.path.display())
    }

    /// Removes the file `name` from this directory (never a directory, never through a
    /// symlink: `unlinkat` removes the link itself).
    pub fn remove_file(&self, name: &str) -> Result<()> {
        check_name(name)?;
        let c = cstr(name)?;
        // SAFETY: `c` is NUL-terminated.
        if unsafe { libc::unlinkat(self.fd(), c.as_ptr(), 0) } != 0 {
            return Err(io::Error::last_os_error())
                .with_context(|| format!("cannot remove {}", self.path.join(name).display()));
        }
        Ok(())
    }

    /// Removes the empty directory `name` from this directory.
    pub fn remove_dir(&self, name: &str) -> Result<()> {
        check_name(name)?;
        let c = cstr(name)?;
        // SAFETY: `c` is NUL-terminated.
        if unsafe { libc::unlinkat(self.fd(), c.as_ptr(), libc::AT_REMOVEDIR) } != 0 {
            return Err(io::Error::last_os_error())
                .with_context(|| format!("cannot remove {}", self.path.join(name).display()));
        }
        Ok(())
    }

    /// Gives this directory (not what it contains) to `uid:gid`.
    pub fn chown(&self, uid: u32, gid: u32) -> io::Result<()> {
        // SAFETY: plain syscall on a descriptor we own.
        if unsafe { libc::fchown(self.fd(), uid, gid) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn unique_name(stem: &str, suffix: &str, n: u32) -> String {
    if n == 0 {
        format!("{stem}{suffix}")
    } else {
        format!("{stem}_{n}{suffix}")
    }
}

/// Opens directory `path` one component at a time, never following a symlink unless root or
/// we own it; creates missing components (mode 0750) when `create`.
fn resolve(path: &Path, create: bool) -> Result<OwnedFd> {
    let start = if path.is_absolute() { "/" } else { "." };
    let mut cur = openat(
        libc::AT_FDCWD,
        &cstr(start)?,
        DIR_FLAGS & !libc::O_NOFOLLOW,
        0,
    )
    .with_context(|| format!("cannot open {start}"))?;
    // Components still to walk, last one at the end (symlink targets are spliced in).
    let mut todo: Vec<std::ffi::OsString> = Vec::new();
    let push = |todo: &mut Vec<std::ffi::OsString>, p: &Path| {
        for c in p.components().rev() {
            match c {
                Component::Normal(n) => todo.push(n.to_os_string()),
                Component::ParentDir => todo.push("..".into()),
                Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            }
        }
    };
    push(&mut todo, path);
    let mut links = 0;
    while let Some(name) = todo.pop() {
        let c = CString::new(name.as_bytes()).context("bad path")?;
        match openat(cur.as_raw_fd(), &c, DIR_FLAGS, 0) {
            Ok(fd) => cur = fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && create => {
                // SAFETY: `c` is NUL-terminated.
                let r = unsafe { libc::mkdirat(cur.as_raw_fd(), c.as_ptr(), DIR_MODE) };
                if r == 0 {
                    // Ours: give it its owner (a failure here is caught by the walk below).
                    if let Ok(fd) = openat(cur.as_raw_fd(), &c, DIR_FLAGS, 0)
                        && fstat(fd.as_raw_fd()).is_ok_and(|st| st.st_uid == euid())
                    {
                        let _ = hand_over(fd.as_raw_fd());
                    }
                }
                if r != 0 {
                    let e = io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::EEXIST) {
                        return Err(e).with_context(|| {
                            format!(
                                "cannot create output directory {} (at {})",
                                path.display(),
                                name.to_string_lossy()
                            )
                        });
                    }
                }
                // Walk it again: whatever is there now gets the same checks.
                todo.push(name);
            }
            // With O_DIRECTORY a symlink gives ENOTDIR (not ELOOP): look at what is there.
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR))
                    && fstatat_nofollow(cur.as_raw_fd(), &c)
                        .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK) =>
            {
                let st = fstatat_nofollow(cur.as_raw_fd(), &c)?;
                if !trusted_owner(st.st_uid) {
                    bail!(
                        "refusing to follow symlink {} in {} (owned by uid {}, not by root or \
                         you): give the real directory",
                        name.to_string_lossy(),
                        path.display(),
                        st.st_uid
                    );
                }
                links += 1;
                if links > MAX_SYMLINKS {
                    bail!("too many symlinks in {}", path.display());
                }
                let target = readlinkat(cur.as_raw_fd(), &c)?;
                if target.is_absolute() {
                    cur = openat(
                        libc::AT_FDCWD,
                        &cstr("/")?,
                        libc::O_RDONLY | libc::O_DIRECTORY,
                        0,
                    )?;
                }
                push(&mut todo, &target);
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                bail!(
                    "{} is not a directory ({} is a file)",
                    path.display(),
                    name.to_string_lossy()
                )
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot open {} (at {})",
                        path.display(),
                        name.to_string_lossy()
                    )
                });
            }
        }
    }
    Ok(cur)
}

fn readlinkat(dirfd: i32, name: &CString) -> io::Result<PathBuf> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `buf` has the length we pass.
    let n = unsafe { libc::readlinkat(dirfd, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(PathBuf::from(std::ffi::OsStr::from_bytes(&buf)))
}

/// The directories `check_writable` is about to make for `--output`, removed again when the
/// run fails before it starts tracing (not root, a refused program): a failed start leaves
/// nothing behind. Only empty ones go (`remove_dir` refuses any other).
pub struct MadeDirs(Vec<PathBuf>);

impl MadeDirs {
    /// Before `check_writable(dir)`: `dir` and each missing directory above it, deepest first.
    pub fn before_making(dir: &Path) -> Self {
        let mut missing = Vec::new();
        let mut at = Some(dir);
        while let Some(p) = at.filter(|p| !p.as_os_str().is_empty() && !p.exists()) {
            missing.push(p.to_path_buf());
            at = p.parent();
        }
        MadeDirs(missing)
    }

    /// Tracing started: they stay, whatever happens next.
    pub fn keep(mut self) {
        self.0.clear();
    }
}

impl Drop for MadeDirs {
    fn drop(&mut self) {
        for dir in &self.0 {
            if std::fs::remove_dir(dir).is_err() {
                break;
            }
        }
    }
}

/// Checks up front that we can create files in `dir` (creating it if needed), so a bad
/// `--output` fails before the target is started.
pub fn check_writable(dir: &Path) -> Result<()> {
    let root = Dir::open_root(dir)?;
    let name = format!(".memscope-bpf-write-test-{}", std::process::id());
    root.create_file(&name)
        .with_context(|| format!("output directory {} is not writable", dir.display()))?;
    let _ = root.remove_file(&name);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{fs, os::unix::fs::PermissionsExt};

    fn tmp(name: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("memscope-fsutil-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn creates_with_modes_and_refuses_symlinks() {
        let root = tmp("modes");
        let top = Dir::open_root(&root.join("a")).unwrap();
        let dir = top.open_or_create_dir("b").unwrap();
        assert_eq!(dir.path(), root.join("a/b"));
        assert_eq!(
            fs::metadata(root.join("a/b")).unwrap().permissions().mode() & 0o777,
            DIR_MODE
        );
        let (p, _) = dir.create_file("x.csv").unwrap();
        assert_eq!(p, root.join("a/b/x.csv"));
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            FILE_MODE
        );
        assert!(
            dir.create_file("x.csv").is_err(),
            "existing file must not be reused"
        );
        let (p2, _) = dir.create_unique_file("x", ".csv").unwrap();
        assert_eq!(p2, root.join("a/b/x_1.csv"));

        std::os::unix::fs::symlink("/tmp", root.join("a/link")).unwrap();
        assert!(top.open_or_create_dir("link").is_err());
        std::os::unix::fs::symlink("/tmp/nowhere", root.join("a/b/l.csv")).unwrap();
        assert!(dir.create_file("l.csv").is_err());
        assert!(!Path::new("/tmp/nowhere").exists());
        assert!(dir.create_file("../y").is_err());

        let d1 = top.create_unique_dir("run", "_x").unwrap();
        let d2 = top.create_unique_dir("run", "_x").unwrap();
        assert_eq!(d1.path(), root.join("a/run_x"));
        assert_eq!(d2.path(), root.join("a/run_1_x"));
        // A directory that moves keeps receiving what we write into it.
        fs::rename(root.join("a/run_x"), root.join("a/moved")).unwrap();
        d1.create_file("f").unwrap();
        assert!(root.join("a/moved/f").exists());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn output_root_follows_only_our_own_symlinks() {
        let root = tmp("links");
        fs::create_dir_all(root.join("real")).unwrap();
        // Ours (the test's user owns it): followed, also in the middle of the path.
        std::os::unix::fs::symlink("real", root.join("ours")).unwrap();
        let d = Dir::open_root(&root.join("ours/sub")).unwrap();
        d.create_file("f").unwrap();
        assert!(root.join("real/sub/f").exists());
        assert!(Dir::open_root(&root.join("real/../ours")).is_ok());
        fs::write(root.join("file"), "x").unwrap();
        let e = Dir::open_root(&root.join("file/sub")).unwrap_err();
        assert!(format!("{e:#}").contains("not a directory"), "{e:#}");
        fs::remove_dir_all(&root).unwrap();
    }
}
