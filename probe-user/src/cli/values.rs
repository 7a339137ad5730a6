//! Typed value parsers for what clap cannot check itself: msMemScope's lists (split on `,` and
//! `，`) and ranges, path rules, and spellings that deserve a warning ([`warn`]). Each is a plain
//! `fn(option name, raw value) -> Parsed<T>`; the raw value may not be UTF-8.

use std::cell::RefCell;
use std::ffi::{CString, OsStr};
use std::ops::RangeInclusive;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Arg, Command};

use super::*;
use crate::report::{At, Formats};
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

/// A user value for a message: control characters escaped, bytes that are not UTF-8 as `\xNN`.
pub fn shown_os(s: &OsStr) -> String {
    let mut out = String::new();
    for chunk in s.as_bytes().utf8_chunks() {
        for c in chunk.valid().chars() {
            match c.is_control() {
                true => out.extend(c.escape_default()),
                false => out.push(c),
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

fn utf8<'a>(opt: &str, v: &'a OsStr) -> Parsed<&'a str> {
    v.to_str()
        .ok_or_else(|| invalid(opt, &shown_os(v), "not valid UTF-8"))
}

/// The tokens of a list value; an empty list is an error that says `if_empty`.
fn list<'a>(opt: &str, v: &'a OsStr, if_empty: &str) -> Parsed<Vec<&'a str>> {
    let tokens = split_list(utf8(opt, v)?);
    match tokens.is_empty() {
        true => Err(invalid(opt, &v.to_string_lossy(), if_empty)),
        false => Ok(tokens),
    }
}

/// Which of `names` a list names (`names[i]` sets `out[i]`); `Err` carries any other token.
fn flags<'a, const N: usize>(tokens: &[&'a str], names: [&str; N]) -> Result<[bool; N], &'a str> {
    let mut out = [false; N];
    for t in tokens {
        out[names.iter().position(|n| n == t).ok_or(*t)?] = true;
    }
    Ok(out)
}

/// Whether a list named `none`, which clears it (with a notice when other `what` are named).
fn cleared(opt: &str, none: bool, tokens: &[&str], what: &str) -> bool {
    if none && tokens.len() > 1 {
        warn(format!("{opt}: 'none' mixed with other {what} cleared"));
    }
    none
}

/// Split a list value on ASCII ',' and full-width '，' (U+FF0C), skipping empty tokens.
pub fn split_list(value: &str) -> Vec<&str> {
    value
        .split([',', '\u{ff0c}'])
        .filter(|t| !t.is_empty())
        .collect()
}

/// Byte-level [`split_list`] for values that may not be UTF-8. The full-width comma is matched
/// as its whole UTF-8 sequence, so it never splits another character.
pub fn split_list_os(value: &OsStr) -> Vec<&OsStr> {
    const FW: &[u8] = "\u{ff0c}".as_bytes();
    let mut out = Vec::new();
    for mut part in value.as_bytes().split(|&b| b == b',') {
        while let Some(i) = part.windows(FW.len()).position(|w| w == FW) {
            out.push(&part[..i]);
            part = &part[i + FW.len()..];
        }
        out.push(part);
    }
    out.retain(|t| !t.is_empty());
    out.into_iter().map(OsStr::from_bytes).collect()
}

/// A plain decimal number: digits only, no sign, no leading zero (unless `allow_zero` and the
/// value is exactly "0"), fits u32.
pub fn parse_decimal(s: &str, allow_zero: bool) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match s.starts_with('0') {
        true => (allow_zero && s == "0").then_some(0),
        false => s.parse().ok(),
    }
}

/// `stoul(s, nullptr, 0)`-style number: `0x` hex, leading-0 octal or decimal; whole string.
pub fn parse_c_number(s: &str) -> Option<u32> {
    let (digits, radix) = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => (h, 16),
        None if s.len() > 1 && s.starts_with('0') => (&s[1..], 8),
        None => (s, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u32::from_str_radix(digits, radix).ok()
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

pub fn current_dir() -> Parsed<PathBuf> {
    std::env::current_dir()
        .map_err(|e| CliError::usage(format!("cannot determine the current directory: {e}")))
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
            "the absolute path '{}' contains '{}'; allowed are letters, digits, \
             '.', '/', '_', '-', '~', whitespace and CJK characters U+4E00..U+9FA5",
            shown(s),
            shown(&c.to_string())
        ))
    } else if s.len() > MAX_PATH_LEN {
        let len = s.len();
        Err(format!(
            "the absolute path is {len} bytes long, more than {MAX_PATH_LEN}"
        ))
    } else if let Some(comp) = s.split('/').find(|c| c.len() > MAX_PATH_COMPONENT_LEN) {
        let comp = shown(&comp.chars().take(32).collect::<String>());
        Err(format!(
            "the path component '{comp}...' is longer than {MAX_PATH_COMPONENT_LEN} bytes"
        ))
    } else if slashes > MAX_PATH_SLASHES {
        Err(format!(
            "the absolute path '{}' has {slashes} '/' separators, more than {MAX_PATH_SLASHES}",
            shown(s)
        ))
    } else {
        match std::fs::metadata(abs) {
            Ok(md) if !md.is_dir() => Err(format!("'{}' exists and is not a directory", shown(s))),
            Ok(_) if !is_readable(abs) => Err(format!("'{}' exists but is not readable", shown(s))),
            _ => Ok(()),
        }
    }
}

/// `-o/--output-path DIR`: absolute, lexically resolved, under msMemScope's path rules.
pub fn output_dir(opt: &str, raw: &OsStr) -> Parsed<PathBuf> {
    let Some(value) = raw.to_str() else {
        let why = "invalid output path, it is not valid UTF-8";
        return Err(invalid(opt, &shown_os(raw), why));
    };
    let bad = |why: &str| Err(invalid(opt, value, why));
    if value.trim().is_empty() {
        return bad("the output path must not be empty (default: ./memscopeDumpResults)");
    }
    too_long(opt, raw, MAX_PATH_LEN)?;
    if let Some(c) = value.chars().next().filter(|c| "=+-@".contains(*c)) {
        return bad(&format!(
            "invalid output path, it must not start with '{c}' (nor with '=', '+', '-' or '@')"
        ));
    }
    let abs = lexical_absolute(Path::new(value), &current_dir()?);
    match check_output_dir(&abs) {
        Ok(()) => Ok(abs),
        Err(why) => bad(&format!("invalid output path: {why}")),
    }
}

pub fn default_output_dir() -> Parsed<PathBuf> {
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
pub fn output_file(opt: &str, raw: &OsStr) -> Parsed<PathBuf> {
    let Some(value) = raw.to_str().filter(|v| !v.trim().is_empty()) else {
        let why = "expected a file name (UTF-8, not empty)";
        return Err(invalid(opt, &shown_os(raw), why));
    };
    too_long(opt, raw, MAX_PATH_LEN)?;
    let abs = lexical_absolute(Path::new(value), &current_dir()?);
    match std::fs::symlink_metadata(&abs) {
        Ok(md) if md.is_dir() => Err(invalid(
            opt,
            value,
            "is a directory; name the file to write, e.g. DIR/report.html",
        )),
        Ok(md) if md.is_symlink() => Err(invalid(
            opt,
            value,
            "is a symbolic link; name the file itself",
        )),
        _ => Ok(abs),
    }
}

fn too_long(opt: &str, v: &OsStr, max: usize) -> Parsed<()> {
    match v.len() > max {
        true => Err(CliError::usage(format!(
            "invalid {opt} value: it is {} bytes long, more than {max}",
            v.len()
        ))),
        false => Ok(()),
    }
}

/// Parse and validate a `--watch` value.
pub fn parse_watch(value: &str) -> Parsed<WatchConfig> {
    const EXPECTED: &str = "invalid watch config, expected [START[:OUTID]],END[,full-content] \
                            (the comma before END is required; OUTID needs a START)";
    let bad = |why: &str| invalid("--watch", value, &format!("{why}; {EXPECTED}"));
    let Some((start_part, rest)) = value.split_once(',') else {
        return Err(bad("missing ','"));
    };
    let (end, full_content) = match rest.split_once(',') {
        None => (rest, false),
        Some((e, "full-content")) => (e, true),
        Some((_, t)) => return Err(bad(&format!("unexpected '{}' after END", shown(t)))),
    };
    if end.is_empty() {
        return Err(bad("END is empty"));
    }
    let (start, output_id) = match start_part.split_once(':') {
        Some(("", _)) => return Err(bad("an OUTID needs a START name")),
        Some((s, id)) => {
            let why = "is not an unsigned 32-bit integer without leading zeros";
            let id = parse_decimal(id, true)
                .ok_or_else(|| bad(&format!("OUTID '{}' {why}", shown(id))))?;
            (Some(s), Some(id))
        }
        None => (Some(start_part).filter(|s| !s.is_empty()), None),
    };
    if let Some(name) = start
        .iter()
        .chain([&end])
        .find(|n| n.len() > MAX_WATCH_NAME_LEN)
    {
        let name = shown(&name.chars().take(32).collect::<String>());
        let why = format!("the name '{name}...' is longer than {MAX_WATCH_NAME_LEN} bytes");
        return Err(bad(&why));
    }
    let start = start.map(str::to_owned);
    let end = end.to_owned();
    Ok(WatchConfig {
        start,
        output_id,
        end,
        full_content,
    })
}

pub fn watch(opt: &str, v: &OsStr) -> Parsed<WatchConfig> {
    parse_watch(utf8(opt, v)?)
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

/// `--events`: a list of event kinds; `none` clears, `traceback` is accepted and ignored.
pub fn events(opt: &str, v: &OsStr) -> Parsed<EventSet> {
    let what = "expected a list of alloc, free, launch, access, traceback or none \
                (use 'none' for no events)";
    let tokens = list(opt, v, what)?;
    let names = ["alloc", "free", "launch", "access", "traceback", "none"];
    let [alloc, free, launch, access, traceback, none] = flags(&tokens, names)
        .map_err(|t| invalid(opt, t, &format!("invalid event trace type, {what}")))?;
    if cleared(opt, none, &tokens, "event types, all events") {
        return Ok(EventSet::NONE);
    }
    if traceback {
        warn(format!(
            "{opt}: 'traceback' (Python function tracing) is not supported by {PROGRAM_NAME} \
             and is ignored"
        ));
    }
    Ok(EventSet {
        alloc,
        free,
        launch,
        access,
    })
}

/// `--level`: op and/or kernel; msMemScope's numbers 0 and 1 with a deprecation notice.
pub fn levels(opt: &str, v: &OsStr) -> Parsed<Levels> {
    let what = "invalid data trace level, expected op, kernel or op,kernel";
    let tokens = list(opt, v, what)?;
    let [op, kernel, zero, one] = flags(&tokens, ["op", "kernel", "0", "1"]).map_err(|t| {
        let what =
            "invalid data trace level, expected op or kernel (a list like op,kernel is allowed)";
        invalid(opt, t, what)
    })?;
    for (given, n, name) in [(zero, 0, "op"), (one, 1, "kernel")] {
        if given {
            warn(deprecated(
                &format!("--level={n}"),
                &format!("--level={name}"),
            ));
        }
    }
    Ok(Levels {
        op: op || zero,
        kernel: kernel || one,
    })
}

/// `--analysis`: leaks, decompose, inefficient, oom[:K] or none.
pub fn analysis(opt: &str, v: &OsStr) -> Parsed<AnalysisSet> {
    const EXPECTED: &str = "invalid analysis type, expected a list of leaks, decompose, \
                            inefficient, oom[:K] or none";
    let mut tokens = list(opt, v, &format!("{EXPECTED} (use 'none' for no analysis)"))?;
    let mut top_k = None;
    for t in tokens.iter_mut() {
        if let Some(k) = t.strip_prefix("oom:") {
            let why = format!(
                "invalid OOM top-K value '{}', expected an integer from 1 to {MAX_OOM_TOP_K} \
                 without leading zeros",
                shown(k)
            );
            let k = parse_decimal(k, false).filter(|k| (1..=MAX_OOM_TOP_K).contains(k));
            top_k = Some(k.ok_or_else(|| invalid(opt, t, &why))?);
            *t = "oom";
        }
    }
    let names = ["leaks", "decompose", "inefficient", "oom", "none"];
    let [leaks, decompose, inefficient, oom, none] =
        flags(&tokens, names).map_err(|t| invalid(opt, t, EXPECTED))?;
    if cleared(opt, none, &tokens, "analysis types, all analyses") {
        return Ok(AnalysisSet::default());
    }
    let oom_top_k = oom.then(|| top_k.unwrap_or(DEFAULT_OOM_TOP_K));
    Ok(AnalysisSet {
        leaks,
        decompose,
        inefficient,
        oom_top_k,
    })
}

/// `--log-level`; `warn` is msMemScope's deprecated spelling of `warning`.
pub fn log_level(opt: &str, v: &OsStr) -> Parsed<LogLevel> {
    Ok(match utf8(opt, v)? {
        "debug" => LogLevel::Debug,
        "info" => LogLevel::Info,
        "warning" => LogLevel::Warning,
        "warn" => {
            warn(deprecated("--log-level=warn", "--log-level=warning"));
            LogLevel::Warning
        }
        "error" => LogLevel::Error,
        v => return Err(invalid(opt, v, "expected debug, info, warning or error")),
    })
}

pub fn steps(opt: &str, v: &OsStr) -> Parsed<List<u32>> {
    let tokens = list(
        opt,
        v,
        "invalid steps, expected a list of step numbers >= 1",
    )?;
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

pub fn call_stack(opt: &str, v: &OsStr) -> Parsed<CallStack> {
    let mut cs = CallStack::default();
    for t in split_list(utf8(opt, v)?) {
        let (kind, depth) = match t.split_once(':') {
            Some((k, d)) => match parse_decimal(d, true).filter(|d| *d <= MAX_CALL_STACK_DEPTH) {
                Some(depth) => (k, depth),
                None => {
                    let what = "invalid call-stack depth, expected c[:DEPTH] or python[:DEPTH] \
                                with DEPTH from 0 to 1000 without leading zeros";
                    return Err(invalid(opt, t, what));
                }
            },
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

pub fn devices(opt: &str, raw: &OsStr) -> Parsed<DeviceFilter> {
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
                let n = t.strip_prefix("npu:").and_then(parse_c_number);
                let n = n
                    .filter(|n| *n < MAX_NPU_SLOTS)
                    .ok_or_else(|| invalid(opt, t, EXPECTED))?;
                d.npu_mask |= 1 << n;
            }
        }
    }
    Ok(d)
}

/// Input dumps (and run directories where `dirs`): `counts` of them, each an existing regular
/// file under offline's input rules (a symlink is refused, not followed) and readable.
fn inputs(
    opt: &str,
    v: &OsStr,
    counts: RangeInclusive<usize>,
    expected: &str,
    dirs: bool,
) -> Parsed<Vec<PathBuf>> {
    too_long(opt, v, if dirs { 2 * MAX_PATH_LEN } else { MAX_PATH_LEN })?;
    let (whole, tokens) = (shown_os(v), split_list_os(v));
    let bad = |why: String| CliError::usage(format!("invalid {opt} value '{whole}': {why}"));
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
        match crate::offline::check_input_file(&path) {
            Err(e) => Err(bad(format!("invalid paths, '{t}' {}", e.message))),
            Ok(_) if !is_readable(&path) => {
                Err(bad(format!("invalid paths, '{t}' is not readable")))
            }
            Ok(_) => Ok(path),
        }
    };
    tokens.into_iter().map(input).collect()
}

/// `--compare --input-path A,B`: exactly two dump files.
pub fn compare_inputs(opt: &str, v: &OsStr) -> Parsed<[PathBuf; 2]> {
    let expected = "invalid paths, expected exactly two comma-separated dump files";
    let [a, b] =
        <[PathBuf; 2]>::try_from(inputs(opt, v, 2..=2, expected, false)?).expect("counted");
    Ok([a, b])
}

/// `analyze --input-path`: exactly one dump file, under the same rules as the compare inputs.
pub fn analyze_input(opt: &str, v: &OsStr) -> Parsed<PathBuf> {
    let expected = "'analyze' takes exactly one dump file";
    Ok(inputs(opt, v, 1..=1, expected, false)?.remove(0))
}

/// `report --input-path`: one or two runs, each a directory or a dump file.
pub fn report_inputs(opt: &str, v: &OsStr) -> Parsed<List<PathBuf>> {
    let expected = "'report' takes one run, or two to compare";
    inputs(opt, v, 1..=2, expected, true).map(List)
}

/// `report --format`: a list of html, perfetto, folded, speedscope.
pub fn report_formats(opt: &str, v: &OsStr) -> Parsed<Formats> {
    let v = utf8(opt, v)?;
    let names = ["html", "perfetto", "folded", "speedscope"];
    let what = "'report' writes html, perfetto, folded or speedscope (a list)";
    let [html, perfetto, folded, speedscope] =
        flags(&split_list(v), names).map_err(|_| invalid(opt, v, what))?;
    match [html, perfetto, folded, speedscope].contains(&true) {
        true => Ok(Formats {
            html,
            perfetto,
            folded,
            speedscope,
        }),
        false => Err(invalid(opt, v, "name at least one format")),
    }
}

/// `--at=exit|peak|SECONDS`.
pub fn at(opt: &str, v: &OsStr) -> Parsed<At> {
    let v = utf8(opt, v)?;
    match (v, v.parse::<f64>()) {
        ("exit" | "end", _) => Ok(At::Exit),
        ("peak", _) => Ok(At::Peak),
        (_, Ok(s)) if (0.0..1e9).contains(&s) => Ok(At::After((s * 1e9).round() as u64)),
        _ => {
            let what = "expected exit, peak or seconds after the dump's first event (e.g. 1.5)";
            Err(invalid(opt, v, what))
        }
    }
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
    if !is_readable(&path) {
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
