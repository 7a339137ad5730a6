//! Command-line parsing and validation for `memscope-bpf`, with clap (derive).
//!
//! msMemScope's options, defaults, value rules and deprecated aliases (spec, section 4), except
//! that everything from the first non-option argument on belongs to the traced program, untouched
//! (msMemScope's getopt also consumed options after it). `args.rs` declares the options,
//! `values.rs` gives clap the value rules (each type's own, in `crate::settings` and
//! `crate::report`; `crate::output`'s path rules, `crate::offline`'s input rules); this file
//! sets the mode, checks what spans several options and words clap's errors. `--help` and
//! `--version` are `Err` with `exit_code` 0 (print on stdout); usage errors have `exit_code` 2.

mod args;
#[cfg(test)]
mod tests;
mod types;
mod values;

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};

use crate::log::{shown, shown_os};
use crate::settings::*;
pub use args::Options;
use args::{Cli, Sub};
pub use types::*;
use values::List;

/// The clap command. An option's value is the next argument whatever it looks like, as with
/// getopt (`--events -v` is an error about "-v"); the program's positional keeps clap's default,
/// so that an unknown option is an error, not a program. The help texts state the defaults.
fn command() -> clap::Command {
    let tune = |a: clap::Arg| match a.get_action().takes_values() {
        true => {
            let option = a.get_long().is_some() || a.get_short().is_some();
            a.allow_hyphen_values(option)
                .hide_default_value(true)
                .hide_possible_values(true)
        }
        false => a,
    };
    Cli::command()
        .mut_args(tune)
        .mut_subcommands(|s| s.mut_args(tune))
}

/// Parse the command line (`args[0]` is the program name).
pub fn parse_from<I, T>(args: I) -> Result<Options, CliError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let argv: Vec<OsString> = args.into_iter().map(Into::into).collect();
    values::take_warnings();
    let parsed = command()
        .try_get_matches_from(&argv)
        .and_then(|m| Ok((Cli::from_arg_matches(&m)?, m)));
    let (cli, matches) = parsed.map_err(|e| from_clap(e, &argv))?;
    let mut opts = cli.opts;
    // Deprecated spellings among the options (the program's words are its own).
    for word in argv.iter().take(argv.len() - cli.program.len()).skip(1) {
        for (old, new) in args::DEPRECATED
            .into_iter()
            .filter(|(old, _)| spelled(word, old))
        {
            values::warn(values::deprecated(old, new));
        }
    }
    let drop_frames = match &cli.command {
        Some(Sub::Analyze(a)) => a.sites.drop_frames.clone(),
        Some(Sub::Report(r)) => r.sites.drop_frames.clone(),
        _ => cli.sites.drop_frames.clone(),
    };
    crate::settings::set_drop_frames(drop_frames);
    let (mode, output, log) = match cli.command {
        Some(Sub::Analyze(a)) => {
            opts.sites = crate::report::SitesRequest {
                by_site: a.by_site,
                by_stack: a.by_stack,
                at: a.at,
                timeline_ms: a
                    .timeline
                    .map(|ms| ms.map_or(crate::report::model::DEFAULT_TIMELINE_MS, u64::from)),
            };
            let input = a.input_path.ok_or_else(|| {
                CliError::usage("analyze needs the dump to read: analyze --input-path=DUMP")
            })?;
            (Mode::Analyze { input }, a.output_path, a.log)
        }
        Some(Sub::Report(r)) => {
            let Some(List(inputs)) = r.input_path else {
                return Err(CliError::usage(
                    "report needs the run to draw: report --input-path=RUN_DIR|DUMP",
                ));
            };
            let mut formats = r.format;
            formats.perfetto |= r.perfetto;
            if inputs.len() == 2 && !formats.html {
                return Err(CliError::usage(
                    "two runs are compared in the HTML report: add html to --format",
                ));
            }
            let request = crate::report::ReportRequest {
                inputs,
                output: r.output_path.map_or_else(values::default_report_page, Ok)?,
                formats,
            };
            (Mode::Report { request }, None, r.log)
        }
        Some(Sub::Agent(agent)) => {
            opts.mode = Mode::Agent(agent);
            opts.warnings = values::take_warnings();
            return Ok(opts);
        }
        None => (
            trace_mode(cli.pid, cli.compare, cli.input_path, cli.program, &argv)?,
            cli.output_path,
            cli.log,
        ),
    };
    opts.mode = mode;
    // The default stack is the allocating line: no frames walked for frees and other calls.
    opts.call_stack.allocations_only =
        matches.value_source("call_stack") == Some(ValueSource::DefaultValue);
    opts.log_level = log.level();
    opts.output_dir = output.map_or_else(values::default_output_dir, Ok)?;
    opts.steps = cli.steps.map(|List(s)| s).unwrap_or_default();
    if opts.max_files.is_some() && opts.max_file_mib.is_none() {
        return Err(CliError::usage(
            "--max-files needs --max-file-mib (files are only rotated by size)",
        ));
    }
    if opts.max_file_mib.is_some() && opts.format == DataFormat::Db {
        return Err(CliError::usage(
            "--max-file-mib rotates CSV dumps; it cannot be used with --format=db",
        ));
    }
    if !opts.steps.is_empty() && opts.analysis.leaks {
        opts.analysis.leaks = false;
        if matches.value_source("analysis") == Some(ValueSource::CommandLine) {
            values::warn("leak analysis is turned off because --steps is given".to_owned());
        }
    }
    opts.events = opts
        .dump_events
        .with_implied()
        .union(opts.analysis.implied_events());
    opts.warnings = values::take_warnings();
    Ok(opts)
}

impl Options {
    /// What config.json records of these options.
    pub fn recorded(&self) -> crate::output::config_json::Recorded {
        crate::output::config_json::Recorded {
            call_stack: self.call_stack,
            compare: matches!(self.mode, Mode::Compare { .. }),
            levels: self.levels,
            events: self.events,
            dump_events: self.dump_events,
            analysis: self.analysis,
            collect_mode: self.collect_mode,
            output_dir: self.output_dir.clone(),
            format: self.format,
            devices: self.devices,
            log_level: self.log_level,
            steps: self.steps.clone(),
            watch: self.watch.clone(),
        }
    }

    /// What `--compare` and `analyze` need: where to write and what config.json records.
    pub fn offline(&self) -> crate::offline::OfflineSettings {
        crate::offline::OfflineSettings {
            output_dir: self.output_dir.clone(),
            levels: self.levels,
            config_json: crate::output::config_json::config_json(&self.recorded()),
        }
    }
}

/// Whether `word` is option `name`, alone or with `=value`.
fn spelled(word: &OsStr, name: &str) -> bool {
    let word = word.as_bytes();
    word.strip_prefix(name.as_bytes())
        .is_some_and(|rest| rest.is_empty() || rest[0] == b'=')
}

/// Launch, attach or compare, from the program, `--pid`, `--compare` and `--input-path`.
fn trace_mode(
    pid: Option<u32>,
    compare: bool,
    inputs: Option<[PathBuf; 2]>,
    words: Vec<OsString>,
    argv: &[OsString],
) -> Result<Mode, CliError> {
    let mut words = words.into_iter();
    let program = words.next();
    if program.is_none() && argv.iter().skip(1).any(|a| a == "--") {
        return Err(CliError::usage(format!(
            "'--' must be followed by the program to launch (see '{PROGRAM_NAME} --help')"
        )));
    }
    let only_with_compare = || CliError::usage("--input-path is only used together with --compare");
    match (program, pid, compare, inputs) {
        (Some(_), Some(_), _, _) => Err(CliError::usage(
            "--pid cannot be combined with a program to launch; use one or the other",
        )),
        (_, Some(_), true, _) => Err(CliError::usage(
            "--pid and --compare cannot be used together",
        )),
        (Some(program), None, true, _) => Err(CliError::usage(format!(
            "--compare runs no program, but '{}' was given",
            shown_os(&program)
        ))),
        (None, None, true, Some(inputs)) => Ok(Mode::Compare { inputs }),
        (None, None, true, None) => Err(CliError::usage(
            "--compare needs two dump files: --input-path=<A>,<B>",
        )),
        (_, _, false, Some(_)) => Err(only_with_compare()),
        (Some(program), None, false, None) => Ok(Mode::Launch {
            program,
            args: words.collect(),
        }),
        (None, Some(pid), false, None) => Ok(Mode::Attach { pid }),
        (None, None, false, None) => Err(CliError::usage(format!(
            "nothing to trace: give a program to launch, --pid PID or --compare \
             (see '{PROGRAM_NAME} --help')"
        ))),
    }
}

/// A clap error in this program's words: one line, the option as the user can find it in
/// `--help`, and for options of another mode, where they belong. `argv[1]` names the mode.
pub(crate) fn from_clap(e: clap::Error, argv: &[OsString]) -> CliError {
    let text = |kind| match e.get(kind) {
        Some(ContextValue::String(s)) => s.clone(),
        _ => String::new(),
    };
    let mode = argv.get(1).and_then(|a| a.to_str());
    let mode = mode.filter(|m| ["analyze", "report", "agent"].contains(m));
    // clap names an option with its placeholder: "--events <LIST>".
    let invalid_arg = text(ContextKind::InvalidArg);
    let arg = invalid_arg.split(' ').next().unwrap_or_default();
    // Name a deprecated spelling as written.
    let arg = args::DEPRECATED
        .into_iter()
        .find(|(old, new)| *new == arg && argv.iter().any(|a| spelled(a, old)))
        .map_or(arg, |(old, _)| old);
    let value = text(ContextKind::InvalidValue);
    let last = argv.last().map(|a| a.to_string_lossy()).unwrap_or_default();
    let message = match e.kind() {
        ErrorKind::DisplayHelp => return CliError::info(e.to_string().trim_end()),
        ErrorKind::DisplayVersion => {
            return CliError::info(format!("{PROGRAM_NAME} {}", env!("CARGO_PKG_VERSION")));
        }
        // Ours carry the whole message; clap's (plain fn parsers) the reason as the source.
        ErrorKind::ValueValidation => {
            match (text(ContextKind::Custom), std::error::Error::source(&e)) {
                (ours, _) if !ours.is_empty() => ours,
                (_, why) => {
                    let why = why.map(|w| w.to_string()).unwrap_or_default();
                    format!("invalid {arg} value '{}': {why}", shown(&value))
                }
            }
        }
        // A missing value: values may start with '-', so only the last argument can lack one.
        ErrorKind::InvalidValue
            if value.is_empty() && last.starts_with('-') && !last.contains('=') =>
        {
            let name = match last.strip_prefix("--") {
                Some(_) => last.to_string(),
                None => format!("-{}", last.chars().last().unwrap_or('?')),
            };
            match mode {
                Some("agent") => format!("{name} needs a value"),
                _ => format!("option '{name}' requires a value (see '{PROGRAM_NAME} --help')"),
            }
        }
        ErrorKind::InvalidValue => {
            let valid = match e.get(ContextKind::ValidValue) {
                Some(ContextValue::Strings(v)) => v.clone(),
                _ => Vec::new(),
            };
            let expected = match valid.split_last() {
                Some((last, [])) => last.clone(),
                Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                None => "a value".to_owned(),
            };
            format!(
                "invalid {arg} value '{}': expected {expected}",
                shown(&value)
            )
        }
        ErrorKind::TooManyValues => format!("option '{arg}' takes no value"),
        ErrorKind::UnknownArgument => {
            // clap's suggestion for a near miss: "--event" gets "did you mean '--events'?".
            let hint = match text(ContextKind::SuggestedArg) {
                near if near.starts_with('-') => format!("did you mean '{near}'? "),
                _ => String::new(),
            };
            unknown_argument(arg, mode, argv).replace("(see '", &format!("({hint}see '"))
        }
        _ => {
            let rendered = e.to_string();
            let first = rendered.lines().next().unwrap_or_default();
            first.strip_prefix("error: ").unwrap_or(first).to_owned()
        }
    };
    CliError::usage(message)
}

fn unknown_argument(arg: &str, mode: Option<&str>, argv: &[OsString]) -> String {
    let help = match mode {
        Some(mode) => format!("{PROGRAM_NAME} {mode} --help"),
        None => format!("{PROGRAM_NAME} --help"),
    };
    if !arg.starts_with('-') {
        let why = match mode {
            Some("analyze") => format!(
                "'analyze' reads the dump given with --input-path=DUMP (to launch a program \
                 named analyze, write '{PROGRAM_NAME} -- analyze')"
            ),
            Some("report") => "'report' reads the run given with --input-path=RUN".to_owned(),
            _ => format!(
                "the agent takes no program or pid, it traces every process using the Ascend \
                 libraries (see '{help}')"
            ),
        };
        return format!("unexpected argument '{}': {why}", shown(arg));
    }
    // clap shows bytes that are not UTF-8 as U+FFFD; show the user's own bytes instead.
    let raw = argv
        .iter()
        .skip(1)
        .find(|a| a.to_str().is_none() && a.as_bytes().starts_with(b"-"));
    let arg = match raw {
        Some(raw) if arg.contains('\u{fffd}') => {
            let bytes = raw.as_bytes();
            shown_os(OsStr::from_bytes(
                bytes.split(|&b| b == b'=').next().unwrap_or(bytes),
            ))
        }
        _ => shown(arg),
    };
    // Which command takes `arg`, read from clap's own definitions (a new option needs no entry).
    let root = Cli::command();
    let takes = |c: &clap::Command| {
        c.get_arguments().any(|a| {
            a.get_long().is_some_and(|l| arg == format!("--{l}"))
                || a.get_short().is_some_and(|s| arg == format!("-{s}"))
        })
    };
    match (mode, root.get_subcommands().find(|s| takes(s))) {
        (Some("agent"), _) => format!("unknown agent option '{arg}' (see '{help}')"),
        (Some(sub), _) if takes(&root) => {
            format!("{arg} cannot be used with '{sub}' (see '{help}')")
        }
        (None, Some(sub)) if !takes(&root) => {
            let sub = sub.get_name();
            format!("{arg} belongs to '{sub}': {PROGRAM_NAME} {sub} -i INPUT {arg}")
        }
        _ => format!("unrecognized option '{arg}' (see '{help}')"),
    }
}
