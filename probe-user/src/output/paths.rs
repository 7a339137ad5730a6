//! msMemScope's rules for the paths results are written to, checked before anything is
//! traced or read: the output directory (`-o`) and single output files (`--report`,
//! `report -o`). `cwd` is passed in; relative paths are resolved against it lexically.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::log::shown_os;
use crate::settings::Refused;

/// Relative to the current directory.
pub const DEFAULT_OUTPUT_DIR: &str = "memscopeDumpResults";
/// msMemScope's output path limits: bytes in a path, bytes in a component, '/' separators.
pub const MAX_PATH_LEN: usize = 4096;
pub const MAX_PATH_COMPONENT_LEN: usize = 255;
pub const MAX_PATH_SLASHES: usize = 32;

pub fn is_readable(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    unsafe { libc::access(c.as_ptr(), libc::R_OK) == 0 }
}

/// Make `path` absolute against `cwd`, resolving "." and ".." lexically.
pub fn lexical_absolute(path: &Path, cwd: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for comp in cwd.join(path).components() {
        match comp {
            Component::ParentDir => drop(out.pop()),
            Component::Normal(s) => out.push(s),
            _ => {}
        }
    }
    out
}

/// A value longer than `max` bytes, refused without showing it.
pub fn too_long(v: &OsStr, max: usize) -> Result<(), Refused> {
    match v.len() > max {
        true => Err(Refused {
            part: None,
            why: format!("it is {} bytes long, more than {max}", v.len()),
        }),
        false => Ok(()),
    }
}

/// Check an absolute output directory against msMemScope's output path rules; `Err` is why not.
pub fn check_output_dir(abs: &Path) -> Result<(), String> {
    let Some(s) = abs.to_str() else {
        let path = shown_os(abs.as_os_str());
        return Err(format!("the absolute path '{path}' is not valid UTF-8"));
    };
    let allowed = |c: char| {
        matches!(c, '.' | '/' | '_' | '-' | '~')
            || c.is_ascii_alphanumeric()
            || c.is_ascii_whitespace()
            || ('\u{4e00}'..='\u{9fa5}').contains(&c)
    };
    let slashes = s.bytes().filter(|&b| b == b'/').count();
    if let Some(c) = s.chars().find(|&c| !allowed(c)) {
        Err(format!(
            "the absolute path '{s}' contains '{c}'; allowed are letters, digits, \
             '.', '/', '_', '-', '~', whitespace and CJK characters U+4E00..U+9FA5"
        ))
    } else if s.len() > MAX_PATH_LEN {
        let len = s.len();
        Err(format!(
            "the absolute path is {len} bytes long, more than {MAX_PATH_LEN}"
        ))
    } else if let Some(comp) = s.split('/').find(|c| c.len() > MAX_PATH_COMPONENT_LEN) {
        let comp: String = comp.chars().take(32).collect();
        Err(format!(
            "the path component '{comp}...' is longer than {MAX_PATH_COMPONENT_LEN} bytes"
        ))
    } else if slashes > MAX_PATH_SLASHES {
        Err(format!(
            "the absolute path '{s}' has {slashes} '/' separators, more than {MAX_PATH_SLASHES}"
        ))
    } else {
        match std::fs::metadata(abs) {
            Ok(md) if !md.is_dir() => Err(format!("'{s}' exists and is not a directory")),
            Ok(_) if !is_readable(abs) => Err(format!("'{s}' exists but is not readable")),
            _ => Ok(()),
        }
    }
}

/// `-o/--output-path DIR`: absolute, lexically resolved, under msMemScope's path rules.
pub fn output_dir(raw: &OsStr, cwd: &Path) -> Result<PathBuf, Refused> {
    let Some(value) = raw.to_str() else {
        let why = "invalid output path, it is not valid UTF-8";
        return Err(Refused::new(&shown_os(raw), why));
    };
    let bad = |why: &str| Err(Refused::new(value, why));
    if value.trim().is_empty() {
        return bad("the output path must not be empty (default: ./memscopeDumpResults)");
    }
    too_long(raw, MAX_PATH_LEN)?;
    if let Some(c) = value.chars().next().filter(|c| "=+-@".contains(*c)) {
        return bad(&format!(
            "invalid output path, it must not start with '{c}' (nor with '=', '+', '-' or '@')"
        ));
    }
    let abs = lexical_absolute(Path::new(value), cwd);
    match check_output_dir(&abs) {
        Ok(()) => Ok(abs),
        Err(why) => bad(&format!("invalid output path: {why}")),
    }
}

/// [`DEFAULT_OUTPUT_DIR`] under `cwd`, if it passes the rules; `Err` is why not.
pub fn default_output_dir(cwd: &Path) -> Result<PathBuf, String> {
    let abs = cwd.join(DEFAULT_OUTPUT_DIR);
    check_output_dir(&abs).map_err(|why| {
        format!(
            "invalid output path: the default output directory is unusable: {why}; \
             choose another with -o/--output-path"
        )
    })?;
    Ok(abs)
}

/// An output file path: UTF-8, not empty, not a directory or a symlink.
pub fn output_file(raw: &OsStr, cwd: &Path) -> Result<PathBuf, Refused> {
    let Some(value) = raw.to_str().filter(|v| !v.trim().is_empty()) else {
        let why = "expected a file name (UTF-8, not empty)";
        return Err(Refused::new(&shown_os(raw), why));
    };
    too_long(raw, MAX_PATH_LEN)?;
    let abs = lexical_absolute(Path::new(value), cwd);
    match std::fs::symlink_metadata(&abs) {
        Ok(md) if md.is_dir() => Err(Refused::new(
            value,
            "is a directory; name the file to write, e.g. DIR/report.html",
        )),
        Ok(md) if md.is_symlink() => Err(Refused::new(
            value,
            "is a symbolic link; name the file itself",
        )),
        _ => Ok(abs),
    }
}
