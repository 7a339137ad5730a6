//! The run settings: what to collect (events, levels, devices, stacks), which analyses, how
//! to write, as the tracer, the writers and the agent consume them. The command line (`cli`)
//! and the agent's options build them; config.json (`output::config_json`) records them.
//!
//! Each setting also knows how msMemScope spells it (`EventSet::parse`, `impl FromStr`, ...):
//! a refused value comes back as a [`Refused`] reason and remarks on an accepted one as
//! [`Notice`]s; `cli` names the option and words both for the user.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::str::FromStr;

/// `oomTopK` when `--analysis=oom` gives no K (and the value written to config.json otherwise).
pub const DEFAULT_OOM_TOP_K: u32 = 10;
/// NPU slots addressable with `--device=npu:N` (N < 32).
pub const MAX_NPU_SLOTS: u32 = 32;
/// Device id msMemScope uses for "unknown device"; such events always pass the device filter.
pub const UNKNOWN_DEVICE_ID: u32 = 9999;
/// `watchConfig.outputId` when no outid is given.
pub const WATCH_NO_OUTPUT_ID: u32 = u32::MAX;
/// `--call-stack` depth when a kind gives none, and the deepest allowed.
pub const DEFAULT_CALL_STACK_DEPTH: u32 = 50;
/// Python frames taken by default (no `--call-stack`): enough for the program's own line
/// under the framework's few (torch.nn's module call, functional, the op), not a full walk.
pub const DEFAULT_PYTHON_LINE_DEPTH: u32 = 16;
/// `--call-stack`'s default: the Python frames that hold the program's own line.
pub const DEFAULT_CALL_STACK: &str = "python:16";
pub const MAX_CALL_STACK_DEPTH: u32 = 1000;
pub const MAX_OOM_TOP_K: u32 = 1000;
/// At most this many `--steps` values (config.json's `SelectedStepList.stepIdList[5]`).
pub const MAX_STEPS: usize = 5;
/// Longest `--watch` start/end name in bytes (msMemScope stores them in 255-byte C buffers).
pub const MAX_WATCH_NAME_LEN: usize = 254;

/// Why a value was refused: the part at fault (or the whole value; `None` where it is too long
/// to show) and what was wrong or expected. User text in it is not escaped: whoever shows it
/// does that.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub part: Option<String>,
    pub why: String,
}

impl Refused {
    pub fn new(part: &str, why: impl Into<String>) -> Self {
        Refused {
            part: Some(part.to_owned()),
            why: why.into(),
        }
    }
}

/// A remark on an accepted value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// `old` is msMemScope's deprecated spelling of `new`.
    Deprecated {
        old: &'static str,
        new: &'static str,
    },
    /// A part of the value that has no effect, and why.
    Ignored(String),
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

/// The tokens of a list value; an empty list is refused, saying `if_empty`.
pub fn list<'a>(value: &'a str, if_empty: &str) -> Result<Vec<&'a str>, Refused> {
    let tokens = split_list(value);
    match tokens.is_empty() {
        true => Err(Refused::new(value, if_empty)),
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
fn cleared(none: bool, tokens: &[&str], what: &str, notices: &mut Vec<Notice>) -> bool {
    if none && tokens.len() > 1 {
        notices.push(Notice::Ignored(format!(
            "'none' mixed with other {what} cleared"
        )));
    }
    none
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

/// Event kinds (config.json bits: 0 alloc, 1 free, 2 launch, 3 access).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventSet {
    pub alloc: bool,
    pub free: bool,
    pub launch: bool,
    pub access: bool,
}

impl EventSet {
    /// No events.
    pub const NONE: EventSet = EventSet {
        alloc: false,
        free: false,
        launch: false,
        access: false,
    };
    /// msMemScope's default `--events`: alloc, free, launch.
    pub const CLI_DEFAULT: EventSet = EventSet {
        alloc: true,
        free: true,
        launch: true,
        access: false,
    };

    /// Bitfield as written to config.json (`eventType` / `dumpEventType`).
    pub fn bits(&self) -> u8 {
        u8::from(self.alloc)
            | (u8::from(self.free) << 1)
            | (u8::from(self.launch) << 2)
            | (u8::from(self.access) << 3)
    }

    /// Union of two sets.
    pub fn union(self, other: EventSet) -> EventSet {
        EventSet {
            alloc: self.alloc || other.alloc,
            free: self.free || other.free,
            launch: self.launch || other.launch,
            access: self.access || other.access,
        }
    }

    /// The event-to-event implied collection rules: alloc needs free, free needs alloc,
    /// access needs alloc and free.
    pub fn with_implied(self) -> EventSet {
        let mut e = self;
        if self.alloc || self.free || self.access {
            e.alloc = true;
            e.free = true;
        }
        e
    }

    /// `--events`: a list of event kinds; `none` clears, `traceback` is accepted and ignored.
    pub fn parse(s: &str, notices: &mut Vec<Notice>) -> Result<EventSet, Refused> {
        let what = "expected a list of alloc, free, launch, access, traceback or none \
                    (use 'none' for no events)";
        let tokens = list(s, what)?;
        let names = ["alloc", "free", "launch", "access", "traceback", "none"];
        let [alloc, free, launch, access, traceback, none] = flags(&tokens, names)
            .map_err(|t| Refused::new(t, format!("invalid event trace type, {what}")))?;
        if cleared(none, &tokens, "event types, all events", notices) {
            return Ok(EventSet::NONE);
        }
        if traceback {
            notices.push(Notice::Ignored(format!(
                "'traceback' (Python function tracing) is not supported by {} and is ignored",
                env!("CARGO_PKG_NAME")
            )));
        }
        Ok(EventSet {
            alloc,
            free,
            launch,
            access,
        })
    }
}

/// Trace levels (config.json `levelType`: bit0 op, bit1 kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Levels {
    pub op: bool,
    pub kernel: bool,
}

impl Default for Levels {
    /// Default level: op only.
    fn default() -> Self {
        Levels {
            op: true,
            kernel: false,
        }
    }
}

impl Levels {
    /// Bitfield as written to config.json.
    pub fn bits(&self) -> u8 {
        u8::from(self.op) | (u8::from(self.kernel) << 1)
    }

    /// `--level`: op and/or kernel; msMemScope's numbers 0 and 1 with a deprecation notice.
    pub fn parse(s: &str, notices: &mut Vec<Notice>) -> Result<Levels, Refused> {
        let tokens = list(
            s,
            "invalid data trace level, expected op, kernel or op,kernel",
        )?;
        let what =
            "invalid data trace level, expected op or kernel (a list like op,kernel is allowed)";
        let [op, kernel, zero, one] =
            flags(&tokens, ["op", "kernel", "0", "1"]).map_err(|t| Refused::new(t, what))?;
        for (given, old, new) in [(zero, "0", "op"), (one, "1", "kernel")] {
            if given {
                notices.push(Notice::Deprecated { old, new });
            }
        }
        Ok(Levels {
            op: op || zero,
            kernel: kernel || one,
        })
    }
}

/// Which devices' events are kept (spec §2.5 `IsNeedSkip`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceFilter {
    /// `npu`: every NPU (overrides `npu_mask`).
    pub all_npu: bool,
    /// `npu:N` slots, bit N set.
    pub npu_mask: u32,
    /// `cpu`: host (CPU) memory events.
    pub cpu: bool,
}

impl Default for DeviceFilter {
    /// Default device filter: all NPUs, no CPU.
    fn default() -> Self {
        DeviceFilter {
            all_npu: true,
            npu_mask: 0,
            cpu: false,
        }
    }
}

impl DeviceFilter {
    /// Whether events of NPU `id` are kept. The unknown device id 9999 always passes.
    pub fn wants_npu(&self, id: u32) -> bool {
        self.all_npu
            || id == UNKNOWN_DEVICE_ID
            || (id < MAX_NPU_SLOTS && self.npu_mask & (1u32 << id) != 0)
    }

    /// Whether CPU (host) events are kept.
    pub fn wants_cpu(&self) -> bool {
        self.cpu
    }
}

/// `--device`: npu, cpu or npu:N (N in C notation: `npu:0x1f`, `npu:010`).
impl FromStr for DeviceFilter {
    type Err = Refused;

    fn from_str(s: &str) -> Result<Self, Refused> {
        const EXPECTED: &str = "expected npu, cpu or npu:N with N < 32";
        let mut d = DeviceFilter {
            all_npu: false,
            npu_mask: 0,
            cpu: false,
        };
        for t in list(s, &format!("{EXPECTED} (at least one device)"))? {
            match t {
                "npu" => d.all_npu = true,
                "cpu" => d.cpu = true,
                _ => {
                    let n = t.strip_prefix("npu:").and_then(parse_c_number);
                    let n = n
                        .filter(|n| *n < MAX_NPU_SLOTS)
                        .ok_or_else(|| Refused::new(t, EXPECTED))?;
                    d.npu_mask |= 1 << n;
                }
            }
        }
        Ok(d)
    }
}

/// Analyses (config.json `analysisType`: bit0 leaks, 1 decompose, 2 inefficient, 3 oom).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AnalysisSet {
    pub leaks: bool,
    pub decompose: bool,
    pub inefficient: bool,
    /// `Some(K)` when OOM analysis is on, K = number of top records (1..=1000).
    pub oom_top_k: Option<u32>,
}

impl AnalysisSet {
    /// msMemScope's default `--analysis`: leaks.
    pub const CLI_DEFAULT: AnalysisSet = AnalysisSet {
        leaks: true,
        decompose: false,
        inefficient: false,
        oom_top_k: None,
    };

    /// Bitfield as written to config.json.
    pub fn bits(&self) -> u8 {
        u8::from(self.leaks)
            | (u8::from(self.decompose) << 1)
            | (u8::from(self.inefficient) << 2)
            | (u8::from(self.oom_top_k.is_some()) << 3)
    }

    /// True when no analysis is selected.
    pub fn is_empty(&self) -> bool {
        self.bits() == 0
    }

    /// Events these analyses need collected (spec §4 "Implied collection").
    pub fn implied_events(&self) -> EventSet {
        let mut e = EventSet::NONE;
        if self.leaks || self.oom_top_k.is_some() {
            e.alloc = true;
            e.free = true;
        }
        if self.decompose {
            e.alloc = true;
            e.free = true;
            e.access = true;
        }
        if self.inefficient {
            e = EventSet {
                alloc: true,
                free: true,
                launch: true,
                access: true,
            };
        }
        e
    }

    /// `--analysis`: leaks, decompose, inefficient, oom[:K] or none.
    pub fn parse(s: &str, notices: &mut Vec<Notice>) -> Result<AnalysisSet, Refused> {
        const EXPECTED: &str = "invalid analysis type, expected a list of leaks, decompose, \
                                inefficient, oom[:K] or none";
        let mut tokens = list(s, &format!("{EXPECTED} (use 'none' for no analysis)"))?;
        let mut top_k = None;
        for t in tokens.iter_mut() {
            if let Some(k) = t.strip_prefix("oom:") {
                let why = format!(
                    "invalid OOM top-K value '{k}', expected an integer from 1 to {MAX_OOM_TOP_K} \
                     without leading zeros"
                );
                let k = parse_decimal(k, false).filter(|k| (1..=MAX_OOM_TOP_K).contains(k));
                top_k = Some(k.ok_or_else(|| Refused::new(t, why))?);
                *t = "oom";
            }
        }
        let names = ["leaks", "decompose", "inefficient", "oom", "none"];
        let [leaks, decompose, inefficient, oom, none] =
            flags(&tokens, names).map_err(|t| Refused::new(t, EXPECTED))?;
        if cleared(none, &tokens, "analysis types, all analyses", notices) {
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
}

/// Call-stack capture; `None` disables that kind of stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallStack {
    pub c_depth: Option<u32>,
    pub python_depth: Option<u32>,
    /// `mixed[:D]` (ours): both stacks, and in the C column each `_PyEval_EvalFrameDefault`
    /// frame is replaced by the Python frames it was running.
    pub mixed: bool,
    /// Stacks for the calls that allocate only (the default, no `--call-stack`: the line that
    /// made each block, which is what the leak and site views show); a `--call-stack` given
    /// on the command line takes every call's.
    pub allocations_only: bool,
}

/// `--call-stack`: c[:DEPTH], python[:DEPTH] or mixed[:DEPTH]; an empty value disables stacks.
impl FromStr for CallStack {
    type Err = Refused;

    fn from_str(s: &str) -> Result<Self, Refused> {
        let mut cs = CallStack::default();
        for t in split_list(s) {
            let (kind, depth) = match t.split_once(':') {
                Some((k, d)) => match parse_decimal(d, true).filter(|d| *d <= MAX_CALL_STACK_DEPTH)
                {
                    Some(depth) => (k, depth),
                    None => {
                        let what = "invalid call-stack depth, expected c[:DEPTH] or \
                                    python[:DEPTH] with DEPTH from 0 to 1000 without leading zeros";
                        return Err(Refused::new(t, what));
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
                    let what = "expected c[:DEPTH], python[:DEPTH] or mixed[:DEPTH] (an empty \
                                value disables stacks)";
                    return Err(Refused::new(t, what));
                }
            }
        }
        Ok(cs)
    }
}

/// `--collect-mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CollectMode {
    /// Trace from the start (default).
    #[default]
    Immediate,
    /// Wait for the program to start tracing itself.
    Deferred,
}

impl CollectMode {
    /// config.json value: the declaration order is msMemScope's numbering.
    pub fn config_value(self) -> u8 {
        self as u8
    }
}

/// `--format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DataFormat {
    #[default]
    Csv,
    Db,
}

impl DataFormat {
    /// config.json value: the declaration order is msMemScope's numbering.
    pub fn config_value(self) -> u8 {
        self as u8
    }
}

/// `--log-level`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogLevel {
    Debug,
    #[default]
    Info,
    Warning,
    Error,
}

impl LogLevel {
    /// config.json value: the declaration order is msMemScope's numbering.
    pub fn config_value(self) -> u8 {
        self as u8
    }

    /// `--log-level`; `warn` is msMemScope's deprecated spelling of `warning`.
    pub fn parse(s: &str, notices: &mut Vec<Notice>) -> Result<LogLevel, Refused> {
        Ok(match s {
            "debug" => LogLevel::Debug,
            "info" => LogLevel::Info,
            "warning" => LogLevel::Warning,
            "warn" => {
                notices.push(Notice::Deprecated {
                    old: "warn",
                    new: "warning",
                });
                LogLevel::Warning
            }
            "error" => LogLevel::Error,
            _ => return Err(Refused::new(s, "expected debug, info, warning or error")),
        })
    }
}

/// Parsed `--watch=[start[:outid]],end[,full-content]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchConfig {
    /// Op/kernel name that starts watching; `None` for `,end`.
    pub start: Option<String>,
    /// Only this output tensor of the start op (requires a start).
    pub output_id: Option<u32>,
    /// Op/kernel name that ends watching.
    pub end: String,
    /// Dump full tensor contents instead of checksums.
    pub full_content: bool,
}

/// `--watch=[START[:OUTID]],END[,full-content]`.
impl FromStr for WatchConfig {
    type Err = Refused;

    fn from_str(value: &str) -> Result<Self, Refused> {
        const EXPECTED: &str = "invalid watch config, expected [START[:OUTID]],END[,full-content] \
                                (the comma before END is required; OUTID needs a START)";
        let bad = |why: &str| Refused::new(value, format!("{why}; {EXPECTED}"));
        let Some((start_part, rest)) = value.split_once(',') else {
            return Err(bad("missing ','"));
        };
        let (end, full_content) = match rest.split_once(',') {
            None => (rest, false),
            Some((e, "full-content")) => (e, true),
            Some((_, t)) => return Err(bad(&format!("unexpected '{t}' after END"))),
        };
        if end.is_empty() {
            return Err(bad("END is empty"));
        }
        let (start, output_id) = match start_part.split_once(':') {
            Some(("", _)) => return Err(bad("an OUTID needs a START name")),
            Some((s, id)) => {
                let why = "is not an unsigned 32-bit integer without leading zeros";
                let id =
                    parse_decimal(id, true).ok_or_else(|| bad(&format!("OUTID '{id}' {why}")))?;
                (Some(s), Some(id))
            }
            None => (Some(start_part).filter(|s| !s.is_empty()), None),
        };
        if let Some(name) = start
            .iter()
            .chain([&end])
            .find(|n| n.len() > MAX_WATCH_NAME_LEN)
        {
            let name: String = name.chars().take(32).collect();
            let why = format!("the name '{name}...' is longer than {MAX_WATCH_NAME_LEN} bytes");
            return Err(bad(&why));
        }
        Ok(WatchConfig {
            start: start.map(str::to_owned),
            output_id,
            end: end.to_owned(),
            full_content,
        })
    }
}

/// `--drop-frames`: substrings of the function or file names of frames passed over when the
/// program's line of an allocation is named (`analysis::sites`). Set once, at start.
static DROP_FRAMES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// Sets `--drop-frames` (empty patterns ignored); only the first call counts.
pub fn set_drop_frames(patterns: Vec<String>) {
    let _ = DROP_FRAMES.set(patterns.into_iter().filter(|p| !p.is_empty()).collect());
}

/// The `--drop-frames` patterns (none unless set).
pub fn drop_frames() -> &'static [String] {
    DROP_FRAMES.get().map_or(&[], |v| v.as_slice())
}
