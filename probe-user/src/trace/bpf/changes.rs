//! Probed files written in place. The kernel copies a probed instruction out of the file
//! when the probe first goes into a process, and keeps that copy for as long as any tracer
//! has a probe at that offset of that inode: a library rewritten in place (`cp` over it, the
//! same inode) would have every later process run the old file's instruction there instead
//! of its own, and trap at offsets that may now be mid-instruction (seen: a process crashing
//! in the kernel's out-of-line slot, on a stand-in's zero bytes, while an agent probed the
//! file). So every file with probes is watched (inotify, on its inode: whatever the path or
//! the writer) and its first write removes all our probes from it; the planner forgets it,
//! and plans it afresh when a process opens or maps it again.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use aya::programs::UProbe;

use super::{Bpf, program};

/// The file a probe is on, as the kernel keys probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileInode {
    pub dev: u64,
    pub ino: u64,
}

impl FileInode {
    pub fn of(path: &Path) -> Option<FileInode> {
        let meta = fs::metadata(path).ok()?;
        Some(FileInode {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }
}

/// A watched file written to: its probes (if any) are gone.
#[derive(Debug)]
pub struct ChangedFile {
    pub inode: FileInode,
    /// The path it was probed by.
    pub path: PathBuf,
    /// Links closed (a multi-uprobe link holds many probes; a perf link, one); 0 for a
    /// file watched without probes (`watch_file`).
    pub links: usize,
}

/// The inotify watches on probed files.
pub(super) struct ChangeWatch {
    /// None where inotify is unavailable: files are then not watched (as before).
    fd: Option<OwnedFd>,
    by_wd: HashMap<i32, (FileInode, PathBuf)>,
    by_inode: HashMap<FileInode, i32>,
}

impl ChangeWatch {
    pub(super) fn new() -> ChangeWatch {
        // SAFETY: plain syscall; the descriptor is owned below.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            crate::log::debug(&format!(
                "no inotify ({}): a probed library written in place keeps its old probes",
                std::io::Error::last_os_error()
            ));
        }
        ChangeWatch {
            // SAFETY: a fresh descriptor nobody else owns.
            fd: (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) }),
            by_wd: HashMap::new(),
            by_inode: HashMap::new(),
        }
    }

    /// Watches `path` (whose inode is `inode`) for writes, once per inode.
    pub(super) fn watch(&mut self, path: &Path, inode: FileInode) {
        let Some(fd) = &self.fd else { return };
        if self.by_inode.contains_key(&inode) {
            return;
        }
        let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
            return;
        };
        // SAFETY: plain syscall on a NUL-terminated path.
        let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), libc::IN_MODIFY) };
        if wd < 0 {
            crate::log::debug(&format!(
                "cannot watch {} for writes ({}): written in place, it would keep its old probes",
                path.display(),
                std::io::Error::last_os_error()
            ));
            return;
        }
        // The path may name another file by now: keep the watch only on the probed one.
        if FileInode::of(path) != Some(inode) {
            // SAFETY: plain syscall; the watch is ours.
            unsafe { libc::inotify_rm_watch(fd.as_raw_fd(), wd) };
            return;
        }
        self.by_wd.insert(wd, (inode, path.to_path_buf()));
        self.by_inode.insert(inode, wd);
    }

    /// A copy of the inotify descriptor, for the event loop to wait on.
    pub(super) fn fd(&self) -> Option<OwnedFd> {
        self.fd.as_ref()?.try_clone().ok()
    }

    /// The watched files written to since the last call (each once, its watch removed).
    pub(super) fn take_written(&mut self) -> Vec<(FileInode, PathBuf)> {
        let Some(fd) = self.fd.as_ref().map(|f| f.as_raw_fd()) else {
            return Vec::new();
        };
        let mut written = Vec::new();
        let mut overflowed = false;
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reads into our buffer; the descriptor is non-blocking.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            let mut at = 0;
            while at + size_of::<libc::inotify_event>() <= n as usize {
                // SAFETY: the kernel wrote whole events; read unaligned from the byte buffer.
                let ev: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(buf.as_ptr().add(at).cast()) };
                at += size_of::<libc::inotify_event>() + ev.len as usize;
                if ev.mask & libc::IN_Q_OVERFLOW != 0 {
                    overflowed = true;
                } else if ev.mask & libc::IN_IGNORED != 0 {
                    // The kernel dropped the watch (the file is gone): nothing to write to.
                    if let Some((inode, _)) = self.by_wd.remove(&ev.wd) {
                        self.by_inode.remove(&inode);
                    }
                } else if ev.mask & libc::IN_MODIFY != 0
                    && let Some(file) = self.by_wd.get(&ev.wd).cloned()
                {
                    self.unwatch(file.0);
                    written.push(file);
                }
            }
        }
        if overflowed {
            // Events were lost: every watched file must be taken as written (rare: each
            // file's events merge, and a written file's watch goes at its first).
            let all: Vec<(FileInode, PathBuf)> = self.by_wd.values().cloned().collect();
            for file in all {
                self.unwatch(file.0);
                written.push(file);
            }
        }
        written
    }

    fn unwatch(&mut self, inode: FileInode) {
        if let Some(wd) = self.by_inode.remove(&inode) {
            self.by_wd.remove(&wd);
            if let Some(fd) = &self.fd {
                // SAFETY: plain syscall; the watch is ours.
                unsafe { libc::inotify_rm_watch(fd.as_raw_fd(), wd) };
            }
        }
    }
}

impl Bpf {
    /// Watches `path` for writes though it may have no probes: a vendor library planned
    /// without them (a release lacking the functions, a stand-in) may gain them when written.
    pub fn watch_file(&mut self, path: &Path) {
        let canonical = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        if let Some(inode) = FileInode::of(&canonical) {
            self.changes.watch(&canonical, inode);
        }
    }

    /// A descriptor that turns readable when a probed file is written (see
    /// [`Bpf::drop_written_files`]); None without inotify.
    pub fn written_files_fd(&self) -> Option<OwnedFd> {
        self.changes.fd()
    }

    /// Removes every probe of each probed file written since the last call, and says which.
    /// Waits until the kernel has taken them out: a process that maps the new file
    /// afterwards gets no old instruction.
    pub fn drop_written_files(&mut self) -> Vec<ChangedFile> {
        let written = self.changes.take_written();
        let mut changed = Vec::new();
        for (inode, path) in written {
            let links = self.drop_file_probes(inode);
            changed.push(ChangedFile { inode, path, links });
        }
        changed
    }

    /// Closes every link on `inode` (inode-wide, per process, perf links) and forgets the
    /// requests that would make them again for processes that join; returns how many.
    fn drop_file_probes(&mut self, inode: FileInode) -> usize {
        let on = Some(inode);
        let mut closing: Vec<_> = self.links.extract_if(.., |(i, _)| *i == on).collect();
        for links in self.process_links.values_mut() {
            closing.extend(links.extract_if(.., |(i, _)| *i == on));
        }
        self.scoped_requests.retain(|r| r.inode != on);
        let mut count = closing.len();
        // One thread per link, joined: the kernel's grace periods overlap.
        let threads: Vec<_> = closing
            .into_iter()
            .filter_map(|(_, link)| super::detach::close_in_background(link))
            .collect();
        for t in threads {
            let _ = t.join();
        }
        let gone: Vec<_> = self
            .perf_links
            .extract_if(.., |(i, _, _)| *i == on)
            .collect();
        for (_, prog, id) in gone {
            if let Ok(up) = program(&mut self.ebpf, prog)
                .and_then(|p| <&mut UProbe>::try_from(p).map_err(anyhow::Error::from))
                && up.detach(id).is_ok()
            {
                count += 1;
            }
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watched_file_is_reported_once_at_its_first_write_and_not_after_deletion() {
        let dir = std::env::temp_dir().join(format!("changes-unit-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("liba.so"), dir.join("libb.so"));
        fs::write(&a, b"one").unwrap();
        fs::write(&b, b"one").unwrap();
        let mut watch = ChangeWatch::new();
        assert!(watch.fd.is_some(), "inotify is missing here");
        let (ia, ib) = (FileInode::of(&a).unwrap(), FileInode::of(&b).unwrap());
        watch.watch(&a, ia);
        watch.watch(&a, ia);
        watch.watch(&b, ib);
        assert_eq!(watch.by_wd.len(), 2, "one watch per inode");
        assert!(watch.take_written().is_empty(), "nothing written yet");
        // Reading it is no write.
        let _ = fs::read(&a).unwrap();
        assert!(watch.take_written().is_empty());

        fs::write(&a, b"two, longer").unwrap();
        fs::write(&a, b"three").unwrap();
        assert_eq!(watch.take_written(), vec![(ia, a.clone())]);
        assert!(
            watch.take_written().is_empty(),
            "its watch went at the first write"
        );

        // Deleted, not written: the kernel drops the watch and nothing is reported.
        fs::remove_file(&b).unwrap();
        assert!(watch.take_written().is_empty());
        assert!(watch.by_inode.is_empty() && watch.by_wd.is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}
