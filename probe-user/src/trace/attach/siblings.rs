//! The planner's queue of a directory's shared objects, planned while the process that
//! opened one of them runs on (`Planner::plan_next`), and at its stops (`plan_ahead_at_stop`).
//!
//! A program that opens one unplanned shared object of a directory (a plugin or extension
//! directory) often opens its siblings next, in name order, each a stop of its own in launch
//! mode. The directory is queued at the first one and listed later (listing 200 entries is
//! ~0.1-0.3 ms); the directory queued last is listed first, and its objects go to the front of
//! the queue: the process is there now. An object it opens before its turn moves the queue on
//! past it (it likely opens the next ones next).

use super::files::memchr_so;
use std::collections::{HashSet, VecDeque};
use std::ffi::OsString;
use std::hash::{BuildHasher, RandomState};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// A directory larger than this (a system library directory) is not planned object by object.
const MAX_SIBLINGS: usize = 256;

/// A listed directory: its path for us (host) and as the target names it (shown).
type Dir = Arc<(PathBuf, PathBuf)>;

#[derive(Default)]
pub(super) struct Siblings {
    /// Directories queued already (each is queued once).
    queued_dirs: HashSet<PathBuf>,
    /// Directories to list, newest first, as (host, shown) paths.
    to_list: VecDeque<(PathBuf, PathBuf)>,
    /// Objects to plan: their directory and name.
    objects: VecDeque<(Dir, OsString)>,
    /// Keys (`key`) of the host paths in `objects`: is an object opened one of them, without
    /// a pass over the queue or a path built for each entry.
    keys: HashSet<u64>,
    hasher: RandomState,
    /// When the oldest work still queued was queued (for the debug line).
    pub(super) since: Option<Instant>,
}

impl Siblings {
    /// Queues the directory of `full` (`shown` as the target names it), once.
    pub(super) fn queue_dir_of(&mut self, full: &Path, shown: &Path) {
        let (Some(dir), Some(shown_dir)) = (full.parent(), shown.parent()) else {
            return;
        };
        if self.queued_dirs.insert(dir.to_path_buf()) {
            self.since.get_or_insert_with(Instant::now);
            self.to_list
                .push_front((dir.to_path_buf(), shown_dir.to_path_buf()));
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.objects.is_empty() && self.to_list.is_empty()
    }

    pub(super) fn has_unlisted(&self) -> bool {
        !self.to_list.is_empty()
    }

    /// Lists the newest queued directory: its shared objects, in name order (the order a
    /// program loading "every plugin" usually goes in), go to the front of the queue.
    /// Returns false when no directory waited.
    pub(super) fn list_next(&mut self) -> bool {
        let Some((dir, shown_dir)) = self.to_list.pop_front() else {
            return false;
        };
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return true;
        };
        let mut names: Vec<OsString> = entries
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| memchr_so(n.as_bytes()))
            .take(MAX_SIBLINGS + 1)
            .collect();
        if names.len() > MAX_SIBLINGS {
            return true;
        }
        names.sort();
        let listed: Dir = Arc::new((dir, shown_dir));
        for name in names.into_iter().rev() {
            if self.keys.insert(self.key(&listed.0, &name)) {
                self.objects.push_front((listed.clone(), name));
            }
        }
        true
    }

    /// The next object to plan, as (host, shown) paths.
    pub(super) fn pop(&mut self) -> Option<(PathBuf, PathBuf)> {
        let (dir, name) = self.objects.pop_front()?;
        self.keys.remove(&self.key(&dir.0, &name));
        Some((dir.0.join(&name), dir.1.join(&name)))
    }

    /// A process opened `full`: if it is queued, the queue goes on from the object after it.
    pub(super) fn opened(&mut self, full: &Path) {
        let (Some(dir), Some(name)) = (full.parent(), full.file_name()) else {
            return;
        };
        if !self.keys.contains(&self.key(dir, name)) {
            return;
        }
        if let Some(at) = self
            .objects
            .iter()
            .position(|(d, n)| n.as_os_str() == name && d.0.as_os_str() == dir.as_os_str())
        {
            self.objects.rotate_left(at + 1);
        }
    }

    /// A hash of a host path given as directory and name (its bytes, not its components).
    fn key(&self, dir: &Path, name: &std::ffi::OsStr) -> u64 {
        self.hasher
            .hash_one((dir.as_os_str().as_bytes(), name.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn the_newest_directory_comes_first_in_name_order_and_an_open_moves_the_queue_on() {
        let root = std::env::temp_dir().join(format!("memscope-siblings-{}", std::process::id()));
        let (a, b) = (root.join("a"), root.join("b"));
        fs::create_dir_all(&a).unwrap();
        fs::create_dir_all(&b).unwrap();
        for name in ["libz.so", "liby.so.1", "notes.txt", "libx.so"] {
            fs::write(a.join(name), b"").unwrap();
        }
        fs::write(b.join("libb.so"), b"").unwrap();
        let mut s = Siblings::default();
        s.queue_dir_of(&a.join("libx.so"), Path::new("/shown/a/libx.so"));
        s.queue_dir_of(&b.join("libb.so"), Path::new("/shown/b/libb.so"));
        s.queue_dir_of(&a.join("liby.so.1"), Path::new("/shown/a/liby.so.1"));
        assert!(s.list_next() && s.list_next() && !s.list_next());
        // b was queued last: listed first, then a's objects went in front of it.
        s.opened(&a.join("libx.so"));
        let order: Vec<(PathBuf, PathBuf)> = std::iter::from_fn(|| s.pop()).collect();
        assert_eq!(
            order,
            [
                (a.join("liby.so.1"), PathBuf::from("/shown/a/liby.so.1")),
                (a.join("libz.so"), PathBuf::from("/shown/a/libz.so")),
                (b.join("libb.so"), PathBuf::from("/shown/b/libb.so")),
                (a.join("libx.so"), PathBuf::from("/shown/a/libx.so")),
            ]
        );
        assert!(s.is_empty() && s.keys.is_empty());
        fs::remove_dir_all(&root).unwrap();
    }
}
