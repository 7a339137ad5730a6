//! `config.json`: the options as msMemScope writes them beside its results (spec §3.7).
//!
//! The front end fills a [`Recorded`] from its options; this stage never reads the command
//! line itself (tests/layout.rs: nothing uses `cli`).

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::settings::{
    AnalysisSet, CallStack, CollectMode, DEFAULT_OOM_TOP_K, DataFormat, DeviceFilter, EventSet,
    Levels, LogLevel, MAX_STEPS, WATCH_NO_OUTPUT_ID, WatchConfig,
};

/// What config.json records of a run's settings, as the command line gave them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub call_stack: CallStack,
    /// `--compare` (msMemScope's `enableCompare`).
    pub compare: bool,
    pub levels: Levels,
    /// Collected: `dump_events` plus what the analyses imply.
    pub events: EventSet,
    /// Written to the dump (`--events`).
    pub dump_events: EventSet,
    pub analysis: AnalysisSet,
    pub collect_mode: CollectMode,
    pub output_dir: PathBuf,
    pub format: DataFormat,
    pub devices: DeviceFilter,
    pub log_level: LogLevel,
    /// `--steps` (at most [`MAX_STEPS`] are recorded).
    pub steps: Vec<u32>,
    pub watch: Option<WatchConfig>,
}

/// The msMemScope `config.json` for these settings, laid out like nlohmann::json's `dump(4)`:
/// keys sorted (serde_json's map is ordered), 4-space indent, no trailing newline.
pub fn config_json(opts: &Recorded) -> String {
    let mut steps = [0u32; MAX_STEPS];
    for (slot, s) in steps.iter_mut().zip(&opts.steps) {
        *slot = *s;
    }
    let watch = opts.watch.clone().unwrap_or_default();
    let cs = opts.call_stack;
    let root = json!({
        "enableCStack": cs.c_depth.is_some(),
        "enablePyStack": cs.python_depth.is_some(),
        "enableCompare": opts.compare,
        "cStackDepth": cs.c_depth.unwrap_or(0),
        "pyStackDepth": cs.python_depth.unwrap_or(0),
        "levelType": opts.levels.bits(),
        "eventType": opts.events.bits(),
        "dumpEventType": opts.dump_events.bits(),
        "analysisType": opts.analysis.bits(),
        "oomTopK": opts.analysis.oom_top_k.unwrap_or(DEFAULT_OOM_TOP_K),
        "collectMode": opts.collect_mode.config_value(),
        "outputDir": opts.output_dir.to_string_lossy(),
        "dataFormat": opts.format.config_value(),
        "collectAllNpu": opts.devices.all_npu,
        "collectCpu": opts.devices.cpu,
        "npuSlots": opts.devices.npu_mask,
        "logLevel": opts.log_level.config_value(),
        "isEffective": true,
        "SelectedStepList": {
            "stepIdList": steps,
            "stepCount": opts.steps.len().min(MAX_STEPS),
        },
        "watchConfig": {
            "isWatched": opts.watch.is_some(),
            "fullContent": watch.full_content,
            "start": watch.start.unwrap_or_default(),
            "end": watch.end,
            "outputId": watch.output_id.unwrap_or(WATCH_NO_OUTPUT_ID),
        },
    });
    pretty(&root)
}

/// serde_json's pretty printer indents by two spaces; nlohmann's `dump(4)` by four. JSON text
/// has no raw newline inside a string, so every line starts with indentation only.
fn pretty(v: &Value) -> String {
    let two = serde_json::to_string_pretty(v).expect("a JSON value always serializes");
    let lines = two.lines().map(|l| {
        let body = l.trim_start_matches(' ');
        format!("{}{body}", " ".repeat(2 * (l.len() - body.len())))
    });
    lines.collect::<Vec<_>>().join("\n")
}

/// A JSON string literal, escaped as nlohmann::json does (`\b \f \n \r \t`, other controls as
/// `\u00XX`, everything else as is).
#[cfg(test)]
pub fn json_escape(s: &str, out: &mut String) {
    out.push_str(&serde_json::to_string(s).expect("a string always serializes"));
}
