//! Creating output directories and files with fixed permissions, never through a symlink.

use std::{
    fs::{self, DirBuilder, File, OpenOptions},
    io,
    os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt},
    path::Path,
};

use anyhow::{Context, Result, bail};

pub const DIR_MODE: u32 = 0o750;
pub const FILE_MODE: u32 = 0o640;

/// Creates `dir` (and missing parents) with mode 0750. An existing component that is a
/// symlink is refused for the directories we create below `trusted_root`.
pub fn create_dir_secure(trusted_root: &Path, dir: &Path) -> Result<()> {
    let mut builder = DirBuilder::new();
    builder.mode(DIR_MODE);
    if !trusted_root.exists() {
        builder
            .recursive(true)
            .create(trusted_root)
            .with_context(|| {
                format!("cannot create output directory {}", trusted_root.display())
            })?;
        fs::set_permissions(trusted_root, fs::Permissions::from_mode(DIR_MODE))?;
    }
    builder.recursive(false);
    let rel = dir.strip_prefix(trusted_root).unwrap_or(dir);
    let mut cur = trusted_root.to_path_buf();
    for comp in rel.components() {
        cur.push(comp);
        match fs::symlink_metadata(&cur) {
            Ok(meta) if meta.file_type().is_symlink() => {
                bail!("refusing to write through symlink {}", cur.display())
            }
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => bail!("{} exists and is not a directory", cur.display()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                builder
                    .create(&cur)
                    .with_context(|| format!("cannot create directory {}", cur.display()))?;
                fs::set_permissions(&cur, fs::Permissions::from_mode(DIR_MODE))?;
            }
            Err(e) => return Err(e).with_context(|| format!("cannot stat {}", cur.display())),
        }
    }
    Ok(())
}

/// Creates a new file with mode 0640; fails if anything (a symlink included) is already there.
pub fn create_file_secure(path: &Path) -> Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.set_permissions(fs::Permissions::from_mode(FILE_MODE))?;
    Ok(file)
}

/// Checks up front that we can create files in `dir` (creating it if needed), so a bad
/// `--output` fails before the target is started.
pub fn check_writable(dir: &Path) -> Result<()> {
    create_dir_secure(dir, dir)?;
    let probe = dir.join(format!(".memscope-bpf-write-test-{}", std::process::id()));
    create_file_secure(&probe)
        .with_context(|| format!("output directory {} is not writable", dir.display()))?;
    let _ = fs::remove_file(&probe);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("memscope-fsutil-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn creates_with_modes_and_refuses_symlinks() {
        let root = tmp("modes");
        let dir = root.join("a/b");
        create_dir_secure(&root, &dir).unwrap();
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            DIR_MODE
        );
        let f = dir.join("x.csv");
        create_file_secure(&f).unwrap();
        assert_eq!(
            fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            FILE_MODE
        );
        assert!(
            create_file_secure(&f).is_err(),
            "existing file must not be reused"
        );

        std::os::unix::fs::symlink("/tmp", root.join("link")).unwrap();
        assert!(create_dir_secure(&root, &root.join("link/sub")).is_err());
        std::os::unix::fs::symlink("/tmp/nowhere", dir.join("l.csv")).unwrap();
        assert!(create_file_secure(&dir.join("l.csv")).is_err());
        fs::remove_dir_all(&root).unwrap();
    }
}
