//! The run settings: what to collect (events, levels, devices, stacks), which analyses, how
//! to write, as the tracer, the writers and the agent consume them. The command line (`cli`)
//! and the agent's options build them; config.json (`output::config_json`) records them.

/// `oomTopK` when `--analysis=oom` gives no K (and the value written to config.json otherwise).
pub const DEFAULT_OOM_TOP_K: u32 = 10;
/// NPU slots addressable with `--device=npu:N` (N < 32).
pub const MAX_NPU_SLOTS: u32 = 32;
/// Device id msMemScope uses for "unknown device"; such events always pass the device filter.
pub const UNKNOWN_DEVICE_ID: u32 = 9999;
/// `watchConfig.outputId` when no outid is given.
pub const WATCH_NO_OUTPUT_ID: u32 = u32::MAX;

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
}

/// Call-stack capture; `None` disables that kind of stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallStack {
    pub c_depth: Option<u32>,
    pub python_depth: Option<u32>,
    /// `mixed[:D]` (ours): both stacks, and in the C column each `_PyEval_EvalFrameDefault`
    /// frame is replaced by the Python frames it was running.
    pub mixed: bool,
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
