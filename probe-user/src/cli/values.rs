//! The value parsers clap is given: adapters that run a setting's own spelling rules
//! (`crate::settings`, `crate::report`'s `Formats` and `At`), the output path rules
//! (`crate::output::paths`) and offline's input rules, and name the option in their errors;
//! and the checks only the command line has (`--pid`, counts, `--steps`, `--lib`). Each is a
//! plain `fn(option name, raw value) -> Parsed<T>`; the raw value may not be UTF-8.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::str::FromStr;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Arg, Command};

use super::*;
use crate::log::{shown, shown_os};
use crate::offline::input_paths;
use crate::output::paths;
use crate::settings::*;

/// What a value parser returns: the value, or the whole message of a usage error.
pub type Parsed<T> = Result<T, CliError>;

/// A clap value parser made of a plain function of (option name, raw value).
#[derive(Clone, Copy)]
pub struct Check<T>(pub fn(&str, &OsStr) -> Parsed<T>);

impl<T: Clone + Send + Sync + 'static> clap::builder::TypedValueParser for Check<T> {
    type Value = T;

    fn parse_ref(&self, cmd: &Command, arg: Option<&Arg>, value: &OsStr) -> Result<T, clap::Error> {
        let name = arg.and_then(|a| a.get_long()).unwrap_or_default();
        (self.0)(&format!("--{name}"), value).map_err(|e| {
            // The message travels in the error's context; `from_clap` takes it out unchanged.
            let mut err = clap::Error::new(ErrorKind::ValueValidation).with_cmd(cmd);
            err.insert(ContextKind::Custom, ContextValue::String(e.message));
            err
        })
    }
}

thread_local! {
    static WARNINGS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// A notice for `Options::warnings` (deprecated forms, ignored parts): a value parser returns
/// only its value, so the notices wait here until `parse_from` collects them.
pub fn warn(message: String) {
    WARNINGS.with_borrow_mut(|w| {
        if !w.contains(&message) {
            w.push(message);
        }
    });
}

pub fn take_warnings() -> Vec<String> {
    WARNINGS.take()
}

pub fn deprecated(old: &str, new: &str) -> String {
    format!("'{old}' is deprecated, use '{new}' instead")
}

/// A list value (a newtype, so that clap's derive does not read `Vec` as "repeatable").
#[derive(Clone, Debug)]
pub struct List<T>(pub Vec<T>);

/// A refused value as the usage error naming the option. The reason holds the user's text as
/// given, so the whole message is escaped.
fn refused(opt: &str, r: Refused) -> CliError {
    let message = match r.part {
        Some(part) => format!("invalid {opt} value '{part}': {}", r.why),
        None => format!("invalid {opt} value: {}", r.why),
    };
    CliError::usage(shown(&message))
}

pub fn invalid(opt: &str, value: &str, what: &str) -> CliError {
    refused(opt, Refused::new(value, what))
}

fn utf8<'a>(opt: &str, v: &'a OsStr) -> Parsed<&'a str> {
    v.to_str()
        .ok_or_else(|| invalid(opt, &shown_os(v), "not valid UTF-8"))
}

/// A value under a setting's own spelling rules (`EventSet::parse`, ...); its notices become
/// warnings that name the option.
pub fn spelled<T>(
    opt: &str,
    v: &OsStr,
    parse: fn(&str, &mut Vec<Notice>) -> Result<T, Refused>,
) -> Parsed<T> {
    let mut notices = Vec::new();
    let value = parse(utf8(opt, v)?, &mut notices).map_err(|r| refused(opt, r))?;
    for notice in notices {
        warn(match notice {
            Notice::Deprecated { old, new } => {
                deprecated(&format!("{opt}={old}"), &format!("{opt}={new}"))
            }
            Notice::Ignored(why) => format!("{opt}: {why}"),
        });
    }
    Ok(value)
}

/// [`spelled`] for a type whose spelling rules are its `FromStr` (they have no notices).
pub fn parsed<T: FromStr<Err = Refused>>(opt: &str, v: &OsStr) -> Parsed<T> {
    spelled(opt, v, |s, _| s.parse())
}

/// A decimal count in `range` (no sign, no leading zeros), else the error says `what`.
pub fn count(opt: &str, v: &OsStr, range: RangeInclusive<u32>, what: &str) -> Parsed<u32> {
    let v = utf8(opt, v)?;
    parse_decimal(v, *range.start() == 0)
        .filter(|n| range.contains(n))
        .ok_or_else(|| invalid(opt, v, what))
}

pub fn ring_buffer_mib(opt: &str, v: &OsStr) -> Parsed<u32> {
    let what = "expected a power of two from 1 to 1024 (MiB)";
    let n = count(opt, v, 1..=MAX_RING_BUFFER_MIB, what)?;
    n.is_power_of_two()
        .then_some(n)
        .ok_or_else(|| invalid(opt, &n.to_string(), what))
}

pub fn pid(opt: &str, v: &OsStr) -> Parsed<u32> {
    let what = "expected a process id: a positive decimal integer without sign or leading zeros";
    let pid = count(opt, v, 1..=u32::MAX, what)?;
    if pid == std::process::id() {
        let message = format!("invalid {opt} value '{pid}': that is {PROGRAM_NAME} itself");
        return Err(CliError::usage(message));
    }
    match std::fs::symlink_metadata(format!("/proc/{pid}")) {
        Ok(_) => Ok(pid),
        Err(_) => Err(CliError::usage(format!("no process with pid {pid}"))),
    }
}

pub fn steps(opt: &str, v: &OsStr) -> Parsed<List<u32>> {
    let tokens = list(
        utf8(opt, v)?,
        "invalid steps, expected a list of step numbers >= 1",
    )
    .map_err(|r| refused(opt, r))?;
    if tokens.len() > MAX_STEPS {
        let what = format!("invalid steps, at most {MAX_STEPS} steps may be given");
        return Err(invalid(opt, &v.to_string_lossy(), &what));
    }
    let what =
        "invalid steps, expected an integer >= 1 without sign or leading zeros that fits 32 bits";
    let step = |t| parse_decimal(t, false).ok_or_else(|| invalid(opt, t, what));
    tokens
        .into_iter()
        .map(step)
        .collect::<Result<_, _>>()
        .map(List)
}

fn current_dir() -> Parsed<PathBuf> {
    std::env::current_dir()
        .map_err(|e| CliError::usage(format!("cannot determine the current directory: {e}")))
}

pub fn output_dir(opt: &str, raw: &OsStr) -> Parsed<PathBuf> {
    paths::output_dir(raw, &current_dir()?).map_err(|r| refused(opt, r))
}

pub fn default_output_dir() -> Parsed<PathBuf> {
    paths::default_output_dir(&current_dir()?).map_err(|why| CliError::usage(shown(&why)))
}

pub fn output_file(opt: &str, raw: &OsStr) -> Parsed<PathBuf> {
    paths::output_file(raw, &current_dir()?).map_err(|r| refused(opt, r))
}

/// The page `report` writes in its output directory (the other formats are named after it).
pub const REPORT_PAGE: &str = "memscope_report.html";

/// `report -o DIR`: the page's path, `DIR/memscope_report.html`, under the output directory
/// rules of every mode. A path ending in `.html` that is not a directory names the page
/// itself, as `report -o` did before it meant a directory everywhere (deprecated: a user who
/// wrote `-o run.html` would not expect a directory of that name).
pub fn report_output(opt: &str, raw: &OsStr) -> Parsed<PathBuf> {
    let cwd = current_dir()?;
    let lower = raw.to_string_lossy().to_ascii_lowercase();
    let names_a_page = lower.ends_with(".html") || lower.ends_with(".htm");
    if names_a_page && !std::path::Path::new(raw).is_dir() {
        let page = paths::output_file(raw, &cwd).map_err(|r| refused(opt, r))?;
        warn(format!(
            "'report {opt} FILE.html' is deprecated: {opt} names the output directory, as in              every mode (the page is then DIR/{REPORT_PAGE}); writing {} as asked",
            shown_os(page.as_os_str())
        ));
        return Ok(page);
    }
    let dir = paths::output_dir(raw, &cwd).map_err(|r| refused(opt, r))?;
    report_page_in(&dir, &format!("{opt} {}", shown_os(raw)))
}

/// `report` without `-o`: the page in the current directory.
pub fn default_report_page() -> Parsed<PathBuf> {
    report_page_in(&current_dir()?, "the current directory")
}

/// `DIR/memscope_report.html`, refused before anything is read when a directory or a
/// symbolic link has that name (the page is never written through a link).
fn report_page_in(dir: &std::path::Path, given: &str) -> Parsed<PathBuf> {
    let page = dir.join(REPORT_PAGE);
    let what = match std::fs::symlink_metadata(&page) {
        Ok(md) if md.is_dir() => "a directory",
        Ok(md) if md.is_symlink() => "a symbolic link",
        _ => return Ok(page),
    };
    Err(CliError::usage(format!(
        "report writes {REPORT_PAGE} in {given}, where {} is {what}; give another directory \
         with -o DIR",
        shown_os(page.as_os_str())
    )))
}

/// `--compare --input-path A,B`: exactly two dump files.
pub fn compare_inputs(opt: &str, v: &OsStr) -> Parsed<[PathBuf; 2]> {
    let expected = "invalid paths, expected exactly two comma-separated dump files";
    let inputs = input_paths(v, 2..=2, expected, false).map_err(|r| refused(opt, r))?;
    Ok(<[PathBuf; 2]>::try_from(inputs).expect("counted"))
}

/// `analyze --input-path`: exactly one dump file, under the same rules as the compare inputs.
pub fn analyze_input(opt: &str, v: &OsStr) -> Parsed<PathBuf> {
    let expected = "'analyze' takes exactly one dump file";
    let mut inputs = input_paths(v, 1..=1, expected, false).map_err(|r| refused(opt, r))?;
    Ok(inputs.remove(0))
}

/// `report --input-path`: one or two runs, each a directory or a dump file.
pub fn report_inputs(opt: &str, v: &OsStr) -> Parsed<List<PathBuf>> {
    let expected = "'report' takes one run, or two to compare";
    input_paths(v, 1..=2, expected, true)
        .map(List)
        .map_err(|r| refused(opt, r))
}

/// `--lib PATH`: an existing, readable 64-bit ELF shared object; canonicalized.
pub fn lib(opt: &str, v: &OsStr) -> Parsed<PathBuf> {
    let bad = |why: &str| {
        CliError::usage(format!(
            "invalid {opt} value '{}': {why}; expected an existing, readable shared library file",
            shown_os(v)
        ))
    };
    if v.is_empty() {
        return Err(bad("empty path"));
    }
    let path = std::fs::canonicalize(v).map_err(|e| bad(&e.to_string()))?;
    let md = std::fs::metadata(&path).map_err(|e| bad(&e.to_string()))?;
    if !md.is_file() {
        return Err(bad("not a regular file"));
    }
    if !paths::is_readable(&path) {
        return Err(bad("not readable"));
    }
    // A library named on the command line that cannot be probed is a mistake the user
    // should hear about now, not a warning scrolled past after the target has started.
    let mut header = [0u8; 18];
    std::fs::File::open(&path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut header))
        .map_err(|e| bad(&format!("cannot read its ELF header: {e}")))?;
    const ET_DYN: u16 = 3;
    let e_type = match header[5] {
        1 => u16::from_le_bytes([header[16], header[17]]),
        _ => u16::from_be_bytes([header[16], header[17]]),
    };
    match () {
        _ if &header[..4] != b"\x7fELF" => Err(bad("not an ELF file")),
        _ if header[4] != 2 => Err(bad("not a 64-bit ELF file")),
        _ if e_type != ET_DYN => Err(bad("an ELF file but not a shared object")),
        _ => Ok(path),
    }
}
