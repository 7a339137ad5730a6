//! Pictures of a run: `memscope-bpf report` and `analyze --by-site/--timeline`.
//!
//! A run (a `--output-path` directory, one process directory, or a single dump; ours or
//! msMemScope's, CSV or db, read through [`crate::offline::reader`]) is replayed into a
//! [`model::Model`]: memory per (process, device) and owner over time, peaks, 100 ms local
//! maxima, what was live at any moment, the blocks that leaked. From it:
//!
//! * [`html`]: one self-contained HTML page (ECharts inlined, no network): the curve stacked
//!   by owner with steps and the peak, the blocks live at the peak, leaks with stacks, flame
//!   charts of live and of total bytes by stack, the local-maximum timeline with the sites at
//!   each maximum, and a comparison when two runs are given;
//! * [`perfetto`]: Chrome trace-event JSON for ui.perfetto.dev and chrome://tracing;
//! * [`sites`]: live bytes per allocation site or stack (`--by-site`, `--by-stack`), folded
//!   stacks for `flamegraph.pl` and speedscope JSON, at the end and at the peak;
//! * [`escape`]: the one rule for a run's text on its way into all of these.
//!
//! Uses `offline` (reading runs), `analysis` (user sites), `output` (device keys), `settings` and `log`; never the live
//! stages (`trace`, `events`, `state`, `session`) (tests/layout.rs checks it).

pub mod escape;
pub mod html;
pub mod model;
pub mod perfetto;
pub mod sites;

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use crate::log;
use crate::settings::{Refused, split_list};
use model::{LiveBlock, Model, Moment, TrackKey};

/// What `report` writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Formats {
    pub html: bool,
    pub perfetto: bool,
    pub folded: bool,
    pub speedscope: bool,
}

/// `report --format`: a list of html, perfetto, folded, speedscope.
impl std::str::FromStr for Formats {
    type Err = Refused;

    fn from_str(s: &str) -> Result<Self, Refused> {
        let mut f = Formats::default();
        for t in split_list(s) {
            match t {
                "html" => f.html = true,
                "perfetto" => f.perfetto = true,
                "folded" => f.folded = true,
                "speedscope" => f.speedscope = true,
                _ => {
                    let what = "'report' writes html, perfetto, folded or speedscope (a list)";
                    return Err(Refused::new(s, what));
                }
            }
        }
        match f == Formats::default() {
            true => Err(Refused::new(s, "name at least one format")),
            false => Ok(f),
        }
    }
}

/// `report`'s request, from the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportRequest {
    /// One run, or two to compare (base first).
    pub inputs: Vec<PathBuf>,
    /// The HTML file; the other outputs are named after it (`<stem>.perfetto.json`, ...).
    pub output: PathBuf,
    pub formats: Formats,
}

/// `analyze`'s where-is-the-memory request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SitesRequest {
    /// `--by-site` or `--by-stack`.
    pub by_site: bool,
    pub by_stack: bool,
    /// `--at`: `None` for the end of the dump.
    pub at: Option<At>,
    /// `--timeline[=MS]`.
    pub timeline_ms: Option<u64>,
}

/// `--at=SECONDS|peak|exit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// Nanoseconds after the first event of the dump.
    After(u64),
    Peak,
    Exit,
}

/// `--at=exit|peak|SECONDS`.
impl std::str::FromStr for At {
    type Err = Refused;

    fn from_str(s: &str) -> Result<Self, Refused> {
        match (s, s.parse::<f64>()) {
            ("exit" | "end", _) => Ok(At::Exit),
            ("peak", _) => Ok(At::Peak),
            (_, Ok(secs)) if (0.0..1e9).contains(&secs) => {
                Ok(At::After((secs * 1e9).round() as u64))
            }
            _ => {
                let what = "expected exit, peak or seconds after the dump's first event (e.g. 1.5)";
                Err(Refused::new(s, what))
            }
        }
    }
}

/// Writes `bytes` to `path`, replacing a regular file there (never writing through a
/// symlink), mode 0640.
pub fn write_output(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = open_output(path)?;
    f.write_all(bytes)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Opens `path` for writing under the rules of [`write_output`]: its directory is reached
/// (and made, 0750) through `fsutil::Dir`, which follows no symlink an untrusted user could
/// have planted, and the file is opened relative to it with `O_NOFOLLOW`.
pub fn open_output(path: &Path) -> Result<std::fs::File> {
    use std::os::{fd::FromRawFd, unix::ffi::OsStrExt};
    let parent = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .with_context(|| format!("{} names no file", path.display()))?;
    let dir = crate::output::fsutil::Dir::open_root(parent)?;
    let cname = std::ffi::CString::new(name.as_bytes())
        .with_context(|| format!("{} has a NUL byte", path.display()))?;
    // SAFETY: openat with a valid directory fd and a NUL-terminated name.
    let fd = unsafe {
        libc::openat(
            dir.fd(),
            cname.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o640,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ELOOP) {
            anyhow::bail!(
                "{} is a symbolic link; refusing to write through it",
                path.display()
            );
        }
        return Err(e).with_context(|| format!("cannot create {}", path.display()));
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// `<dir>/<stem><suffix>` next to the HTML output.
pub fn sibling(html: &Path, suffix: &str) -> PathBuf {
    let stem = html
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "memscope_report".to_owned());
    html.with_file_name(format!("{stem}{suffix}"))
}

fn label(key: &TrackKey) -> String {
    format!("pid {} device {}", key.pid, key.device_label())
}

/// Live blocks per track.
type Snapshot = Vec<(TrackKey, Vec<LiveBlock>)>;

/// The blocks live at the end and at each device's peak, as (name, blocks) profiles.
fn exit_and_peak(model: &Model) -> Vec<(String, Snapshot)> {
    let keys: Vec<TrackKey> = model.tracks.keys().copied().collect();
    let mut moments = vec![Moment::End];
    moments.extend(keys.iter().map(|k| {
        model.tracks[k]
            .peak_event
            .map_or(Moment::End, Moment::AfterEvent)
    }));
    let snaps = model.snapshots(&moments);
    let at_exit: Vec<(TrackKey, Vec<LiveBlock>)> = snaps[0].clone().into_iter().collect();
    let at_peak: Vec<(TrackKey, Vec<LiveBlock>)> = keys
        .iter()
        .enumerate()
        .map(|(n, k)| (*k, snaps[n + 1].get(k).cloned().unwrap_or_default()))
        .collect();
    vec![("exit".to_owned(), at_exit), ("peak".to_owned(), at_peak)]
}

/// `memscope-bpf report`: returns the files written.
pub fn run(req: &ReportRequest) -> Result<Vec<PathBuf>> {
    let model = load_logged(&req.inputs[0])?;
    let mut written = Vec::new();
    let names: Vec<String> = req.inputs.iter().map(|p| p.display().to_string()).collect();
    if req.formats.html {
        let compare = match req.inputs.get(1) {
            Some(other) => Some(compare_input(&req.inputs[0], other)?),
            None => None,
        };
        let size = html::write(&model, &names, compare.as_ref(), &req.output)?;
        log::info(&format!(
            "report written to {} ({:.1} MiB)",
            req.output.display(),
            size as f64 / (1 << 20) as f64
        ));
        written.push(req.output.clone());
    }
    if req.formats.perfetto {
        let p = sibling(&req.output, ".perfetto.json");
        perfetto::write_trace(&model, open_output(&p)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
        log::info(&format!(
            "Perfetto/Chrome trace written to {} (open it in ui.perfetto.dev)",
            p.display()
        ));
        written.push(p);
    }
    if req.formats.folded || req.formats.speedscope {
        let profiles = exit_and_peak(&model);
        if req.formats.folded {
            for (name, tracks) in &profiles {
                let mut text = String::new();
                for (key, blocks) in tracks {
                    for line in sites::folded(&model, blocks).lines() {
                        text.push_str(&format!("{};{line}\n", label(key)));
                    }
                }
                let p = sibling(&req.output, &format!(".{name}.folded"));
                write_output(&p, text.as_bytes())?;
                log::info(&format!(
                    "folded stacks of the bytes live at the {name} written to {} (flamegraph.pl input)",
                    p.display()
                ));
                written.push(p);
            }
        }
        if req.formats.speedscope {
            let flat: Vec<(String, Vec<LiveBlock>)> = profiles
                .iter()
                .flat_map(|(name, tracks)| {
                    tracks
                        .iter()
                        .map(move |(k, b)| (format!("live at {name}, {}", label(k)), b.clone()))
                })
                .collect();
            let p = sibling(&req.output, ".speedscope.json");
            write_output(&p, &serde_json::to_vec(&sites::speedscope(&model, &flat))?)?;
            log::info(&format!(
                "speedscope profile written to {} (open it in speedscope.app)",
                p.display()
            ));
            written.push(p);
        }
    }
    Ok(written)
}

fn load_logged(input: &Path) -> Result<Model> {
    let model = model::load(input, model::DEFAULT_TIMELINE_MS)?;
    let rows: u64 = model.files.iter().map(|f| f.1).sum();
    log::info(&format!(
        "{}: {} dump file(s), {rows} row(s), {} event(s) drawn",
        input.display(),
        model.files.len(),
        model.events.len()
    ));
    Ok(model)
}

fn compare_input(base: &Path, other: &Path) -> Result<html::CompareInput> {
    let model = load_logged(other)?;
    // Op by op when each run has exactly one dump per device directory.
    let device_of = |p: &Path| {
        p.parent()
            .and_then(Path::parent)
            .and_then(|d| d.file_name())
            .map(|n| n.to_string_lossy().into_owned())
    };
    let a = model::dump_files(base)?;
    let b = model::dump_files(other)?;
    let mut pairs = Vec::new();
    if a.len() == 1 && b.len() == 1 {
        pairs.push((a[0].clone(), b[0].clone()));
    } else {
        for fa in &a {
            let da = device_of(fa);
            let same: Vec<&PathBuf> = b.iter().filter(|fb| device_of(fb) == da).collect();
            if let [fb] = same[..] {
                pairs.push((fa.clone(), fb.clone()));
            }
        }
    }
    Ok(html::CompareInput {
        name: other.display().to_string(),
        base_name: base.display().to_string(),
        model,
        pairs,
    })
}

/// `analyze --by-site/--by-stack/--at/--timeline`: prints the table(s) on stdout, writes the
/// timeline CSV under `out_dir`; returns the files written.
pub fn analyze(input: &Path, req: &SitesRequest, out_dir: &Path) -> Result<Vec<PathBuf>> {
    let timeline_ms = req.timeline_ms.unwrap_or(model::DEFAULT_TIMELINE_MS);
    let model = model::load(input, timeline_ms)?;
    let mut written = Vec::new();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if req.by_site || req.by_stack {
        let at = req.at.unwrap_or(At::Exit);
        let keys: Vec<TrackKey> = model.tracks.keys().copied().collect();
        let moments: Vec<Moment> = keys
            .iter()
            .map(|k| match at {
                At::Exit => Moment::End,
                At::Peak => model.tracks[k]
                    .peak_event
                    .map_or(Moment::End, Moment::AfterEvent),
                At::After(ns) => Moment::AtTime(model.t0 + ns),
            })
            .collect();
        let snaps = model.snapshots(&moments);
        let when = match at {
            At::Exit => "at the end of the dump".to_owned(),
            At::Peak => "at the device's peak".to_owned(),
            At::After(ns) => format!("at {} s", ns as f64 / 1e9),
        };
        for (n, key) in keys.iter().enumerate() {
            let empty = Vec::new();
            let blocks = snaps[n].get(key).unwrap_or(&empty);
            let rows = sites::by_site(&model, blocks, req.by_stack);
            let total: u64 = rows.iter().map(|r| r.bytes).sum();
            writeln!(
                out,
                "{}: {} live {when} in {} block(s), by {}",
                label(key),
                crate::output::leaks::human_bytes(total),
                blocks.len(),
                if req.by_stack { "stack" } else { "site" }
            )?;
            for r in &rows {
                if req.by_stack {
                    writeln!(out, "{:>16} bytes {:>8} block(s)", r.bytes, r.blocks)?;
                    for l in r.key.lines() {
                        writeln!(out, "      {l}")?;
                    }
                } else {
                    writeln!(
                        out,
                        "{:>16} bytes {:>8} block(s)  {}",
                        r.bytes, r.blocks, r.key
                    )?;
                }
            }
        }
    }
    if req.timeline_ms.is_some() {
        let tl = html::timeline_sites(&model, req.by_stack);
        let mut csv = String::from(
            "Process Id,Device Id,Interval Start(ms),Time(ms),Bytes,Top Site,Top Site Bytes\n",
        );
        for (key, t) in &model.tracks {
            for (i, m) in t.timeline.iter().enumerate() {
                let top = tl[key][i].first();
                csv.push_str(&format!(
                    "{},{},{},{:.3},{},{},{}\n",
                    key.pid,
                    key.device_label(),
                    m.start_ns / 1_000_000,
                    (m.ts - model.t0) as f64 / 1e6,
                    m.bytes,
                    csv_field(top.map_or("", |r| r.key.as_str())),
                    top.map_or(0, |r| r.bytes)
                ));
            }
        }
        let p = out_dir.join(format!("memscope_timeline_{timeline_ms}ms.csv"));
        write_output(&p, csv.as_bytes())?;
        log::info(&format!(
            "local maximum per {timeline_ms} ms written to {} (the report draws it: \
             memscope-bpf report -i {})",
            p.display(),
            input.display()
        ));
        written.push(p);
    }
    Ok(written)
}

/// A CSV field, quoted when it holds a comma, quote or line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}
