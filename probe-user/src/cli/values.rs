//! Typed value parsers for what clap cannot check itself: msMemScope's list syntax and ranges,
//! paths that must exist (or must not be symlinks), and values that carry a deprecation notice.
//! Each takes the option's name (for the message) and the raw value, which may not be UTF-8.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use clap::error::{ContextKind, ContextValue, ErrorKind};

use super::*;
use crate::report::{At, Formats};
use crate::settings::*;

/// A clap value parser made of a plain function of (option name, raw value).
#[derive(Clone, Copy)]
pub struct Check<T>(pub fn(&str, &OsStr) -> Result<T, CliError>);

impl<T: Clone + Send + Sync + 'static> clap::builder::TypedValueParser for Check<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let name = arg.and_then(|a| a.get_long()).unwrap_or_default();
        (self.0)(&format!("--{name}"), value).map_err(|e| {
            // The message travels in the error's context; `from_clap` takes it out unchanged.
            let mut err = clap::Error::new(ErrorKind::ValueValidation).with_cmd(cmd);
            err.insert(ContextKind::Custom, ContextValue::String(e.message));
            err
        })
    }
}

/// A value with the warnings its spelling deserves (deprecated forms, ignored parts).
#[derive(Clone, Debug)]
pub struct Warned<T>(pub T, pub Vec<String>);

/// A list value (a newtype, so that clap's derive does not read `Vec` as "repeatable").
#[derive(Clone, Debug)]
pub struct List<T>(pub Vec<T>);

/// Render a user value for a message: control characters escaped, bytes that are not UTF-8
/// written as `\xNN`.
pub fn shown_os(s: &OsStr) -> String {
    let mut out = String::new();
    for chunk in s.as_bytes().utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

pub fn shown(s: &str) -> String {
    shown_os(OsStr::new(s))
}

pub fn invalid(opt: &str, value: &str, what: &str) -> CliError {
    CliError::usage(format!("invalid {opt} value '{}': {what}", shown(value)))
}

fn utf8<'a>(opt: &str, v: &'a OsStr) -> Result<&'a str, CliError> {
    v.to_str().ok_or_else(|| {
        CliError::usage(format!(
            "invalid {opt} value '{}': not valid UTF-8",
            shown_os(v)
        ))
    })
}

/// The tokens of a list value; an empty list is an error that says `if_empty`.
fn list<'a>(opt: &str, v: &'a OsStr, if_empty: &str) -> Result<Vec<&'a str>, CliError> {
    let tokens = split_list(utf8(opt, v)?);
    match tokens.is_empty() {
        true => Err(invalid(opt, &v.to_string_lossy(), if_empty)),
        false => Ok(tokens),
    }
}

/// Split a list value on ASCII ',' and full-width '，' (U+FF0C), skipping empty tokens.
pub fn split_list(value: &str) -> Vec<&str> {
    value
        .split([',', '\u{ff0c}'])
        .filter(|t| !t.is_empty())
        .collect()
}

/// Byte-level variant of [`split_list`] for values that may not be UTF-8. The full-width comma
/// is matched as its whole UTF-8 sequence, so it never splits another character.
pub fn split_list_os(value: &OsStr) -> Vec<&OsStr> {
    const FW: &[u8] = "\u{ff0c}".as_bytes();
    let b = value.as_bytes();
    let (mut out, mut start, mut i) = (Vec::new(), 0, 0);
    while i < b.len() {
        let sep = match b[i] {
            b',' => 1,
            _ if b[i..].starts_with(FW) => FW.len(),
            _ => 0,
        };
        if sep == 0 {
            i += 1;
            continue;
        }
        if i > start {
            out.push(OsStr::from_bytes(&b[start..i]));
        }
        i += sep;
        start = i;
    }
    if b.len() > start {
        out.push(OsStr::from_bytes(&b[start..]));
    }
    out
}

/// Parse a plain decimal number: digits only, no sign, no leading zero (unless `allow_zero` and
/// the value is exactly "0"), fits u32.
pub fn parse_decimal(s: &str, allow_zero: bool) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if s.starts_with('0') {
        return (allow_zero && s == "0").then_some(0);
    }
    s.parse().ok()
}

/// `stoul(s, nullptr, 0)`-style number: `0x` hex, leading-0 octal or decimal; whole string.
pub fn parse_c_number(s: &str) -> Option<u32> {
    let (digits, radix) = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (h, 16)
    } else if s.len() > 1 && s.starts_with('0') {
        (&s[1..], 8)
    } else {
        (s, 10)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u32::from_str_radix(digits, radix).ok()
}

/// A decimal count in `range` (no sign, no leading zeros).
fn count(opt: &str, v: &OsStr, max: u32, what: &str) -> Result<u32, CliError> {
    let v = utf8(opt, v)?;
    parse_decimal(v, false)
        .filter(|n| *n <= max)
        .ok_or_else(|| invalid(opt, v, what))
}

pub fn max_file_mib(opt: &str, v: &OsStr) -> Result<u32, CliError> {
    count(opt, v, 1 << 20, "expected MiB from 1 to 1048576")
}

pub fn max_files(opt: &str, v: &OsStr) -> Result<u32, CliError> {
    count(opt, v, 10_000, "expected a count from 1 to 10000")
}

pub fn ring_buffer_mib(opt: &str, v: &OsStr) -> Result<u32, CliError> {
    let what = "expected a power of two from 1 to 1024 (MiB)";
    let n = count(opt, v, MAX_RING_BUFFER_MIB, what)?;
    match n.is_power_of_two() {
        true => Ok(n),
        false => Err(invalid(opt, &v.to_string_lossy(), what)),
    }
}

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
            Component::Prefix(_) | Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(s) => out.push(s),
        }
    }
    out
}

pub fn current_dir() -> Result<PathBuf, CliError> {
    std::env::current_dir()
        .map_err(|e| CliError::usage(format!("cannot determine the current directory: {e}")))
}

fn output_char_allowed(c: char) -> bool {
    matches!(c, '.' | '/' | '_' | '-' | '~')
        || c.is_ascii_alphanumeric()
        || c.is_ascii_whitespace()
        || ('\u{4e00}'..='\u{9fa5}').contains(&c)
}

/// Check an absolute output directory against msMemScope's output path rules.
/// Returns the reason on failure.
pub fn check_output_dir(abs: &Path) -> Result<(), String> {
    let Some(s) = abs.to_str() else {
        let path = shown_os(abs.as_os_str());
        return Err(format!("the absolute path '{path}' is not valid UTF-8"));
    };
    if let Some(c) = s.chars().find(|&c| !output_char_allowed(c)) {
        return Err(format!(
            "the absolute path '{}' contains '{}'; allowed are letters, digits, \
             '.', '/', '_', '-', '~', whitespace and CJK characters U+4E00..U+9FA5",
            shown(s),
            shown(&c.to_string())
        ));
    }
    if s.len() > MAX_PATH_LEN {
        let len = s.len();
        return Err(format!(
            "the absolute path is {len} bytes long, more than {MAX_PATH_LEN}"
        ));
    }
    if let Some(comp) = s.split('/').find(|c| c.len() > MAX_PATH_COMPONENT_LEN) {
        return Err(format!(
            "the path component '{}...' is longer than {MAX_PATH_COMPONENT_LEN} bytes",
            shown(&comp.chars().take(32).collect::<String>())
        ));
    }
    let slashes = s.bytes().filter(|&b| b == b'/').count();
    if slashes > MAX_PATH_SLASHES {
        return Err(format!(
            "the absolute path '{}' has {slashes} '/' separators, more than {MAX_PATH_SLASHES}",
            shown(s)
        ));
    }
    match std::fs::metadata(abs) {
        Ok(md) if !md.is_dir() => Err(format!("'{}' exists and is not a directory", shown(s))),
        Ok(_) if !is_readable(abs) => Err(format!("'{}' exists but is not readable", shown(s))),
        _ => Ok(()),
    }
}

/// `-o/--output-path DIR`: absolute, lexically resolved, under msMemScope's path rules.
pub fn output_dir(opt: &str, raw: &OsStr) -> Result<PathBuf, CliError> {
    let Some(value) = raw.to_str() else {
        return Err(CliError::usage(format!(
            "invalid {opt} value '{}': invalid output path, it is not valid UTF-8",
            shown_os(raw)
        )));
    };
    if value.trim().is_empty() {
        let why = "the output path must not be empty (default: ./memscopeDumpResults)";
        return Err(invalid(opt, value, why));
    }
    if value.len() > MAX_PATH_LEN {
        return Err(CliError::usage(format!(
            "invalid {opt} value: invalid output path, it is {} bytes long, more than {MAX_PATH_LEN}",
            value.len()
        )));
    }
    if let Some(c) = value.chars().next().filter(|c| "=+-@".contains(*c)) {
        let why = format!(
            "invalid output path, it must not start with '{c}' (nor with '=', '+', '-' or '@')"
        );
        return Err(invalid(opt, value, &why));
    }
    let abs = lexical_absolute(Path::new(value), &current_dir()?);
    check_output_dir(&abs)
        .map_err(|why| invalid(opt, value, &format!("invalid output path: {why}")))?;
    Ok(abs)
}

pub fn default_output_dir() -> Result<PathBuf, CliError> {
    let abs = current_dir()?.join(DEFAULT_OUTPUT_DIR);
    check_output_dir(&abs).map_err(|why| {
        CliError::usage(format!(
            "invalid output path: the default output directory is unusable: {why}; \
             choose another with -o/--output-path"
        ))
    })?;
    Ok(abs)
}

/// An output file path: UTF-8, not empty, not a directory or a symlink.
pub fn output_file(opt: &str, raw: &OsStr) -> Result<PathBuf, CliError> {
    let Some(value) = raw.to_str().filter(|v| !v.trim().is_empty()) else {
        return Err(CliError::usage(format!(
            "invalid {opt} value '{}': expected a file name (UTF-8, not empty)",
            shown_os(raw)
        )));
    };
    too_long(opt, raw, MAX_PATH_LEN)?;
    let abs = lexical_absolute(Path::new(value), &current_dir()?);
    match std::fs::symlink_metadata(&abs) {
        Ok(md) if md.is_dir() => Err(invalid(
            opt,
            value,
            "is a directory; name the file to write, e.g. DIR/report.html",
        )),
        Ok(md) if md.file_type().is_symlink() => Err(invalid(
            opt,
            value,
            "is a symbolic link; name the file itself",
        )),
        _ => Ok(abs),
    }
}

fn too_long(opt: &str, v: &OsStr, max: usize) -> Result<(), CliError> {
    match v.len() > max {
        true => Err(CliError::usage(format!(
            "invalid {opt} value: it is {} bytes long, more than {max}",
            v.len()
        ))),
        false => Ok(()),
    }
}

/// Parse and validate a `--watch` value.
pub fn parse_watch(value: &str) -> Result<WatchConfig, CliError> {
    const EXPECTED: &str = "invalid watch config, expected [START[:OUTID]],END[,full-content] \
                            (the comma before END is required; OUTID needs a START)";
    let bad = |why: &str| invalid("--watch", value, &format!("{why}; {EXPECTED}"));
    let Some((start_part, rest)) = value.split_once(',') else {
        return Err(bad("missing ','"));
    };
    let (end, tail) = match rest.split_once(',') {
        Some((e, t)) => (e, Some(t)),
        None => (rest, None),
    };
    if end.is_empty() {
        return Err(bad("END is empty"));
    }
    let full_content = match tail {
        None => false,
        Some("full-content") => true,
        Some(t) => return Err(bad(&format!("unexpected '{}' after END", shown(t)))),
    };
    let (start, output_id) = match start_part.split_once(':') {
        Some(("", _)) => return Err(bad("an OUTID needs a START name")),
        Some((s, id)) => {
            let Some(id) = parse_decimal(id, true) else {
                return Err(bad(&format!(
                    "OUTID '{}' is not an unsigned 32-bit integer without leading zeros",
                    shown(id)
                )));
            };
            (Some(s), Some(id))
        }
        None if start_part.is_empty() => (None, None),
        None => (Some(start_part), None),
    };
    if let Some(name) = start
        .iter()
        .chain([&end])
        .find(|n| n.len() > MAX_WATCH_NAME_LEN)
    {
        return Err(bad(&format!(
            "the name '{}...' is longer than {MAX_WATCH_NAME_LEN} bytes",
            shown(&name.chars().take(32).collect::<String>())
        )));
    }
    Ok(WatchConfig {
        start: start.map(str::to_owned),
        output_id,
        end: end.to_owned(),
        full_content,
    })
}

pub fn watch(opt: &str, v: &OsStr) -> Result<String, CliError> {
    let v = utf8(opt, v)?;
    parse_watch(v).map(|_| v.to_owned())
}

pub fn pid(opt: &str, v: &OsStr) -> Result<u32, CliError> {
    let v = utf8(opt, v)?;
    let pid = parse_decimal(v, false).filter(|&p| p > 0).ok_or_else(|| {
        let what =
            "expected a process id: a positive decimal integer without sign or leading zeros";
        invalid(opt, v, what)
    })?;
    if pid == std::process::id() {
        return Err(CliError::usage(format!(
            "invalid {opt} value '{pid}': that is {PROGRAM_NAME} itself"
        )));
    }
    if std::fs::symlink_metadata(format!("/proc/{pid}")).is_err() {
        return Err(CliError::usage(format!("no process with pid {pid}")));
    }
    Ok(pid)
}

/// `--events`: a list of event kinds; `none` clears, `traceback` is accepted and ignored.
pub fn events(opt: &str, v: &OsStr) -> Result<Warned<EventSet>, CliError> {
    let what = "expected a list of alloc, free, launch, access, traceback or none \
                (use 'none' for no events)";
    let tokens = list(opt, v, what)?;
    let (mut set, mut warnings) = (EventSet::NONE, Vec::new());
    for t in &tokens {
        match *t {
            "alloc" => set.alloc = true,
            "free" => set.free = true,
            "launch" => set.launch = true,
            "access" => set.access = true,
            "traceback" => {
                warnings = vec![format!(
                    "{opt}: 'traceback' (Python function tracing) is not supported by \
                 {PROGRAM_NAME} and is ignored"
                )]
            }
            "none" => {}
            _ => {
                return Err(CliError::usage(format!(
                    "invalid event trace type: {opt} value '{}' is not one of alloc, free, \
                     launch, access, traceback, none",
                    shown(t)
                )));
            }
        }
    }
    if tokens.contains(&"none") {
        let mixed = format!("{opt}: 'none' mixed with other event types, all events cleared");
        return Ok(Warned(
            EventSet::NONE,
            (tokens.len() > 1).then_some(mixed).into_iter().collect(),
        ));
    }
    Ok(Warned(set, warnings))
}

/// `--level`: op and/or kernel; msMemScope's numbers 0 and 1 with a deprecation notice.
pub fn levels(opt: &str, v: &OsStr) -> Result<Warned<Levels>, CliError> {
    let what = "invalid data trace level, expected op, kernel or op,kernel";
    let tokens = list(opt, v, what)?;
    let mut levels = Levels {
        op: false,
        kernel: false,
    };
    let mut warnings = Vec::new();
    for t in tokens {
        match t {
            "op" | "0" => levels.op = true,
            "kernel" | "1" => levels.kernel = true,
            _ => {
                let what = "invalid data trace level, expected op or kernel \
                            (a list like op,kernel is allowed)";
                return Err(invalid(opt, t, what));
            }
        }
        let name = match t {
            "0" => "op",
            "1" => "kernel",
            _ => continue,
        };
        warnings.push(deprecated(
            &format!("--level={t}"),
            &format!("--level={name}"),
        ));
    }
    Ok(Warned(levels, warnings))
}

pub fn deprecated(old: &str, new: &str) -> String {
    format!("'{old}' is deprecated, use '{new}' instead")
}

/// `--analysis`: leaks, decompose, inefficient, oom[:K] or none.
pub fn analysis(opt: &str, v: &OsStr) -> Result<Warned<AnalysisSet>, CliError> {
    const EXPECTED: &str = "invalid analysis type, expected a list of leaks, decompose, \
                            inefficient, oom[:K] or none";
    let tokens = list(opt, v, &format!("{EXPECTED} (use 'none' for no analysis)"))?;
    let mut set = AnalysisSet::default();
    for t in &tokens {
        match *t {
            "leaks" => set.leaks = true,
            "decompose" => set.decompose = true,
            "inefficient" => set.inefficient = true,
            "none" => {}
            "oom" => set.oom_top_k = Some(DEFAULT_OOM_TOP_K),
            _ => {
                let Some(k) = t.strip_prefix("oom:") else {
                    return Err(invalid(opt, t, EXPECTED));
                };
                let top_k = parse_decimal(k, false).filter(|k| (1..=MAX_OOM_TOP_K).contains(k));
                set.oom_top_k = Some(top_k.ok_or_else(|| {
                    CliError::usage(format!(
                        "invalid {opt} value '{}': invalid OOM top-K value '{}', expected an \
                         integer from 1 to {MAX_OOM_TOP_K} without leading zeros",
                        shown(t),
                        shown(k)
                    ))
                })?);
            }
        }
    }
    if tokens.contains(&"none") {
        let mixed = format!("{opt}: 'none' mixed with other analysis types, all analyses cleared");
        let warnings = (tokens.len() > 1).then_some(mixed).into_iter().collect();
        return Ok(Warned(AnalysisSet::default(), warnings));
    }
    Ok(Warned(set, Vec::new()))
}

/// `--log-level`; `warn` is msMemScope's deprecated spelling of `warning`.
pub fn log_level(opt: &str, v: &OsStr) -> Result<Warned<LogLevel>, CliError> {
    let v = utf8(opt, v)?;
    let level = match v {
        "debug" => LogLevel::Debug,
        "info" => LogLevel::Info,
        "warning" | "warn" => LogLevel::Warning,
        "error" => LogLevel::Error,
        _ => return Err(invalid(opt, v, "expected debug, info, warning or error")),
    };
    let warnings = (v == "warn")
        .then(|| deprecated("--log-level=warn", "--log-level=warning"))
        .into_iter()
        .collect();
    Ok(Warned(level, warnings))
}

pub fn steps(opt: &str, v: &OsStr) -> Result<List<u32>, CliError> {
    let tokens = list(
        opt,
        v,
        "invalid steps, expected a list of step numbers >= 1",
    )?;
    if tokens.len() > MAX_STEPS {
        let what = format!("invalid steps, at most {MAX_STEPS} steps may be given");
        return Err(invalid(opt, &v.to_string_lossy(), &what));
    }
    let step = |t| {
        parse_decimal(t, false).ok_or_else(|| {
            let what = "invalid steps, expected an integer >= 1 without sign or leading zeros \
                        that fits 32 bits";
            invalid(opt, t, what)
        })
    };
    tokens
        .into_iter()
        .map(step)
        .collect::<Result<_, _>>()
        .map(List)
}

pub fn call_stack(opt: &str, v: &OsStr) -> Result<CallStack, CliError> {
    let v = utf8(opt, v)?;
    let mut cs = CallStack::default();
    for t in split_list(v) {
        let (kind, depth) = match t.split_once(':') {
            Some((k, d)) => {
                let depth = parse_decimal(d, true)
                    .filter(|d| *d <= MAX_CALL_STACK_DEPTH)
                    .ok_or_else(|| {
                        let what = "invalid call-stack depth, expected c[:DEPTH] or \
                                    python[:DEPTH] with DEPTH from 0 to 1000 without leading zeros";
                        invalid(opt, t, what)
                    })?;
                (k, depth)
            }
            None => (t, DEFAULT_CALL_STACK_DEPTH),
        };
        match kind {
            "c" => cs.c_depth = Some(depth),
            "python" => cs.python_depth = Some(depth),
            "mixed" => {
                cs.c_depth = Some(depth);
                cs.python_depth = Some(cs.python_depth.unwrap_or(depth));
                cs.mixed = true;
            }
            _ => {
                let what = "expected c[:DEPTH], python[:DEPTH] or mixed[:DEPTH] (an empty value \
                            disables stacks)";
                return Err(invalid(opt, t, what));
            }
        }
    }
    Ok(cs)
}

pub fn devices(opt: &str, raw: &OsStr) -> Result<DeviceFilter, CliError> {
    const EXPECTED: &str = "expected npu, cpu or npu:N with N < 32";
    let mut d = DeviceFilter {
        all_npu: false,
        npu_mask: 0,
        cpu: false,
    };
    for t in list(opt, raw, &format!("{EXPECTED} (at least one device)"))? {
        match t {
            "npu" => d.all_npu = true,
            "cpu" => d.cpu = true,
            _ => {
                let n = t
                    .strip_prefix("npu:")
                    .and_then(parse_c_number)
                    .filter(|n| *n < MAX_NPU_SLOTS)
                    .ok_or_else(|| invalid(opt, t, EXPECTED))?;
                d.npu_mask |= 1 << n;
            }
        }
    }
    Ok(d)
}

/// One input dump: exists, a regular file (a symlink is refused, not followed), at most
/// 8 GiB, readable.
fn input_file(opt: &str, whole: &OsStr, t: &OsStr) -> Result<PathBuf, CliError> {
    let path = PathBuf::from(t);
    let bad = |why: &str| {
        let (whole, t) = (shown_os(whole), shown_os(t));
        CliError::usage(format!(
            "invalid {opt} value '{whole}': invalid paths, '{t}' {why}"
        ))
    };
    let md = std::fs::symlink_metadata(&path).map_err(|e| bad(&format!("cannot be read: {e}")))?;
    if md.file_type().is_symlink() {
        return Err(bad("is a symbolic link; give the file itself"));
    }
    if !md.is_file() {
        return Err(bad("is not a regular file"));
    }
    if md.len() > MAX_COMPARE_INPUT_BYTES {
        return Err(bad("is larger than 8 GiB"));
    }
    if !is_readable(&path) {
        return Err(bad("is not readable"));
    }
    Ok(path)
}

/// `--compare --input-path A,B`: exactly two dump files.
pub fn compare_inputs(opt: &str, v: &OsStr) -> Result<[PathBuf; 2], CliError> {
    too_long(opt, v, MAX_PATH_LEN)?;
    let tokens = split_list_os(v);
    let [a, b] = tokens[..] else {
        return Err(CliError::usage(format!(
            "invalid {opt} value '{}': invalid paths, expected exactly two comma-separated \
             dump files, got {}",
            shown_os(v),
            tokens.len()
        )));
    };
    Ok([input_file(opt, v, a)?, input_file(opt, v, b)?])
}

/// `analyze --input-path`: exactly one dump file, under the same rules as the compare inputs.
pub fn analyze_input(opt: &str, v: &OsStr) -> Result<PathBuf, CliError> {
    too_long(opt, v, MAX_PATH_LEN)?;
    let tokens = split_list_os(v);
    let [input] = tokens[..] else {
        return Err(CliError::usage(format!(
            "invalid {opt} value '{}': 'analyze' takes exactly one dump file, got {}",
            shown_os(v),
            tokens.len()
        )));
    };
    input_file(opt, v, input)
}

/// `report --input-path`: one or two runs, each an existing directory or dump file (not a
/// symlink).
pub fn report_inputs(opt: &str, v: &OsStr) -> Result<List<PathBuf>, CliError> {
    too_long(opt, v, 2 * MAX_PATH_LEN)?;
    let tokens = split_list_os(v);
    if tokens.is_empty() || tokens.len() > 2 {
        return Err(CliError::usage(format!(
            "invalid {opt} value '{}': 'report' takes one run, or two to compare, got {}",
            shown_os(v),
            tokens.len()
        )));
    }
    let run = |t: &OsStr| match std::fs::symlink_metadata(t) {
        Ok(md) if md.is_dir() => Ok(PathBuf::from(t)),
        Ok(_) => input_file(opt, v, t),
        Err(e) => Err(CliError::usage(format!(
            "invalid {opt} value '{}': cannot read '{}': {e}",
            shown_os(v),
            shown_os(t)
        ))),
    };
    tokens
        .into_iter()
        .map(run)
        .collect::<Result<_, _>>()
        .map(List)
}

/// `report --format`: a list of html, perfetto, folded, speedscope.
pub fn report_formats(opt: &str, v: &OsStr) -> Result<Formats, CliError> {
    let v = utf8(opt, v)?;
    let mut f = Formats::default();
    for t in split_list(v) {
        match t {
            "html" => f.html = true,
            "perfetto" => f.perfetto = true,
            "folded" => f.folded = true,
            "speedscope" => f.speedscope = true,
            _ => {
                let what = "'report' writes html, perfetto, folded or speedscope (a list)";
                return Err(invalid(opt, v, what));
            }
        }
    }
    if f == Formats::default() {
        return Err(invalid(opt, v, "name at least one format"));
    }
    Ok(f)
}

/// `--at=exit|peak|SECONDS`.
pub fn at(opt: &str, v: &OsStr) -> Result<At, CliError> {
    let v = utf8(opt, v)?;
    Ok(match v {
        "exit" | "end" => At::Exit,
        "peak" => At::Peak,
        _ => match v.parse::<f64>() {
            Ok(s) if (0.0..1e9).contains(&s) => At::After((s * 1e9).round() as u64),
            _ => {
                let what = "expected exit, peak or seconds after the dump's first event (e.g. 1.5)";
                return Err(invalid(opt, v, what));
            }
        },
    })
}

/// `--timeline=MS`: 1 ms to one hour.
pub fn timeline_ms(opt: &str, v: &OsStr) -> Result<u64, CliError> {
    let v = utf8(opt, v)?;
    parse_decimal(v, false)
        .map(u64::from)
        .filter(|ms| (1..=3_600_000).contains(ms))
        .ok_or_else(|| invalid(opt, v, "expected an interval in milliseconds, 1..=3600000"))
}

/// `--lib PATH`: an existing, readable 64-bit ELF shared object; canonicalized.
pub fn lib(opt: &str, v: &OsStr) -> Result<PathBuf, CliError> {
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
    if !is_readable(&path) {
        return Err(bad("not readable"));
    }
    // A library named on the command line that cannot be probed is a mistake the user
    // should hear about now, not a warning scrolled past after the target has started.
    let mut header = [0u8; 18];
    std::fs::File::open(&path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut header))
        .map_err(|e| bad(&format!("cannot read its ELF header: {e}")))?;
    if &header[..4] != b"\x7fELF" {
        return Err(bad("not an ELF file"));
    }
    if header[4] != 2 {
        return Err(bad("not a 64-bit ELF file"));
    }
    const ET_DYN: u16 = 3;
    let e_type = match header[5] {
        1 => u16::from_le_bytes([header[16], header[17]]),
        _ => u16::from_be_bytes([header[16], header[17]]),
    };
    if e_type != ET_DYN {
        return Err(bad("an ELF file but not a shared object"));
    }
    Ok(path)
}
