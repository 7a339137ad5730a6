//! torch_npu's caching allocator, seen from outside an unmodified process.
//!
//! In a real process torch_npu reports its blocks through the mstx memory API only when
//! msMemScope's hook library is preloaded (`/work/shared/reference/real-torch-npu.md` §1), so
//! the pool rows cannot come from mstx. What runs unconditionally is the profiler hook
//! `torch_npu::profiler::reportMemoryDataToNpuProfiler(const MemoryUsage&)`, called at every
//! block MALLOC, FREE and BLOCK_FREE of the caching allocator and at every segment change of
//! the workspace allocator, before it checks whether a profiler listens. It is a hidden symbol
//! in a library usually shipped without `.symtab`, so it is found by what its callers do:
//!
//! 1. the log strings `PTA CachingAllocator malloc: ` and `... free: ` are loaded inside
//!    `DeviceCachingAllocator::malloc` and `::free`; their bounds come from the unwind tables.
//!    Releases differ in how: from 2.7.1.post4 each event is logged twice (a `[PTA]:"..."`
//!    copy for `aclAppLog` and a plain one), so a text is in several strings and loaded more
//!    than once; mold-linked releases keep the strings in `.rodata.str1.8`. Every string and
//!    every load counts, as long as they lead to the same report function;
//! 2. in those functions, the report is a direct call that follows a `mov byte [frame+B], 0x14`
//!    (x86-64; on aarch64 a `strb` of a register set to 0x14: the instruction set's part lives in
//!    `memscope_symbols::locate`) (`device_type = PrivateUse1`, the first field of the
//!    `MemoryUsage` being built): the one
//!    target common to the malloc and free sides is the report function. When `.symtab` is
//!    shipped (2.9.1) and names it, that name must agree with the code;
//! 3. the layout of `MemoryUsage` changed in 2025 (a `component_type` byte came in at +2 and
//!    moved `data_type` to +3). The free call sites settle which one this build has: each
//!    stores `data_type = FREE (1)` either at `B+2` (original) or at `B+3` after a 0 at `B+2`.
//!
//! 4. the probes go on the report's call sites rather than its entry: each site's own stores
//!    say which report it makes, and the sites that only ever make BLOCK_FREE reports (one per
//!    freed block, no row needs it) get no probe, so those calls never trap. A site whose
//!    stores say nothing certain is probed (BPF still drops a BLOCK_FREE by its `data_type`).
//!    When the function is reached other than by direct calls (a jump to it, its address
//!    loaded or stored), or a call candidate does not decode as a call, the probe stays at
//!    the entry.
//!
//! Anything unexpected (no string, candidates that disagree, a store pattern that fits neither
//! layout) makes [`locate`] fail with the reason: the caller says so once and traces the rest
//! (HAL) without framework rows, never reading fields it is not sure of. What the function then
//! receives is checked too ([`MemoryUsage::decode`]).

use std::{
    collections::{BTreeSet, HashMap},
    fmt,
    path::{Path, PathBuf},
    sync::{OnceLock, RwLock},
};

use anyhow::{Result, bail};
use memscope_symbols::locate::{CallSite, Image, exactly_one};

use crate::trace::disk_cache;

/// File names of the library that holds torch_npu's allocators.
pub const LIBRARY: &str = "libtorch_npu.so";

/// Bytes of `MemoryUsage` the probe copies (the same size in both layouts).
pub const USAGE_SIZE: u32 = 56;

const MALLOC_ANCHOR: &[u8] = b"PTA CachingAllocator malloc: ";
const FREE_ANCHOR: &[u8] = b"PTA CachingAllocator free: ";
/// Its mangled name, in the releases that ship a `.symtab`.
const REPORT_SYMBOL: &str =
    "_ZN9torch_npu8profiler29reportMemoryDataToNpuProfilerERKNS0_11MemoryUsageE";
/// `c10::DeviceType::PrivateUse1`, the first field of every `MemoryUsage` torch_npu builds.
const PRIVATE_USE1: u8 = 20;

/// Which `MemoryUsage` a build passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UsageLayout {
    /// `{i8 device_type, i8 device_index, u8 data_type, u8 allocator_type, i64 ptr, ...}`
    /// (torch_npu up to 2.5.1 and the releases cut before June 2025).
    Original,
    /// `{i8 device_type, i8 device_index, u8 component_type, u8 data_type, u8 allocator_type,
    /// i64 ptr, ...}`: `component_type` 0 is the caching allocator, 1 the workspace allocator.
    WithComponent,
}

impl UsageLayout {
    /// Where `data_type` lies in the struct.
    pub const fn data_type_at(self) -> u32 {
        match self {
            UsageLayout::Original => 2,
            UsageLayout::WithComponent => 3,
        }
    }
}

impl fmt::Display for UsageLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UsageLayout::Original => "MemoryUsage without component_type",
            UsageLayout::WithComponent => "MemoryUsage with component_type",
        })
    }
}

/// The report function of one libtorch_npu.so build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportSite {
    /// File offset of `reportMemoryDataToNpuProfiler` (the uprobe's place).
    pub file_offset: u64,
    pub layout: UsageLayout,
    /// Direct calls of it in the library (8 in the 2.8 source: every allocator event).
    pub callers: usize,
    /// Where its probes go.
    pub probes: Probes,
    /// `torch_npu.__version__` from the wheel's `version.py` beside the library, if present.
    pub version: Option<String>,
}

/// Where the report function's probes go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probes {
    /// At its entry: it is reached other than by direct calls, or a call did not decode.
    Entry,
    /// At its direct calls (file offsets of the call instructions) that may report a MALLOC
    /// or FREE; `block_free` more call only ever report BLOCK_FREE and are left unprobed.
    CallSites { sites: Vec<u64>, block_free: usize },
}

/// True for `libtorch_npu.so` (and versioned names of it).
pub fn is_library(file_name: &str) -> bool {
    file_name == LIBRARY || file_name.starts_with("libtorch_npu.so.")
}

/// Finds the report function and its argument's layout in the library at `path`.
pub fn locate(path: &Path) -> Result<ReportSite> {
    let image = Image::open(path)?;
    let malloc = report_calls(&image, MALLOC_ANCHOR)?;
    let free = report_calls(&image, FREE_ANCHOR)?;
    let mut candidates: BTreeSet<u64> = malloc
        .iter()
        .map(|c| c.target)
        .filter(|t| free.iter().any(|c| c.target == *t))
        .collect();
    if let Some(named) = image.function_symbol(REPORT_SYMBOL) {
        candidates.insert(named);
    }
    let target = exactly_one(
        "report function (called from both malloc and free, or named in .symtab)",
        &candidates.into_iter().collect::<Vec<_>>(),
    )?;
    let calls = image.direct_calls_to(target)?;
    let callers = calls.len();
    if callers < 3 {
        bail!("the report function candidate at {target:#x} has only {callers} direct callers");
    }
    let mut layouts = BTreeSet::new();
    for call in free.into_iter().filter(|c| c.target == target) {
        layouts.insert(call.layout?);
    }
    let layout = exactly_one(
        "MemoryUsage layout",
        &layouts.into_iter().collect::<Vec<_>>(),
    )?;
    let Some(file_offset) = image.file_offset(target) else {
        bail!("the report function at {target:#x} is outside the file's sections");
    };
    Ok(ReportSite {
        file_offset,
        layout,
        callers,
        probes: probe_sites(&image, target, &calls, layout)?,
        version: wheel_version(path),
    })
}

/// The call sites to probe instead of the entry (of `calls`, the direct calls of `target`),
/// or [`Probes::Entry`] when the calls may not all be direct ones.
fn probe_sites(image: &Image, target: u64, calls: &[u64], layout: UsageLayout) -> Result<Probes> {
    if !image.direct_jumps_to(target)?.is_empty()
        || !image.address_loads(target)?.is_empty()
        || image.relocated_to(target)
    {
        return Ok(Probes::Entry);
    }
    let (mut sites, mut block_free) = (Vec::new(), 0);
    for &at in calls {
        // The byte scan may find a call's bytes inside another instruction: only a call that
        // decodes as one in its function is a site (a probe there must start an instruction).
        let site = image
            .function_bounds(at)
            .and_then(|(start, len)| image.call_sites(start, len).ok())
            .and_then(|calls| calls.into_iter().find(|c| c.at == at && c.target == target));
        let (Some(site), Some(offset)) = (site, image.file_offset(at)) else {
            return Ok(Probes::Entry);
        };
        if stored_data_type(&site, layout.data_type_at()) == Some(BLOCK_FREE) {
            block_free += 1;
        } else {
            sites.push(offset);
        }
    }
    if sites.is_empty() {
        return Ok(Probes::Entry);
    }
    Ok(Probes::CallSites { sites, block_free })
}

/// The `data_type` a call site's own stores give its `MemoryUsage` (the byte at
/// `data_type_at` past the `device_type = PrivateUse1` store), when they say it.
fn stored_data_type(site: &CallSite, data_type_at: u32) -> Option<u8> {
    let frame = site
        .stores
        .iter()
        .rev()
        .find(|s| s.width == 1 && s.value == Some(PRIVATE_USE1))
        .map(|s| (s.base, s.offset))?;
    stored_byte(site, frame, data_type_at as i64)
}

/// The byte a call site's last store to `frame + k` wrote, when the store says it.
fn stored_byte(site: &CallSite, (base, at): (u32, i64), k: i64) -> Option<u8> {
    site.stores
        .iter()
        .rev()
        .find(|s| s.base == base && s.offset == at + k)
        .and_then(|s| s.value)
}

/// A direct call that follows the store of `device_type = PrivateUse1`.
struct ReportCall {
    target: u64,
    /// What the stores before it say about the layout (only meaningful at a FREE report).
    layout: Result<UsageLayout>,
}

/// The report calls in every function that loads a string containing `anchor`.
fn report_calls(image: &Image, anchor: &[u8]) -> Result<Vec<ReportCall>> {
    let what = String::from_utf8_lossy(anchor).trim().to_owned();
    let strings = image.strings_containing(anchor);
    if strings.is_empty() {
        bail!("no string \"{what}\" found");
    }
    let mut functions = BTreeSet::new();
    for string in strings {
        for at in image.address_loads(string)? {
            match image.function_bounds(at) {
                Some(bounds) => functions.insert(bounds),
                None => bail!("no unwind entry covers the load of \"{what}\" at {at:#x}"),
            };
        }
    }
    if functions.is_empty() {
        bail!("no instruction loads the string \"{what}\"");
    }
    let mut calls = Vec::new();
    for (start, len) in functions {
        for site in image.call_sites(start, len)? {
            if let Some(frame) = site
                .stores
                .iter()
                .find(|s| s.width == 1 && s.value == Some(PRIVATE_USE1))
                .map(|s| (s.base, s.offset))
            {
                calls.push(ReportCall {
                    target: site.target,
                    layout: layout_at(&site, frame),
                });
            }
        }
    }
    if calls.is_empty() {
        bail!("no call after a `device_type = PrivateUse1` store where \"{what}\" is logged");
    }
    Ok(calls)
}

/// Reads the bytes stored at `frame + 2` and `frame + 3` before a FREE report (the last store
/// to each byte wins).
fn layout_at(site: &CallSite, frame: (u32, i64)) -> Result<UsageLayout> {
    match (stored_byte(site, frame, 2), stored_byte(site, frame, 3)) {
        (Some(1), _) => Ok(UsageLayout::Original),
        (Some(0), Some(1)) => Ok(UsageLayout::WithComponent),
        (b2, b3) => bail!(
            "the FREE report's stores fit no known MemoryUsage layout (byte 2: {b2:?}, byte 3: {b3:?})"
        ),
    }
}

/// [`locate`], remembered across runs: the analysis reads the whole library (~60 MB, a second
/// or more), which would otherwise be paid at every attach while the target waits. The cache
/// (`$MEMSCOPE_BPF_CACHE` or `~/.cache/memscope-bpf`, `torch_npu_sites`) holds one line per
/// file identity (device, inode, size, mtime in ns); it is used only when we own it and nobody else
/// can write it (a wrong offset must not be planted by another user), and any line it cannot
/// parse is ignored.
pub fn locate_cached(path: &Path, identity: (u64, u64, u64, i128)) -> Result<ReportSite> {
    let key = format!(
        "{} {} {} {}",
        identity.0, identity.1, identity.2, identity.3
    );
    let cache = cache_file();
    if let Some(site) = cache.as_deref().and_then(|c| cached(c, &key)) {
        return Ok(ReportSite {
            version: wheel_version(path),
            ..site
        });
    }
    let site = locate(path)?;
    if let Some(c) = cache {
        remember(&c, &key, &site);
    }
    Ok(site)
}

fn cache_file() -> Option<PathBuf> {
    disk_cache::file("torch_npu_sites")
}

fn cached(cache: &Path, key: &str) -> Option<ReportSite> {
    if !disk_cache::trusted(cache) {
        return None;
    }
    let text = std::fs::read_to_string(cache).ok()?;
    text.lines().rev().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(' ')?;
        let mut f = rest.split(' ');
        let file_offset = u64::from_str_radix(f.next()?.strip_prefix("0x")?, 16).ok()?;
        let layout = match f.next()? {
            "original" => UsageLayout::Original,
            "with_component" => UsageLayout::WithComponent,
            _ => return None,
        };
        let callers = f.next()?.parse().ok()?;
        // Lines written before the call sites were probed have none: located again.
        let probes = match f.next()? {
            "entry" => Probes::Entry,
            sites => {
                let (block_free, sites) = sites.strip_prefix("sites:")?.split_once(':')?;
                let sites = sites
                    .split(',')
                    .map(|s| u64::from_str_radix(s.strip_prefix("0x")?, 16).ok())
                    .collect::<Option<Vec<u64>>>()?;
                Probes::CallSites {
                    sites,
                    block_free: block_free.parse().ok()?,
                }
            }
        };
        Some(ReportSite {
            file_offset,
            layout,
            callers,
            probes,
            version: None,
        })
    })
}

fn remember(cache: &Path, key: &str, site: &ReportSite) {
    use std::io::Write;
    let layout = match site.layout {
        UsageLayout::Original => "original",
        UsageLayout::WithComponent => "with_component",
    };
    let probes = match &site.probes {
        Probes::Entry => "entry".to_owned(),
        Probes::CallSites { sites, block_free } => format!(
            "sites:{block_free}:{}",
            sites
                .iter()
                .map(|s| format!("{s:#x}"))
                .collect::<Vec<_>>()
                .join(",")
        ),
    };
    if let Some(mut f) = disk_cache::open_append(cache) {
        let _ = writeln!(
            f,
            "{key} {:#x} {layout} {} {probes}",
            site.file_offset, site.callers
        );
    }
}

/// `__version__` from `torch_npu/version.py` (the library sits in `torch_npu/lib/`).
fn wheel_version(library: &Path) -> Option<String> {
    let file: PathBuf = library.parent()?.parent()?.join("version.py");
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| {
        let v = l
            .strip_prefix("__version__")?
            .trim_start()
            .strip_prefix('=')?
            .trim();
        Some(v.trim_matches(|c| c == '\'' || c == '"').to_owned())
    })
}

/// What one `MemoryUsage` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryUsage {
    pub device_index: i8,
    pub component: Component,
    pub data_type: DataType,
    pub ptr: u64,
    /// Block size (positive; the struct carries it negated on free).
    pub size: u64,
    pub total_allocated: i64,
    pub total_reserved: i64,
    pub stream: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    CachingAllocator,
    WorkspaceAllocator,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataType {
    Malloc,
    Free,
    /// A block returned to the pool (reported just before the FREE of the same block).
    BlockFree,
}

/// `data_type` of a BLOCK_FREE report (BPF drops those calls: [`probe_spec`]).
pub const BLOCK_FREE: u8 = 2;

/// The report function's probe for a `MemoryUsage` of `layout`: the struct is copied at
/// entry, and a BLOCK_FREE report (one per freed block, just before the block's FREE, which
/// carries the totals after the whole free) is dropped in BPF by its `data_type` before any
/// stack is read for it, since no row needs it.
pub const fn probe_spec(layout: UsageLayout) -> probe_common::ProbeSpec {
    use probe_common::spec_flags as sf;
    probe_common::ProbeSpec {
        flags: sf::DATA_IS_BYTES | sf::SKIP_BYTE,
        data_len: USAGE_SIZE,
        skip_off: layout.data_type_at(),
        skip_value: BLOCK_FREE as u32,
        ..crate::trace::probes::NONE
    }
}

/// The probed call sites of every library attached so far: (inode, call instruction's file
/// offset) -> the report function's file offset. The stack of a call seen at its call site is
/// unwound as if the call had been made ([`call_site_target`]).
fn call_sites() -> &'static RwLock<HashMap<(u64, u64), u64>> {
    static SITES: OnceLock<RwLock<HashMap<(u64, u64), u64>>> = OnceLock::new();
    SITES.get_or_init(Default::default)
}

/// Remembers the call sites probed in the file with inode `ino`, which call `target`.
pub fn register_call_sites(ino: u64, sites: &[u64], target: u64) {
    let mut map = call_sites().write().unwrap_or_else(|e| e.into_inner());
    for at in sites {
        map.insert((ino, *at), target);
    }
}

/// The report function's file offset when `file_offset` of the file with inode `ino` is one
/// of its probed call sites.
pub fn call_site_target(ino: u64, file_offset: u64) -> Option<u64> {
    let map = call_sites().read().unwrap_or_else(|e| e.into_inner());
    map.get(&(ino, file_offset)).copied()
}

/// Blocks of both allocators lie on device memory aligned at least this much.
const BLOCK_ALIGN: u64 = 32;

impl MemoryUsage {
    /// Decodes the struct copied at the report function's entry, or says why it is not a
    /// `MemoryUsage` as torch_npu builds one: a known device type, data type and component; a
    /// non-null aligned pointer; a size that is positive on MALLOC and negative on FREE and
    /// BLOCK_FREE; totals that are not negative and, for the caching allocator, hold the block
    /// (reserved >= allocated >= the block on MALLOC). A function that was located wrongly
    /// fails this at its first call.
    pub fn decode(layout: UsageLayout, b: &[u8]) -> Result<Self, String> {
        if b.len() < USAGE_SIZE as usize {
            return Err(format!("{} bytes, not {USAGE_SIZE}", b.len()));
        }
        if b[0] != PRIVATE_USE1 {
            return Err(format!("device type {}, not PrivateUse1 (20)", b[0] as i8));
        }
        let word = |at: usize| i64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        let (component, data_type) = match layout {
            UsageLayout::WithComponent => (
                match b[2] {
                    0 => Component::CachingAllocator,
                    1 => Component::WorkspaceAllocator,
                    other => return Err(format!("component type {other}")),
                },
                b[3],
            ),
            // The workspace allocator of these releases passes no reserved total (0); the
            // caching allocator's block always lies in a reserved segment.
            UsageLayout::Original => (
                if word(32) == 0 && word(40) == 0 {
                    Component::WorkspaceAllocator
                } else {
                    Component::CachingAllocator
                },
                b[2],
            ),
        };
        let data_type = match data_type {
            0 => DataType::Malloc,
            1 => DataType::Free,
            BLOCK_FREE => DataType::BlockFree,
            other => return Err(format!("data type {other}")),
        };
        let (ptr, size) = (word(8) as u64, word(16));
        let (allocated, reserved) = (word(24), word(32));
        if ptr == 0 || ptr % BLOCK_ALIGN != 0 {
            return Err(format!("block pointer {ptr:#x}"));
        }
        if (data_type == DataType::Malloc) != (size > 0) || size == 0 {
            return Err(format!("size {size} on {data_type:?}"));
        }
        let holds_block = component == Component::WorkspaceAllocator
            || (reserved >= allocated && (data_type != DataType::Malloc || allocated >= size));
        if allocated < 0 || reserved < 0 || !holds_block {
            return Err(format!(
                "totals allocated {allocated}, reserved {reserved} around a {data_type:?} of {size}"
            ));
        }
        Ok(MemoryUsage {
            device_index: b[1] as i8,
            component,
            data_type,
            ptr,
            size: size.unsigned_abs(),
            total_allocated: allocated,
            total_reserved: reserved,
            stream: word(48) as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(layout: UsageLayout, component: u8, data_type: u8, size: i64) -> Vec<u8> {
        let mut b = vec![0u8; USAGE_SIZE as usize];
        b[0] = 20;
        b[1] = 3;
        match layout {
            UsageLayout::WithComponent => {
                b[2] = component;
                b[3] = data_type;
            }
            UsageLayout::Original => b[2] = data_type,
        }
        for (at, v) in [
            (8, 0x12c0_0000_0200i64),
            (16, size),
            (24, 4096),
            (32, 2 << 20),
            (48, 77),
        ] {
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    #[test]
    fn located_sites_are_remembered_in_a_private_cache() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("memscope-sites-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let cache = dir.join("torch_npu_sites");
        let site = ReportSite {
            file_offset: 0x32f42a0,
            layout: UsageLayout::WithComponent,
            callers: 8,
            probes: Probes::CallSites {
                sites: vec![0xcc9a5a, 0xcd06f8],
                block_free: 1,
            },
            version: None,
        };
        assert_eq!(cached(&cache, "1 2 3 4"), None);
        // A line of a build that probed the entry only, without the probes field: not used.
        std::fs::write(&cache, "1 2 3 4 0x32f42a0 with_component 8\n").unwrap();
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(cached(&cache, "1 2 3 4"), None);
        remember(&cache, "1 2 3 4", &site);
        remember(
            &cache,
            "1 2 3 5",
            &ReportSite {
                layout: UsageLayout::Original,
                probes: Probes::Entry,
                ..site.clone()
            },
        );
        assert_eq!(cached(&cache, "1 2 3 4"), Some(site.clone()));
        let other = cached(&cache, "1 2 3 5").unwrap();
        assert_eq!(
            (other.layout, other.probes),
            (UsageLayout::Original, Probes::Entry)
        );
        assert_eq!(cached(&cache, "1 2 3"), None, "a key is whole words");
        // Writable by others: not trusted, not read.
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o622)).unwrap();
        assert_eq!(cached(&cache, "1 2 3 4"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn decodes_both_layouts() {
        let new = MemoryUsage::decode(
            UsageLayout::WithComponent,
            &usage(UsageLayout::WithComponent, 0, 1, -512),
        )
        .unwrap();
        assert_eq!(new.component, Component::CachingAllocator);
        assert_eq!(new.data_type, DataType::Free);
        assert_eq!(
            (new.device_index, new.ptr, new.size),
            (3, 0x12c0_0000_0200, 512)
        );
        assert_eq!(
            (new.total_allocated, new.total_reserved, new.stream),
            (4096, 2 << 20, 77)
        );
        let ws = MemoryUsage::decode(
            UsageLayout::WithComponent,
            &usage(UsageLayout::WithComponent, 1, 0, 4096),
        )
        .unwrap();
        assert_eq!(ws.component, Component::WorkspaceAllocator);
        let old = MemoryUsage::decode(
            UsageLayout::Original,
            &usage(UsageLayout::Original, 0, 2, -64),
        )
        .unwrap();
        assert_eq!(
            (old.component, old.data_type, old.size),
            (Component::CachingAllocator, DataType::BlockFree, 64)
        );
        // Not a PrivateUse1 report, a short copy, or an unknown data type: nothing.
        let mut bad = usage(UsageLayout::Original, 0, 0, 512);
        bad[0] = 1;
        assert!(MemoryUsage::decode(UsageLayout::Original, &bad).is_err());
        assert!(MemoryUsage::decode(UsageLayout::Original, &bad[..40]).is_err());
        assert!(
            MemoryUsage::decode(
                UsageLayout::Original,
                &usage(UsageLayout::Original, 0, 7, 512)
            )
            .is_err()
        );
    }

    #[test]
    fn what_is_not_a_memory_usage_is_refused_with_the_reason() {
        let layout = UsageLayout::WithComponent;
        let good = usage(layout, 0, 0, 512);
        assert!(MemoryUsage::decode(layout, &good).is_ok());
        let with = |at: usize, v: i64| {
            let mut b = good.clone();
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            MemoryUsage::decode(layout, &b).unwrap_err()
        };
        assert_eq!(with(8, 0x12c0_0000_0201), "block pointer 0x12c000000201");
        assert_eq!(with(8, 0), "block pointer 0x0");
        assert_eq!(with(16, -512), "size -512 on Malloc");
        assert_eq!(
            with(24, 100),
            "totals allocated 100, reserved 2097152 around a Malloc of 512",
            "an allocated total that does not hold the block"
        );
        assert!(with(32, 0).starts_with("totals"), "nothing reserved");
        let mut b = good.clone();
        b[2] = 9;
        assert_eq!(
            MemoryUsage::decode(layout, &b).unwrap_err(),
            "component type 9"
        );
        assert_eq!(
            MemoryUsage::decode(layout, &usage(layout, 0, 1, 512)).unwrap_err(),
            "size 512 on Free"
        );
    }
}
