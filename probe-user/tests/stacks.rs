//! End-to-end: `--call-stack=c[:D]` fills the `Call Stack(C)` column with correct stacks, also
//! for code built without frame pointers. Format: docs/call-stacks.md.
//!
//! The oracle is binutils, not our own symbolizer: every frame's address is mapped to a module
//! and file offset through the workload's own copy of `/proc/self/maps` (`--maps`), translated to
//! an ELF virtual address with the module's PT_LOAD headers (`readelf -lW`), and looked up with
//! `addr2line -f -i -C` (at `address - 1` for return addresses). The function names of the
//! frame's whole inline chain must equal addr2line's, and so must `basename:line` in the fixture
//! modules. Which functions appear where comes from the fixture's call structure
//! (tests/fixtures/src/stack_workload.c), never from line numbers.
//!
//! `fixture_stacks_agree_with_gdb` needs neither root nor the tracer: it takes the stacks from
//! gdb at the same probe points, renders them in the column's format with addr2line and runs
//! them through the same checks, so it validates the fixtures and this file's plumbing.

mod common;

use std::{
    collections::{BTreeMap, HashMap},
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::Mutex,
};

use common::*;

const MIB: u64 = 1024 * 1024;
/// `recurse(80)`: 81 frames of `recurse`.
const RECURSE_FRAMES: usize = 81;

// ---------------------------------------------------------------------------------------------
// CSV at record level (the stack field is quoted and contains newlines).

/// Splits CSV text into records of fields (RFC 4180: quoted fields may hold `,`, `""` and LF).
fn csv_records(text: &str) -> Vec<Vec<String>> {
    let mut records = Vec::new();
    let mut rec = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        any = true;
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => rec.push(std::mem::take(&mut cur)),
            '\r' if !quoted && chars.peek() == Some(&'\n') => {}
            '\n' if !quoted => {
                rec.push(std::mem::take(&mut cur));
                records.push(std::mem::take(&mut rec));
                any = false;
            }
            _ => cur.push(c),
        }
    }
    assert!(!quoted, "unterminated quoted CSV field");
    if any {
        rec.push(cur);
        records.push(rec);
    }
    records
}

#[derive(Clone, Debug)]
struct Row {
    id: u64,
    event: String,
    event_type: String,
    name: String,
    attr: BTreeMap<String, String>,
    c_stack: String,
}

impl Row {
    fn size(&self) -> Option<u64> {
        self.attr.get("size").and_then(|s| s.parse().ok())
    }
}

fn parse_dump_records(path: &Path) -> Vec<Row> {
    let text = fs::read_to_string(path).unwrap();
    let mut recs = csv_records(&text).into_iter();
    assert_eq!(
        recs.next().map(|r| r.join(",")).as_deref(),
        Some(HEADER),
        "header of {}",
        path.display()
    );
    recs.map(|f| {
        assert_eq!(f.len(), 12, "12 columns in {f:?} ({})", path.display());
        let mut attr = BTreeMap::new();
        if let Some(inner) = f[9].strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            for kv in inner.split(',').filter(|s| !s.is_empty()) {
                if let Some((k, v)) = kv.split_once(':') {
                    attr.insert(k.to_string(), v.to_string());
                }
            }
        }
        Row {
            id: f[0].parse().unwrap(),
            event: f[1].clone(),
            event_type: f[2].clone(),
            name: f[3].clone(),
            attr,
            c_stack: f[11].clone(),
        }
    })
    .collect()
}

/// Every row of the process, one copy of rows repeated in several device files.
fn stack_rows(out_dir: &Path, pid: u32) -> Vec<Row> {
    let proc_dir =
        process_dir(out_dir, pid).unwrap_or_else(|| panic!("no output directory for pid {pid}"));
    let mut rows: Vec<Row> = Vec::new();
    for f in find_files(&proc_dir, "memscope_dump_") {
        for r in parse_dump_records(&f) {
            if !rows.iter().any(|x| x.id == r.id) {
                rows.push(r);
            }
        }
    }
    rows.sort_by_key(|r| r.id);
    rows
}

// ---------------------------------------------------------------------------------------------
// The stack text (docs/call-stacks.md grammar).

#[derive(Clone, Debug, PartialEq, Eq)]
enum Line {
    Symbolized {
        inlined: bool,
        function: String,
        /// (file, line)
        location: Option<(String, u32)>,
    },
    Unsymbolized {
        module: String,
        offset: u64,
    },
    Unknown,
}

/// One machine frame: its address and its lines (inline chain innermost first).
#[derive(Clone, Debug)]
struct Frame {
    addr: u64,
    lines: Vec<Line>,
}

impl Frame {
    /// The function that owns the machine frame (the last, unmarked line).
    fn function(&self) -> Option<&str> {
        match self.lines.last() {
            Some(Line::Symbolized { function, .. }) => Some(function),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
struct Stack {
    frames: Vec<Frame>,
    truncated: bool,
}

impl Stack {
    fn functions(&self) -> Vec<String> {
        self.frames
            .iter()
            .map(|f| f.function().unwrap_or("?").to_string())
            .collect()
    }
}

fn parse_line(rest: &str) -> Line {
    if rest == "[unknown]" {
        return Line::Unknown;
    }
    let (inlined, body) = match rest.strip_prefix("[inlined] ") {
        Some(b) => (true, b),
        None => (false, rest),
    };
    if !inlined
        && !body.contains(' ')
        && let Some((module, off)) = body.rsplit_once("+0x")
        && !module.is_empty()
        && !off.is_empty()
        && off
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Line::Unsymbolized {
            module: module.to_string(),
            offset: u64::from_str_radix(off, 16).unwrap(),
        };
    }
    // Split at the last " at ", the location at its last ':'.
    if let Some((function, loc)) = body.rsplit_once(" at ")
        && let Some((file, line)) = loc.rsplit_once(':')
        && !line.is_empty()
        && line.bytes().all(|b| b.is_ascii_digit())
    {
        return Line::Symbolized {
            inlined,
            function: function.to_string(),
            location: Some((file.to_string(), line.parse().unwrap())),
        };
    }
    Line::Symbolized {
        inlined,
        function: body.to_string(),
        location: None,
    }
}

fn parse_stack(text: &str) -> Stack {
    let mut frames: Vec<Frame> = Vec::new();
    let mut truncated = false;
    let mut open = false; // the last frame still expects lines (it ended in an [inlined] one)
    let lines: Vec<&str> = if text.is_empty() {
        Vec::new()
    } else {
        text.split('\n').collect()
    };
    for (i, l) in lines.iter().enumerate() {
        if *l == "[truncated]" {
            assert_eq!(i, lines.len() - 1, "[truncated] is the last line:\n{text}");
            truncated = true;
            continue;
        }
        let (addr, rest) = l
            .split_once(' ')
            .unwrap_or_else(|| panic!("frame line {l:?} in\n{text}"));
        let hex = addr
            .strip_prefix("0x")
            .unwrap_or_else(|| panic!("address {addr:?} in\n{text}"));
        assert!(
            hex.len() == 16
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "address is 0x + 16 lowercase hex digits: {addr:?} in\n{text}"
        );
        let addr = u64::from_str_radix(hex, 16).unwrap();
        let line = parse_line(rest);
        let inlined = matches!(line, Line::Symbolized { inlined: true, .. });
        if open {
            let f = frames.last_mut().unwrap();
            assert_eq!(
                f.addr, addr,
                "the lines of an inline chain share one address:\n{text}"
            );
            assert!(
                matches!(line, Line::Symbolized { .. }),
                "an [inlined] line is followed by its caller:\n{text}"
            );
            f.lines.push(line);
        } else {
            frames.push(Frame {
                addr,
                lines: vec![line],
            });
        }
        open = inlined;
    }
    assert!(
        !open,
        "an [inlined] line must be followed by its caller:\n{text}"
    );
    Stack { frames, truncated }
}

// ---------------------------------------------------------------------------------------------
// The oracle: saved maps + readelf + addr2line.

#[derive(Clone, Debug)]
struct Mapping {
    start: u64,
    end: u64,
    offset: u64,
    perms: String,
    path: String,
}

fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let range = it.next()?;
            let perms = it.next()?.to_string();
            let offset = u64::from_str_radix(it.next()?, 16).ok()?;
            let _dev = it.next()?;
            let _inode = it.next()?;
            let path = it.collect::<Vec<_>>().join(" ");
            let (s, e) = range.split_once('-')?;
            Some(Mapping {
                start: u64::from_str_radix(s, 16).ok()?,
                end: u64::from_str_radix(e, 16).ok()?,
                offset,
                perms,
                path,
            })
        })
        .collect()
}

/// A PT_LOAD header: (p_offset, p_vaddr, p_filesz).
type Segment = (u64, u64, u64);

fn load_segments(module: &str) -> Vec<Segment> {
    static CACHE: Mutex<BTreeMap<String, Vec<Segment>>> = Mutex::new(BTreeMap::new());
    if let Some(v) = CACHE.lock().unwrap().get(module) {
        return v.clone();
    }
    let out = Command::new("readelf")
        .args(["-lW", module])
        .output()
        .expect("run readelf (binutils)");
    assert!(out.status.success(), "readelf -lW {module}");
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    let segs: Vec<_> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            (c.first() == Some(&"LOAD")).then(|| (hex(c[1]), hex(c[2]), hex(c[4])))
        })
        .collect();
    assert!(!segs.is_empty(), "no PT_LOAD in {module}");
    CACHE
        .lock()
        .unwrap()
        .insert(module.to_string(), segs.clone());
    segs
}

/// What addr2line says about one address: the inline chain, innermost first, each entry
/// (function, Some((file, line)) or None for `??:?`/`??:0`).
type Location = Option<(String, u32)>;
type Chain = Vec<(String, Location)>;

/// `addr2line -a -f -i -C -e FILE` for many addresses at once.
fn addr2line(file: &Path, vaddrs: &[u64]) -> HashMap<u64, Chain> {
    let mut out_map = HashMap::new();
    if vaddrs.is_empty() {
        return out_map;
    }
    let out = Command::new("addr2line")
        .arg("-a")
        .arg("-f")
        .arg("-i")
        .arg("-C")
        .arg("-e")
        .arg(file)
        .args(vaddrs.iter().map(|v| format!("{v:#x}")))
        .output()
        .expect("run addr2line (binutils)");
    assert!(
        out.status.success(),
        "addr2line -e {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines().peekable();
    while let Some(a) = lines.next() {
        let addr = u64::from_str_radix(a.trim_start_matches("0x"), 16)
            .unwrap_or_else(|_| panic!("addr2line address line {a:?}"));
        let mut chain = Chain::new();
        while let Some(f) = lines.peek() {
            if f.starts_with("0x") && f.len() == 18 {
                break;
            }
            let func = lines.next().unwrap().to_string();
            let loc = lines.next().expect("addr2line location line");
            // "file:line", "file:line (discriminator N)", "??:?", "??:0"
            let loc = loc.split(" (discriminator").next().unwrap();
            let (file, line) = loc.rsplit_once(':').unwrap();
            let location = match (file, line.parse::<u32>()) {
                ("??", _) | (_, Err(_)) => None,
                (f, Ok(n)) => Some((f.to_string(), n)),
            };
            chain.push((func, location));
        }
        out_map.insert(addr, chain);
    }
    out_map
}

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// Where a frame's address lies.
#[derive(Clone, Debug)]
struct Place {
    module: String,
    file_offset: u64,
    /// ELF virtual address of the looked-up pc (address, or address - 1 for return addresses).
    lookup_vaddr: u64,
}

struct Oracle {
    maps: Vec<Mapping>,
    fixtures: PathBuf,
    cache: Mutex<HashMap<(String, u64), Chain>>,
}

impl Oracle {
    /// `fixture_root`: the build directory (bin/, lib/) whose modules are checked strictly.
    fn new(maps_file: &Path, fixture_root: &Path) -> Oracle {
        let text = fs::read_to_string(maps_file)
            .unwrap_or_else(|e| panic!("read {}: {e}", maps_file.display()));
        let fixtures = fs::canonicalize(fixture_root).unwrap();
        Oracle {
            maps: parse_maps(&text),
            fixtures,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The module and offsets of `addr`; `lookup` is the pc to symbolize (addr or addr - 1).
    fn place(&self, addr: u64, lookup: u64) -> Option<Place> {
        let m = self
            .maps
            .iter()
            .find(|m| m.start <= lookup && lookup < m.end && m.path.starts_with('/'))?;
        let file_offset = addr - m.start + m.offset;
        let lookup_off = lookup - m.start + m.offset;
        let segs = load_segments(&m.path);
        let (p_off, p_vaddr, _) = *segs
            .iter()
            .find(|(o, _, sz)| *o <= lookup_off && lookup_off < o + sz)
            .unwrap_or_else(|| panic!("file offset {lookup_off:#x} in no PT_LOAD of {}", m.path));
        Some(Place {
            module: m.path.clone(),
            file_offset,
            lookup_vaddr: lookup_off - p_off + p_vaddr,
        })
    }

    fn is_fixture(&self, module: &str) -> bool {
        Path::new(module).starts_with(&self.fixtures)
    }

    fn is_executable(&self, addr: u64) -> bool {
        self.maps
            .iter()
            .any(|m| m.start <= addr && addr < m.end && m.perms.contains('x'))
    }

    /// The file addr2line should read: the separate debug file of a stripped fixture library.
    fn debug_file(module: &str) -> PathBuf {
        let p = Path::new(module);
        let dbg = p.parent().unwrap().join(".debug").join(format!(
            "{}.debug",
            p.file_name().unwrap().to_string_lossy()
        ));
        if dbg.exists() { dbg } else { p.to_path_buf() }
    }

    /// Runs addr2line once per module for all of these places.
    fn prefetch(&self, places: &[Place]) {
        let mut by_module: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        {
            let cache = self.cache.lock().unwrap();
            for p in places {
                if !cache.contains_key(&(p.module.clone(), p.lookup_vaddr)) {
                    by_module.entry(&p.module).or_default().push(p.lookup_vaddr);
                }
            }
        }
        for (module, mut vaddrs) in by_module {
            vaddrs.sort();
            vaddrs.dedup();
            let res = addr2line(&Self::debug_file(module), &vaddrs);
            let mut cache = self.cache.lock().unwrap();
            for v in vaddrs {
                let chain = res
                    .get(&v)
                    .cloned()
                    .unwrap_or_else(|| panic!("addr2line said nothing about {v:#x} in {module}"));
                cache.insert((module.to_string(), v), chain);
            }
        }
    }

    fn chain(&self, p: &Place) -> Chain {
        self.prefetch(std::slice::from_ref(p));
        self.cache.lock().unwrap()[&(p.module.clone(), p.lookup_vaddr)].clone()
    }

    /// The pc to symbolize for frame `i`.
    fn lookup_pc(i: usize, addr: u64, first_is_return: bool) -> u64 {
        if i == 0 && !first_is_return {
            addr
        } else {
            addr.saturating_sub(1)
        }
    }

    /// Checks every frame of `stack` against addr2line. Returns notes about frames in system
    /// libraries that differ (those are not failures: binutils and the system's debug files are
    /// outside the test's control).
    fn check(&self, what: &str, text: &str, stack: &Stack, first_is_return: bool) -> Vec<String> {
        let places: Vec<Option<Place>> = stack
            .frames
            .iter()
            .enumerate()
            .map(|(i, f)| self.place(f.addr, Self::lookup_pc(i, f.addr, first_is_return)))
            .collect();
        self.prefetch(&places.iter().flatten().cloned().collect::<Vec<_>>());
        let mut notes = Vec::new();
        for (i, (frame, place)) in stack.frames.iter().zip(&places).enumerate() {
            let ctx = || format!("{what}: frame {i} ({:#018x}) of\n{text}", frame.addr);
            let Some(place) = place else {
                assert_eq!(
                    frame.lines,
                    vec![Line::Unknown],
                    "an address in no file mapping is [unknown]; {}",
                    ctx()
                );
                continue;
            };
            let module_name = basename(&place.module);
            let strict = self.is_fixture(&place.module);
            if let [Line::Unsymbolized { module, offset }] = frame.lines.as_slice() {
                assert_eq!(
                    (module.as_str(), *offset),
                    (module_name, place.file_offset),
                    "module+file offset; {}",
                    ctx()
                );
                if strict {
                    let chain = self.chain(place);
                    assert!(
                        chain.iter().all(|(f, _)| f == "??"),
                        "addr2line knows {chain:?}, the tracer printed nothing; {}",
                        ctx()
                    );
                }
                continue;
            }
            assert!(
                self.is_executable(frame.addr) || i > 0,
                "the first frame is in executable code; {}",
                ctx()
            );
            let chain = self.chain(place);
            let got: Vec<(bool, String, Location)> = frame
                .lines
                .iter()
                .map(|l| match l {
                    Line::Symbolized {
                        inlined,
                        function,
                        location,
                    } => (*inlined, function.clone(), location.clone()),
                    other => panic!("{other:?} inside an inline chain; {}", ctx()),
                })
                .collect();
            let mismatch = || -> Option<String> {
                if chain.iter().all(|(f, _)| f == "??") {
                    return Some(format!(
                        "addr2line knows nothing ({chain:?}) but got {got:?}"
                    ));
                }
                if got.len() != chain.len() {
                    return Some(format!("inline chain {got:?} vs addr2line {chain:?}"));
                }
                for (j, ((inl, func, loc), (a_func, a_loc))) in got.iter().zip(&chain).enumerate() {
                    if *inl != (j + 1 < chain.len()) {
                        return Some(format!("[inlined] marks: {got:?} vs addr2line {chain:?}"));
                    }
                    if func != a_func {
                        return Some(format!("function {func:?} vs addr2line {a_func:?}"));
                    }
                    match (loc, a_loc) {
                        (None, None) => {}
                        (Some((f, l)), Some((af, al))) => {
                            if basename(f) != basename(af) || l != al {
                                return Some(format!(
                                    "location {f}:{l} vs addr2line {af}:{al} ({func})"
                                ));
                            }
                            if !(af.ends_with(f.as_str()) || f.ends_with(af.as_str())) {
                                return Some(format!(
                                    "path {f} vs addr2line {af} (neither is a suffix of the other)"
                                ));
                            }
                        }
                        _ => {
                            return Some(format!(
                                "location {loc:?} vs addr2line {a_loc:?} ({func})"
                            ));
                        }
                    }
                }
                None
            };
            if let Some(m) = mismatch() {
                if strict {
                    panic!(
                        "{m}; module {} vaddr {:#x}; {}",
                        place.module,
                        place.lookup_vaddr,
                        ctx()
                    );
                }
                notes.push(format!("{what}: frame {i} in {module_name}: {m}"));
            }
        }
        notes
    }
}

// ---------------------------------------------------------------------------------------------
// Expectations common to the tracer's stacks and gdb's.

/// One probed call of the workload and its stack text.
#[derive(Clone, Debug)]
struct Event {
    /// "MALLOC", "FREE" or "MARK".
    kind: String,
    size: Option<u64>,
    text: String,
    /// The innermost frame is the return address in the caller (not an exact pc).
    first_is_return: bool,
}

fn physical_depth(s: &Stack) -> usize {
    s.frames.len()
}

/// Checks every event's frames against addr2line and the known shape of the workload's calls.
/// `depth`: the physical frame bound (None: unbounded as far as this workload goes).
fn check_events(what: &str, oracle: &Oracle, events: &[Event], depth: Option<usize>) {
    let mut notes = Vec::new();
    let by_size = |size: u64| -> Vec<&Event> {
        events
            .iter()
            .filter(|e| e.kind == "MALLOC" && e.size == Some(size))
            .collect()
    };
    for e in events {
        let s = parse_stack(&e.text);
        assert!(!s.frames.is_empty(), "{what}: empty stack for {e:?}");
        notes.extend(oracle.check(what, &e.text, &s, e.first_is_return));
        if let Some(d) = depth {
            assert!(
                physical_depth(&s) <= d,
                "{what}: at most {d} physical frames:\n{}",
                e.text
            );
        }
    }

    let prefix = |e: &Event, want: &[&str]| {
        let s = parse_stack(&e.text);
        let got = s.functions();
        assert!(
            got.len() >= want.len() && got[..want.len()] == *want,
            "{what}: stack of {:?} {:?} starts with {want:?}, got {got:?}:\n{}",
            e.kind,
            e.size,
            e.text
        );
        s
    };

    // main -> outer -> middle -> [inlined] leaf -> halMemAlloc, 3 times.
    for size in [MIB, 2 * MIB, 3 * MIB] {
        let ev = by_size(size);
        assert_eq!(ev.len(), 1, "{what}: one MALLOC of {size} bytes");
        let s = prefix(ev[0], &["middle", "outer", "main"]);
        let top = &s.frames[0];
        assert!(
            matches!(top.lines.as_slice(), [
                Line::Symbolized { inlined: true, function: l, .. },
                Line::Symbolized { inlined: false, function: m, .. },
            ] if l == "leaf" && m == "middle"),
            "{what}: `[inlined] leaf` then `middle` at one address:\n{}",
            ev[0].text
        );
    }

    // recurse(80): 81 frames of recurse, then main (when the depth allows).
    let ev = by_size(5 * MIB);
    assert_eq!(ev.len(), 1, "{what}: one MALLOC from recurse()");
    let s = parse_stack(&ev[0].text);
    let f = s.functions();
    match depth {
        Some(d) if d <= RECURSE_FRAMES => {
            assert_eq!(f.len(), d, "{what}: cut at {d} frames:\n{}", ev[0].text);
            assert!(f.iter().all(|x| x == "recurse"), "{what}: {f:?}");
            assert!(
                s.truncated,
                "{what}: ends with [truncated]:\n{}",
                ev[0].text
            );
        }
        _ => {
            let mut want = vec!["recurse"; RECURSE_FRAMES];
            want.push("main");
            prefix(ev[0], &want);
        }
    }

    // C++: Pool<unsigned long long>::grab inside libstack_cxx.so.
    let ev = by_size(6 * MIB);
    assert_eq!(ev.len(), 1, "{what}: one MALLOC from libstack_cxx.so");
    let s = prefix(
        ev[0],
        &[
            "memscope_fixture::Pool<unsigned long long>::grab(unsigned long long)",
            "stack_cxx_alloc",
            "main",
        ],
    );
    let p = oracle
        .place(s.frames[0].addr, s.frames[0].addr - 1)
        .unwrap();
    assert_eq!(basename(&p.module), "libstack_cxx.so", "{what}");

    // The stripped library: names only in its separate debug file.
    let ev = by_size(7 * MIB);
    assert_eq!(ev.len(), 1, "{what}: one MALLOC from libstack_stripped.so");
    let s = prefix(ev[0], &["stripped_inner", "stripped_alloc", "main"]);
    let p = oracle
        .place(s.frames[0].addr, s.frames[0].addr - 1)
        .unwrap();
    assert_eq!(basename(&p.module), "libstack_stripped.so", "{what}");

    // halMemFree is called from main.
    let frees: Vec<_> = events.iter().filter(|e| e.kind == "FREE").collect();
    assert_eq!(frees.len(), 6, "{what}: 6 FREE");
    for e in frees {
        prefix(e, &["main"]);
    }

    // mstxMarkA: an entry probe, so the probed function itself, at its first instruction.
    let marks: Vec<_> = events.iter().filter(|e| e.kind == "MARK").collect();
    assert_eq!(marks.len(), 1, "{what}: one Mark");
    let s = prefix(marks[0], &["mstxMarkA", "main"]);
    let p = oracle.place(s.frames[0].addr, s.frames[0].addr).unwrap();
    assert_eq!(basename(&p.module), "libms_tools_ext.so", "{what}");
    assert_eq!(
        p.lookup_vaddr,
        dynamic_symbol(&p.module, "mstxMarkA"),
        "{what}: the pc of an entry probe is the function's address:\n{}",
        marks[0].text
    );

    for n in notes {
        eprintln!("note (system library, not checked): {n}");
    }
}

/// st_value of a defined dynamic symbol (`nm -D`).
fn dynamic_symbol(module: &str, name: &str) -> u64 {
    let out = Command::new("nm")
        .args(["-D", "--defined-only", module])
        .output()
        .expect("run nm (binutils)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            (c.len() == 3 && c[2] == name).then(|| u64::from_str_radix(c[0], 16).unwrap())
        })
        .unwrap_or_else(|| panic!("no dynamic symbol {name} in {module}"))
}

// ---------------------------------------------------------------------------------------------
// The tracer.

struct Traced {
    rows: Vec<Row>,
    maps: PathBuf,
    /// Holds `maps` (removed with it).
    _dir: common::Scratch,
}

fn trace(name: &str, program: &str, call_stack: Option<&str>) -> Traced {
    let dir = scratch(name);
    let out_dir = dir.join("out");
    let maps = dir.join("maps");
    let prog = bin(program);
    let mut args = vec!["-o".to_string(), out_dir.to_str().unwrap().to_string()];
    if let Some(cs) = call_stack {
        args.push(format!("--call-stack={cs}"));
    }
    args.extend([
        "--".to_string(),
        prog.to_str().unwrap().to_string(),
        "--maps".to_string(),
        maps.to_str().unwrap().to_string(),
    ]);
    let out = run_tracer(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{program}; stderr:\n{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let pid: u32 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("PID "))
        .unwrap_or_else(|| panic!("no PID line in {stdout:?}"))
        .trim()
        .parse()
        .unwrap();
    Traced {
        rows: stack_rows(&out_dir, pid),
        maps,
        _dir: dir,
    }
}

fn events_of(rows: &[Row]) -> Vec<Event> {
    rows.iter()
        .filter_map(|r| {
            let (kind, first_is_return) = match (r.event.as_str(), r.event_type.as_str()) {
                ("MALLOC", _) => ("MALLOC", true),
                ("FREE", _) => ("FREE", true),
                ("MSTX", "Mark") if r.name == "marked" => ("MARK", false),
                _ => return None,
            };
            Some(Event {
                kind: kind.to_string(),
                size: r.size(),
                text: r.c_stack.clone(),
                first_is_return,
            })
        })
        .collect()
}

fn check_program(program: &str) {
    for (depth, cs) in [(None, "c:100"), (Some(10), "c:10")] {
        let what = format!("{program} --call-stack={cs}");
        let t = trace(
            &format!("stacks-{program}-{}", cs.replace(':', "")),
            program,
            Some(cs),
        );
        let events = events_of(&t.rows);
        // 6 MALLOC, 6 FREE, 1 Mark (FREE rows' sizes repeat the block's).
        assert_eq!(
            events.iter().filter(|e| e.kind == "MALLOC").count(),
            6,
            "{what}: rows {:#?}",
            t.rows
        );
        for r in &t.rows {
            if ["MALLOC", "FREE", "MSTX"].contains(&r.event.as_str()) {
                assert!(!r.c_stack.is_empty(), "{what}: C stack of {r:?}");
            }
        }
        let oracle = Oracle::new(&t.maps, &fixtures());
        check_events(&what, &oracle, &events, depth);
    }
}

#[test]
fn c_stacks_with_frame_pointers() {
    if !require_root("c_stacks_with_frame_pointers") {
        return;
    }
    let _serial = serial();
    check_program("stack_workload_fp");
}

#[test]
fn c_stacks_without_frame_pointers() {
    if !require_root("c_stacks_without_frame_pointers") {
        return;
    }
    let _serial = serial();
    check_program("stack_workload_nofp");
}

#[test]
fn no_call_stack_option_leaves_the_column_empty() {
    if !require_root("no_call_stack_option_leaves_the_column_empty") {
        return;
    }
    let _serial = serial();
    let t = trace("stacks-none", "stack_workload_nofp", None);
    assert!(t.rows.len() >= 13, "{:#?}", t.rows);
    for r in &t.rows {
        assert_eq!(r.c_stack, "", "{r:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// No tracer: gdb's stacks at the same probe points, rendered with addr2line, must pass the same
// checks. Validates the fixtures (leaf really inlined, frames really there) and the plumbing.

const GDB_SCRIPT: &str = r#"
import gdb
class B(gdb.Breakpoint):
    def __init__(self, spec, kind):
        super().__init__(spec)
        self.kind = kind
    def stop(self):
        size = int(gdb.parse_and_eval("$rsi")) if self.kind == "MALLOC" else 0
        out = ["STACK %s %d" % (self.kind, size)]
        f = gdb.newest_frame()
        while f is not None:
            if f.type() != gdb.INLINE_FRAME:
                out.append("PC %#x %s" % (f.pc(), f.name()))
            f = f.older()
        gdb.write("\n".join(out) + "\nEND\n")
        return False
gdb.execute("set pagination off")
gdb.execute("set backtrace past-main on")
gdb.execute("set breakpoint pending on")
B("*halMemAlloc", "MALLOC")
B("*halMemFree", "FREE")
B("*mstxMarkA", "MARK")
gdb.execute("run")
"#;

/// Renders physical frame addresses in the column's format, symbolized by addr2line.
fn render(oracle: &Oracle, addrs: &[u64], first_is_return: bool) -> String {
    let mut out = Vec::new();
    for (i, &a) in addrs.iter().enumerate() {
        let Some(p) = oracle.place(a, Oracle::lookup_pc(i, a, first_is_return)) else {
            out.push(format!("{a:#018x} [unknown]"));
            continue;
        };
        let chain = oracle.chain(&p);
        if chain.iter().all(|(f, _)| f == "??") {
            out.push(format!(
                "{a:#018x} {}+{:#x}",
                basename(&p.module),
                p.file_offset
            ));
            continue;
        }
        for (j, (f, loc)) in chain.iter().enumerate() {
            let inl = if j + 1 < chain.len() {
                "[inlined] "
            } else {
                ""
            };
            let loc = loc
                .as_ref()
                .map(|(file, line)| format!(" at {file}:{line}"))
                .unwrap_or_default();
            out.push(format!("{a:#018x} {inl}{f}{loc}"));
        }
    }
    out.join("\n")
}

fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_tree(&p, &to.join(e.file_name()));
        } else {
            fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn fixture_stacks_agree_with_gdb() {
    let have_gdb = Command::new("gdb")
        .args(["-q", "-batch", "-ex", "python print('ok')"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("ok"))
        .unwrap_or(false);
    if !have_gdb {
        eprintln!("SKIPPED fixture_stacks_agree_with_gdb: needs gdb with Python");
        println!("SKIPPED fixture_stacks_agree_with_gdb: needs gdb");
        return;
    }
    // A private copy of the fixtures: uprobes are per inode, so a tracer running at the same
    // time (other tests) would otherwise take gdb's breakpoints and hijack return addresses.
    let root = scratch("stacks-gdb");
    let copy = root.join("build");
    copy_tree(&fixtures().join("lib"), &copy.join("lib"));
    fs::create_dir_all(copy.join("bin")).unwrap();
    for program in ["stack_workload_fp", "stack_workload_nofp"] {
        fs::copy(bin(program), copy.join("bin").join(program)).unwrap();
    }
    for program in ["stack_workload_fp", "stack_workload_nofp"] {
        let dir = root.join(program);
        fs::create_dir_all(&dir).unwrap();
        let script = dir.join("bt.py");
        let maps = dir.join("maps");
        fs::write(&script, GDB_SCRIPT).unwrap();
        let out = Command::new("gdb")
            .arg("-q")
            .arg("-batch")
            .arg("-x")
            .arg(&script)
            .arg("--args")
            .arg(copy.join("bin").join(program))
            .arg("--maps")
            .arg(&maps)
            .output()
            .expect("run gdb");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("exited normally"),
            "{program} under gdb:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let oracle = Oracle::new(&maps, &copy);
        let mut events = Vec::new();
        // The same stacks cut at 10 frames, for the depth-limit checks.
        let mut cut = Vec::new();
        #[allow(clippy::type_complexity)] // (kind, size, [(pc, gdb's name)])
        let mut cur: Option<(String, u64, Vec<(u64, String)>)> = None;
        for l in stdout.lines() {
            if let Some(rest) = l.strip_prefix("STACK ") {
                let (kind, size) = rest.split_once(' ').unwrap();
                cur = Some((kind.to_string(), size.parse().unwrap(), Vec::new()));
            } else if let Some(rest) = l.strip_prefix("PC ") {
                let (pc, name) = rest.split_once(' ').unwrap();
                let pc = u64::from_str_radix(pc.trim_start_matches("0x"), 16).unwrap();
                cur.as_mut().unwrap().2.push((pc, name.to_string()));
            } else if l == "END" {
                let (kind, size, frames) = cur.take().unwrap();
                // Return probes: the stack starts at the caller's return address.
                let first_is_return = kind != "MARK";
                let frames = if first_is_return {
                    &frames[1..]
                } else {
                    &frames[..]
                };
                let addrs: Vec<u64> = frames.iter().map(|f| f.0).collect();
                let text = render(&oracle, &addrs, first_is_return);
                // gdb and addr2line agree on the machine frames' functions in the fixtures.
                let s = parse_stack(&text);
                for ((pc, gdb_name), f) in frames.iter().zip(&s.frames) {
                    let p = oracle.place(*pc, pc - 1).unwrap();
                    if oracle.is_fixture(&p.module)
                        && let Some(func) = f.function()
                    {
                        let plain = func.split('(').next().unwrap();
                        assert_eq!(plain, gdb_name, "{program}: gdb vs addr2line:\n{text}");
                    }
                }
                let mut cut_text = render(&oracle, &addrs[..addrs.len().min(10)], first_is_return);
                if addrs.len() > 10 {
                    cut_text.push_str("\n[truncated]");
                }
                let ev = Event {
                    kind,
                    size: (size != 0).then_some(size),
                    text,
                    first_is_return,
                };
                cut.push(Event {
                    text: cut_text,
                    ..ev.clone()
                });
                events.push(ev);
            }
        }
        check_events(&format!("gdb {program}"), &oracle, &events, None);
        // The checks do catch wrong stacks.
        let chain = events
            .iter()
            .find(|e| e.size == Some(MIB))
            .expect("the 1 MiB allocation")
            .clone();
        let lines: Vec<&str> = chain.text.split('\n').collect();
        let mut mutants = vec![
            // the inline frame left out
            lines[1..].join("\n"),
            // a line number off by one in the second frame
            {
                let mut l: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
                let (head, n) = l[2].rsplit_once(':').unwrap();
                l[2] = format!("{head}:{}", n.parse::<u32>().unwrap() + 1);
                l.join("\n")
            },
            // the caller's name on the callee's frame
            lines.join("\n").replacen(" outer at ", " main at ", 1),
        ];
        // a return address that is not the one on the stack
        mutants.push(lines.join("\n").replacen(
            &format!("{:#018x}", parse_stack(&chain.text).frames[1].addr),
            &format!("{:#018x}", parse_stack(&chain.text).frames[1].addr - 0x40),
            1,
        ));
        for m in mutants {
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                oracle.check("mutant", &m, &parse_stack(&m), true);
            }))
            .is_err();
            assert!(caught, "{program}: a wrong stack passed the checks:\n{m}");
        }
        check_events(&format!("gdb {program} cut"), &oracle, &cut, Some(10));
    }
}

#[test]
fn csv_record_reader() {
    let recs = csv_records("a,b,c\n1,\"x\ny\",\"q\"\"q\"\n2,,\n");
    assert_eq!(
        recs,
        vec![
            vec!["a", "b", "c"],
            vec!["1", "x\ny", "q\"q"],
            vec!["2", "", ""],
        ]
    );
    let s = parse_stack(
        "0x0000000000001000 [inlined] leaf at /a/b.c:3\n0x0000000000001000 middle at b.c:9\n\
         0x0000000000002000 int ns::f<int>(int (*)(int), int) at /x at y/c.cpp:12\n\
         0x0000000000003000 libfoo.so+0x1010\n0x0000000000004000 [unknown]\n\
         0x0000000000005000 _start\n[truncated]",
    );
    assert!(s.truncated);
    assert_eq!(s.frames.len(), 5);
    assert_eq!(s.frames[0].lines.len(), 2);
    assert_eq!(
        s.frames[1].lines[0],
        Line::Symbolized {
            inlined: false,
            function: "int ns::f<int>(int (*)(int), int) at /x".into(),
            location: Some(("y/c.cpp".into(), 12)),
        }
    );
    assert_eq!(
        s.frames[2].lines[0],
        Line::Unsymbolized {
            module: "libfoo.so".into(),
            offset: 0x1010
        }
    );
    assert_eq!(s.frames[3].lines[0], Line::Unknown);
    assert_eq!(s.functions()[4], "_start");
    assert!(parse_stack("").frames.is_empty());
    assert!(parse_stack("[truncated]").truncated);
}

/// With C stacks, `exit()` stops the process so its mappings can be read. A stop whose event
/// did not fit in a full ring buffer left the target stopped for good and the tracer waiting
/// for it (seen in the bench: a tight loop's stack copies fill the ring). The tracer is
/// frozen here while the target fills its ring and exits, so the ring is full for sure: the
/// target must get through `exit()` anyway, and the tracer must report the losses.
#[test]
fn a_full_ring_buffer_never_leaves_the_target_stopped() {
    if !require_root("a_full_ring_buffer_never_leaves_the_target_stopped") {
        return;
    }
    let _serial = serial();
    let dir = scratch("stacks-ring-full");
    let out_dir = dir.join("out");
    // 4000 calls of 8 KiB stack copies fill the 1 MiB ring many times over; with nobody
    // draining it the target must still run to its end (a zombie until the tracer reaps it).
    let (pid, stderr) = run_with_full_ring(
        &dir,
        &out_dir,
        &["--call-stack=c:8"],
        &["--handoff", "2000"],
    );
    assert!(stderr.contains("ring buffer full"), "{stderr}");
    // Past half full, samples went without their stack copy (~1 KiB instead of up to 9):
    // several times more calls fit in the second half than the ~60 of the first.
    assert!(
        stderr.contains("taken without a copy of the stack"),
        "{stderr}"
    );
    let rows = memscope_rows(&out_dir, pid);
    assert!(rows >= 300, "only {rows} rows kept\n{stderr}");
}

/// MALLOC and FREE rows written for `pid`.
fn memscope_rows(out_dir: &Path, pid: u32) -> usize {
    stack_rows(out_dir, pid)
        .iter()
        .filter(|r| r.event == "MALLOC" || r.event == "FREE")
        .count()
}
