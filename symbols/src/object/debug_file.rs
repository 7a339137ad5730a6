//! Separate debug files: the candidates (`.gnu_debuglink`, `.debug/`, debug roots,
//! `.build-id/`) and the check that one belongs to the object (build-id or debuglink CRC).

use std::{
    fs::File,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
};

use super::read::{Parts, Source, parts};

/// Debug-file search settings, captured when the object is parsed.
#[derive(Clone, Debug, Default)]
pub(crate) struct DebugSearch {
    /// The object's path as the process sees it (for `.gnu_debuglink` next to it).
    pub object_path: Option<PathBuf>,
    /// A prefix for paths in the process's mount namespace, e.g. `/proc/PID/root`.
    pub root: Option<PathBuf>,
    /// Global debug roots, e.g. `/usr/lib/debug`.
    pub debug_dirs: Vec<PathBuf>,
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Standard CRC-32 (as used by `.gnu_debuglink`).
pub(crate) fn crc32(mut crc: u32, data: &[u8]) -> u32 {
    static TABLE: OnceLock<[u32; 256]> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        t
    });
    crc = !crc;
    for b in data {
        crc = table[((crc ^ u32::from(*b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

fn file_crc(file: &File) -> Option<u32> {
    let mut crc = 0;
    let mut buf = vec![0u8; 1 << 16];
    let mut pos = 0u64;
    loop {
        let n = file.read_at(&mut buf, pos).ok()?;
        if n == 0 {
            return Some(crc);
        }
        crc = crc32(crc, &buf[..n]);
        pos += n as u64;
    }
}

/// Candidate debug files in the documented order: `.gnu_debuglink` next to the object, in
/// `.debug/` beside it, under each debug root + the object's directory; then
/// `<debug root>/.build-id/xx/rest.debug`.
fn debug_candidates(p: &Parts, search: &DebugSearch) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let rooted = |path: &Path| -> Vec<PathBuf> {
        let mut v = Vec::new();
        if let Some(root) = &search.root {
            v.push(root.join(path.strip_prefix("/").unwrap_or(path)));
        }
        v.push(path.to_path_buf());
        v
    };
    if let (Some((name, _)), Some(obj)) = (&p.debuglink, &search.object_path)
        && !name.is_empty()
        && !name.contains('/')
        && let Some(dir) = obj.parent()
    {
        out.extend(rooted(&dir.join(name)));
        out.extend(rooted(&dir.join(".debug").join(name)));
        for d in &search.debug_dirs {
            let rel = dir.strip_prefix("/").unwrap_or(dir);
            out.push(d.join(rel).join(name));
        }
    }
    if let Some(id) = &p.build_id
        && id.len() >= 2
    {
        let h = hex(id);
        for d in &search.debug_dirs {
            out.push(
                d.join(".build-id")
                    .join(&h[..2])
                    .join(format!("{}.debug", &h[2..])),
            );
        }
    }
    out
}

pub(crate) fn find_debug_file(p: &Parts, search: &DebugSearch) -> Option<(PathBuf, Source, Parts)> {
    for cand in debug_candidates(p, search) {
        let Ok(file) = File::open(&cand) else {
            continue;
        };
        if !file.metadata().is_ok_and(|m| m.is_file()) {
            continue;
        }
        let file = Arc::new(file);
        let src = Source::File(file.clone());
        let Ok(dp) = parts(&src) else { continue };
        // A debug file must belong to this object: same build-id, or the debuglink CRC
        // when there is no build-id to compare.
        let matches = match (&p.build_id, &dp.build_id) {
            (Some(a), Some(b)) => a == b,
            _ => match &p.debuglink {
                Some((_, crc)) => file_crc(&file) == Some(*crc),
                None => false,
            },
        };
        if matches {
            return Some((cand, src, dp));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_known_vector() {
        assert_eq!(crc32(0, b"123456789"), 0xcbf4_3926);
        let a = crc32(0, b"1234");
        assert_eq!(crc32(a, b"56789"), 0xcbf4_3926);
    }
}
