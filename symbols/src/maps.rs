//! `/proc/PID/maps`: which files a process has mapped, and where.

use std::{fs, path::PathBuf};

use anyhow::{Context, Result};

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapEntry {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    pub offset: u64,
    /// Device as `major:minor` in hex, as the kernel prints it.
    pub dev: String,
    pub inode: u64,
    /// The mapped path; `None` for anonymous mappings and pseudo-paths like `[heap]`.
    pub path: Option<PathBuf>,
    /// The kernel appended ` (deleted)`: the file was removed or replaced after mapping.
    pub deleted: bool,
}

impl MapEntry {
    pub fn is_executable(&self) -> bool {
        self.perms.as_bytes().get(2) == Some(&b'x')
    }

    /// Where the mapped file opens from outside the process whatever its mount namespace,
    /// even deleted or replaced: `/proc/PID/map_files/START-END`.
    pub fn map_files_path(&self, pid: u32) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{pid}/map_files/{:x}-{:x}",
            self.start, self.end
        ))
    }

    /// The file offset of run-time address `addr`, when this mapping holds it.
    pub fn file_offset_of(&self, addr: u64) -> Option<u64> {
        (self.start <= addr && addr < self.end).then(|| self.offset + (addr - self.start))
    }
}

/// Reads and parses `/proc/<pid>/maps`.
pub fn read_maps(pid: u32) -> Result<Vec<MapEntry>> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps"))
        .with_context(|| format!("cannot read /proc/{pid}/maps"))?;
    Ok(parse_maps(&text))
}

/// Parses the text of a maps file; malformed lines are skipped.
pub fn parse_maps(text: &str) -> Vec<MapEntry> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MapEntry> {
    let mut rest = line;
    let mut field = || {
        let trimmed = rest.trim_start();
        let end = trimmed.find(' ').unwrap_or(trimmed.len());
        let (f, r) = trimmed.split_at(end);
        rest = r;
        f
    };
    let range = field();
    let perms = field().to_string();
    let offset = u64::from_str_radix(field(), 16).ok()?;
    let dev = field().to_string();
    let inode = field().parse().ok()?;
    let (start, end) = range.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    let name = rest.trim_start();
    let (name, deleted) = match name.strip_suffix(" (deleted)") {
        Some(n) => (n, true),
        None => (name, false),
    };
    let path = (name.starts_with('/')).then(|| PathBuf::from(name));
    Some(MapEntry {
        start,
        end,
        perms,
        offset,
        dev,
        inode,
        path,
        deleted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapping_gives_the_file_offset_and_map_files_path_of_an_address() {
        let m = &parse_maps("7f1e2d000000-7f1e2d100000 r-xp 00028000 fd:01 99 /lib/x.so\n")[0];
        assert_eq!(m.file_offset_of(0x7f1e2d000010), Some(0x28010));
        assert_eq!(m.file_offset_of(0x7f1e2d100000), None);
        assert_eq!(m.file_offset_of(0x7f1e2cffffff), None);
        assert_eq!(
            m.map_files_path(42),
            PathBuf::from("/proc/42/map_files/7f1e2d000000-7f1e2d100000")
        );
    }

    #[test]
    fn parses_file_anonymous_and_deleted_lines() {
        let text = "\
55d0c0a00000-55d0c0a02000 r--p 00000000 fd:01 1234                       /usr/bin/cat
7f1e2c000000-7f1e2c021000 rw-p 00000000 00:00 0 
7f1e2d000000-7f1e2d100000 r-xp 00028000 fd:01 99 /tmp/lib with space.so (deleted)
7ffd1a000000-7ffd1a021000 rw-p 00000000 00:00 0                          [stack]
garbage
";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 4);
        assert_eq!(maps[0].start, 0x55d0c0a00000);
        assert_eq!(
            maps[0].path.as_deref(),
            Some(std::path::Path::new("/usr/bin/cat"))
        );
        assert_eq!(maps[1].path, None);
        assert_eq!(maps[2].offset, 0x28000);
        assert_eq!(maps[2].inode, 99);
        assert!(maps[2].deleted && maps[2].is_executable());
        assert_eq!(
            maps[2].path.as_deref(),
            Some(std::path::Path::new("/tmp/lib with space.so"))
        );
        assert_eq!(maps[3].path, None);
    }

    #[test]
    fn reads_own_maps() {
        let maps = read_maps(std::process::id()).unwrap();
        let exe = fs::read_link("/proc/self/exe").unwrap();
        assert!(
            maps.iter()
                .any(|m| m.path.as_deref() == Some(exe.as_path()) && m.is_executable())
        );
    }
}
