//! The initramfs writer: a newc cpio archive, which the kernel unpacks at boot.

use std::fs;
use std::io::{BufWriter, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{Context, Result};

/// A newc ("070701") cpio archive, the format the kernel unpacks an initramfs from.
pub struct Cpio {
    out: BufWriter<fs::File>,
    written: u64,
    ino: u32,
    dirs: std::collections::BTreeSet<String>,
}

impl Cpio {
    pub fn create(path: &Path) -> Result<Cpio> {
        let file =
            fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Cpio {
            out: BufWriter::new(file),
            written: 0,
            ino: 1,
            dirs: Default::default(),
        })
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) -> Result<()> {
        let ino = self.ino;
        self.ino += 1;
        let fields = [ino, mode, 0, 0, 1, 0, data.len() as u32, 0, 0, 0, 0];
        let mut head = String::from("070701");
        for f in fields {
            head.push_str(&format!("{f:08x}"));
        }
        head.push_str(&format!("{:08x}{:08x}", name.len() + 1, 0));
        self.put(head.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()?;
        self.put(data)?;
        self.pad()
    }

    fn put(&mut self, b: &[u8]) -> Result<()> {
        self.out.write_all(b)?;
        self.written += b.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> Result<()> {
        let n = (4 - self.written % 4) % 4;
        self.put(&[0u8; 3][..n as usize])
    }

    /// A directory and its parents, once each.
    pub fn dir(&mut self, name: &str) -> Result<()> {
        let name = name.trim_matches('/');
        if name.is_empty() || self.dirs.contains(name) {
            return Ok(());
        }
        if let Some((parent, _)) = name.rsplit_once('/') {
            self.dir(parent)?;
        }
        self.dirs.insert(name.to_owned());
        self.entry(name, 0o040755, &[])
    }

    fn parent(&mut self, name: &str) -> Result<()> {
        match name.rsplit_once('/') {
            Some((parent, _)) => self.dir(parent),
            None => Ok(()),
        }
    }

    pub fn symlink(&mut self, name: &str, to: &str) -> Result<()> {
        self.parent(name)?;
        self.entry(name, 0o120777, to.as_bytes())
    }

    pub fn bytes(&mut self, name: &str, data: &[u8], perm: u32) -> Result<()> {
        self.parent(name)?;
        self.entry(name, 0o100000 | perm, data)
    }

    pub fn file_at(&mut self, src: &Path, name: &str) -> Result<()> {
        let data = fs::read(src).with_context(|| format!("reading {}", src.display()))?;
        let perm = fs::metadata(src)?.permissions().mode() & 0o7777;
        self.bytes(name, &data, perm)
    }

    /// Everything under `src`, at `at` in the archive.
    pub fn tree(&mut self, src: &Path, at: &str) -> Result<()> {
        self.dir(at)?;
        let mut entries: Vec<_> = fs::read_dir(src)
            .with_context(|| format!("reading {}", src.display()))?
            .collect::<std::io::Result<_>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let path = e.path();
            let name = e.file_name();
            let name = name.to_str().context("non-UTF-8 file name")?;
            let inside = if at.is_empty() {
                name.to_owned()
            } else {
                format!("{at}/{name}")
            };
            let meta = fs::symlink_metadata(&path)?;
            if meta.file_type().is_symlink() {
                let to = fs::read_link(&path)?;
                self.symlink(&inside, to.to_str().context("non-UTF-8 link")?)?;
            } else if meta.is_dir() {
                self.tree(&path, &inside)?;
            } else if meta.is_file() {
                self.file_at(&path, &inside)?;
            }
        }
        Ok(())
    }

    pub fn finish(mut self) -> Result<u64> {
        self.entry("TRAILER!!!", 0, &[])?;
        self.out.flush()?;
        Ok(self.written)
    }
}
