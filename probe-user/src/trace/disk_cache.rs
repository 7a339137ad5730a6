//! Files the tracer keeps across runs (what it learnt of libraries, so that the next run does
//! not read them again): where they live (`$MEMSCOPE_BPF_CACHE`, else
//! `~/.cache/memscope-bpf`) and whether one may be believed. A cache only ever saves work:
//! deleting the directory is always safe. Each file is used only when we own it and its
//! directory and nobody else can write either (an entry planted by another user could make
//! the tracer skip a probe).

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Environment variable naming the cache directory.
pub const CACHE_ENV: &str = "MEMSCOPE_BPF_CACHE";

/// The cache file `name` (it may not exist yet); `None` without `$MEMSCOPE_BPF_CACHE` or `$HOME`.
pub fn file(name: &str) -> Option<PathBuf> {
    let dir = match std::env::var_os(CACHE_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(std::env::var_os("HOME")?).join(".cache/memscope-bpf"),
    };
    Some(dir.join(name))
}

/// The cache file and its directory are ours, no symlinks, writable by nobody else.
pub fn trusted(cache: &Path) -> bool {
    private(cache) && cache.parent().is_some_and(private)
}

/// `path` is ours, not a symlink, and neither group- nor world-writable.
pub fn private(path: &Path) -> bool {
    // SAFETY: no preconditions.
    let me = unsafe { libc::geteuid() };
    fs::symlink_metadata(path)
        .is_ok_and(|m| !m.file_type().is_symlink() && m.uid() == me && m.mode() & 0o022 == 0)
}

/// Opens `cache` for appending, creating it (mode 0600) and its directory (0700) as needed;
/// `None` when the directory cannot be made or is not private.
pub fn open_append(cache: &Path) -> Option<fs::File> {
    let dir = cache.parent()?;
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .ok()?;
    }
    if !private(dir) {
        return None;
    }
    fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(cache)
        .ok()
}
