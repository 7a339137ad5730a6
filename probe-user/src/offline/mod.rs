//! Work on dumps that were already written: read them ([`reader`]), compare two runs
//! ([`compare`], `--compare`) and run the leak analysis after the fact ([`analyze`],
//! `memscope-bpf analyze`).
//!
//! Inputs may be our own dumps or msMemScope's (CSV in the current layout or the 2025-04 one,
//! or the SQLite db). Problems with an input are [`InputError`]s, which the command turns into
//! exit code 2 with the file and line in the message.
//!
//! A second entry, after the run: uses `analysis`, `state`, `events`, `output`, `settings`,
//! `digits` and `log`; never `trace`, `session`, `report`, `agent` or the front end `cli`
//! (tests/layout.rs): the commands take [`OfflineSettings`], which `cli` fills.

pub mod analyses;
pub mod analyze;
pub mod compare;
pub mod reader;

use std::ffi::OsStr;
use std::ops::RangeInclusive;
use std::{
    fmt,
    path::{Path, PathBuf},
};

use crate::log::shown_os;
use crate::output::paths::{MAX_PATH_LEN, is_readable, too_long};
use crate::settings::{Refused, split_list_os};

/// What `--compare` and `analyze` take from the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OfflineSettings {
    /// Where the results go (a process directory is made under it, as a traced run's).
    pub output_dir: PathBuf,
    /// `--level`: which rows `--compare` lines up.
    pub levels: crate::settings::Levels,
    /// The config.json written beside the results.
    pub config_json: String,
}

/// Largest accepted input dump (8 GiB).
pub const MAX_COMPARE_INPUT_BYTES: u64 = 8 << 30;

/// Something wrong with an input file: where (file, and line or row when known) and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputError {
    pub path: String,
    /// `line 12` for CSV, `row 3` for a db; `None` for the file as a whole.
    pub location: Option<String>,
    pub message: String,
}

impl InputError {
    pub fn file(path: &Path, message: impl Into<String>) -> Self {
        InputError {
            path: path.display().to_string(),
            location: None,
            message: message.into(),
        }
    }

    pub fn at(path: &Path, location: impl Into<String>, message: impl Into<String>) -> Self {
        InputError {
            path: path.display().to_string(),
            location: Some(location.into()),
            message: message.into(),
        }
    }

    /// CSV location: `file:LINE: message`.
    pub fn line(path: &Path, line: u64, message: impl Into<String>) -> Self {
        Self::at(path, line.to_string(), message)
    }
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.location {
            Some(l) if l.chars().all(|c| c.is_ascii_digit()) => {
                write!(f, "{}:{l}: {}", self.path, self.message)
            }
            Some(l) => write!(f, "{}: {l}: {}", self.path, self.message),
            None => write!(f, "{}: {}", self.path, self.message),
        }
    }
}

impl std::error::Error for InputError {}

/// The input rules of `--input-path`: an existing regular file (not a symlink, checked without
/// following it), at most 8 GiB.
pub fn check_input_file(path: &Path) -> Result<u64, InputError> {
    let md = std::fs::symlink_metadata(path)
        .map_err(|e| InputError::file(path, format!("cannot be read: {e}")))?;
    if md.file_type().is_symlink() {
        return Err(InputError::file(
            path,
            "is a symbolic link; give the file itself",
        ));
    }
    if !md.is_file() {
        return Err(InputError::file(path, "is not a regular file"));
    }
    if md.len() > MAX_COMPARE_INPUT_BYTES {
        return Err(InputError::file(
            path,
            format!("is larger than 8 GiB ({} bytes)", md.len()),
        ));
    }
    Ok(md.len())
}

/// The inputs named by one `--input-path` value (a list): `counts` of them (else the refusal says
/// `expected`), each a readable file under [`check_input_file`]'s rules or, where `dirs`, a run
/// directory.
pub fn input_paths(
    v: &OsStr,
    counts: RangeInclusive<usize>,
    expected: &str,
    dirs: bool,
) -> Result<Vec<PathBuf>, Refused> {
    too_long(v, if dirs { 2 * MAX_PATH_LEN } else { MAX_PATH_LEN })?;
    let (whole, tokens) = (shown_os(v), split_list_os(v));
    let bad = |why: String| Refused::new(&whole, why);
    if !counts.contains(&tokens.len()) {
        return Err(bad(format!("{expected}, got {}", tokens.len())));
    }
    let input = |t: &OsStr| {
        let path = PathBuf::from(t);
        match std::fs::symlink_metadata(&path) {
            Ok(md) if dirs && md.is_dir() => return Ok(path),
            Err(e) if dirs => return Err(bad(format!("cannot read '{}': {e}", shown_os(t)))),
            _ => {}
        }
        let t = shown_os(t);
        match check_input_file(&path) {
            Err(e) => Err(bad(format!("invalid paths, '{t}' {}", e.message))),
            Ok(_) if !is_readable(&path) => {
                Err(bad(format!("invalid paths, '{t}' is not readable")))
            }
            Ok(_) => Ok(path),
        }
    };
    tokens.into_iter().map(input).collect()
}

/// Text for a message: control characters escaped, cut to `max` characters.
pub(crate) fn excerpt(s: &str, max: usize) -> String {
    let mut out = String::new();
    for (n, c) in s.chars().enumerate() {
        if n == max {
            out.push_str("...");
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_display_names_file_and_line() {
        let p = Path::new("/x/d.csv");
        assert_eq!(
            InputError::line(p, 7, "bad ID").to_string(),
            "/x/d.csv:7: bad ID"
        );
        assert_eq!(
            InputError::at(p, "row 3", "bad ID").to_string(),
            "/x/d.csv: row 3: bad ID"
        );
        assert_eq!(InputError::file(p, "empty").to_string(), "/x/d.csv: empty");
        assert_eq!(excerpt("a\nb", 10), "a\\nb");
        assert_eq!(excerpt("abcdef", 3), "abc...");
    }

    #[test]
    fn input_file_rules() {
        let dir = std::env::temp_dir().join(format!("memscope-offline-in-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("a.csv");
        std::fs::write(&f, "x").unwrap();
        assert_eq!(check_input_file(&f).unwrap(), 1);
        let l = dir.join("l.csv");
        std::os::unix::fs::symlink(&f, &l).unwrap();
        assert!(
            check_input_file(&l)
                .unwrap_err()
                .message
                .contains("symbolic link")
        );
        assert!(
            check_input_file(&dir)
                .unwrap_err()
                .message
                .contains("regular file")
        );
        assert!(
            check_input_file(&dir.join("nope"))
                .unwrap_err()
                .message
                .contains("cannot be read")
        );
        let big = dir.join("big.csv");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_COMPARE_INPUT_BYTES + 1)
            .unwrap();
        assert!(
            check_input_file(&big)
                .unwrap_err()
                .message
                .contains("8 GiB")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
