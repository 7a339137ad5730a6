//! `--compare --input-path=BASE,COMPARE`: line the op (or kernel) sequences of two runs up with
//! a Myers diff and show, per op, the framework memory each run allocated.
//!
//! Semantics (msMemScope's `MemoryCompare`):
//! * Rows on an NPU device are grouped by device and ordered by timestamp (rows with device
//!   N/A, 9999, host or cpu are skipped).
//! * The framework is the Event Type of the first `PTA` or `MINDSPORE` row (base file first);
//!   a file mixing the two is refused. Op-level comparison of MindSpore dumps is refused.
//! * The sequence is the Event Type `ATEN_END`/`ATB_END` rows (and our `ACLNN_END`, the op
//!   API calls of an unmodified process) for `--level=op` (the default)
//!   and `KERNEL_LAUNCH` rows for `--level=kernel`; their Names are diffed.
//! * The memory of an op is the Attr `size` of the first framework row at or after it in the
//!   device's time order (0 when there is none).
//! * Output `<out>/msmemscope_<pid>_<ts>_ascend/compare/memory_compare_<ts>.csv`: two header
//!   lines, then `Event,Name,Device Id,base|N/A,compare|N/A,compare-base` per diff entry.

use std::{
    collections::BTreeMap,
    io::Write,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::{
    InputError,
    reader::{self, DumpRow, Loc},
};
use crate::{
    log,
    output::{DeviceKey, ProcessOutput, local_timestamp},
    settings::Levels,
};

/// The two header lines of `memory_compare_<ts>.csv`.
pub const COMPARE_HEADER: [&str; 2] = [
    ",,,Base,Compare",
    "Event,Name,Device Id,Allocated Memory(byte),Allocated Memory(byte),Diff Memory(byte)",
];

/// msMemScope gives the diff 60 s.
pub const TIME_LIMIT: Duration = Duration::from_secs(60);

/// The Myers trace keeps one vector per edit step (2d+1 entries of 4 bytes); past this many
/// entries in total (256 MiB, about 8000 edits) the diff is refused rather than exhausting
/// memory.
const MAX_TRACE_ENTRIES: usize = 64 << 20;

/// An op or kernel row of the sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Launch {
    event: String,
    name: String,
    /// Index in the device's time-ordered list of kept rows.
    index: usize,
}

/// The rows of one device that matter: launches and framework memory rows.
#[derive(Clone, Debug, Default)]
struct DeviceRows {
    /// (timestamp, file order, row)
    rows: Vec<(u64, u64, Kept)>,
}

#[derive(Clone, Debug)]
enum Kept {
    Launch { event: String, name: String },
    Memory { pool: String, size: i64 },
}

/// One input, reduced to what the comparison needs.
struct Input {
    path: PathBuf,
    devices: BTreeMap<u32, DeviceRows>,
}

/// What `--level` selects.
fn wanted(levels: &Levels, event_type: &str) -> bool {
    (levels.op && matches!(event_type, "ATEN_END" | "ATB_END" | "ACLNN_END"))
        || (levels.kernel && event_type == "KERNEL_LAUNCH")
}

fn load(path: &Path, levels: &Levels, framework: &mut Option<(String, String)>) -> Result<Input> {
    let mut devices: BTreeMap<u32, DeviceRows> = BTreeMap::new();
    let mut order = 0u64;
    reader::for_each_row(path, |loc: Loc, row: DumpRow| {
        order += 1;
        let is_pool = matches!(row.event_type.as_str(), "PTA" | "MINDSPORE");
        if is_pool {
            match framework {
                None => {
                    *framework = Some((
                        row.event_type.clone(),
                        format!("{}:{}", path.display(), loc.n),
                    ))
                }
                Some((f, first)) if *f != row.event_type => {
                    return Err(loc
                        .error(
                            path,
                            format!(
                                "Event Type {} mixed with {f} (first seen at {first}): \
                                 compare needs dumps of a single framework",
                                row.event_type
                            ),
                        )
                        .into());
                }
                Some(_) => {}
            }
        }
        let DeviceKey::Npu(dev) = row.device else {
            return Ok(());
        };
        let kept = if wanted(levels, &row.event_type) {
            Kept::Launch {
                event: row.event.clone(),
                name: row.name.clone(),
            }
        } else if is_pool {
            let size = match row.attr("size") {
                Some(s) => s.trim().parse::<i64>().map_err(|_| {
                    loc.error(
                        path,
                        format!("Attr size '{}' is not an integer", super::excerpt(s, 40)),
                    )
                })?,
                None => {
                    log::warn(&format!(
                        "{}:{}: {} row without an Attr size; counted as 0",
                        path.display(),
                        loc.n,
                        row.event_type
                    ));
                    0
                }
            };
            Kept::Memory {
                pool: row.event_type.clone(),
                size,
            }
        } else {
            return Ok(());
        };
        devices
            .entry(dev)
            .or_default()
            .rows
            .push((row.ts_ns, order, kept));
        Ok(())
    })?;
    for d in devices.values_mut() {
        d.rows.sort_by_key(|(ts, order, _)| (*ts, *order));
    }
    Ok(Input {
        path: path.to_path_buf(),
        devices,
    })
}

impl Input {
    /// The launch sequence of `dev`; empty when a Name starts with a formula character.
    fn launches(&self, dev: u32) -> Vec<Launch> {
        let Some(d) = self.devices.get(&dev) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (index, (_, _, k)) in d.rows.iter().enumerate() {
            if let Kept::Launch { event, name } = k {
                if name.starts_with(['=', '+', '-', '@']) {
                    log::warn(&format!(
                        "{}: device {dev}: the name '{}' starts with a formula character; \
                         this device's sequence is left out",
                        self.path.display(),
                        super::excerpt(name, 80)
                    ));
                    return Vec::new();
                }
                out.push(Launch {
                    event: event.clone(),
                    name: name.clone(),
                    index,
                });
            }
        }
        out
    }

    /// The size of the first `framework` row at or after `index` on `dev` (0 if none).
    fn memory_at(&self, dev: u32, index: usize, framework: Option<&str>) -> i64 {
        let (Some(d), Some(fw)) = (self.devices.get(&dev), framework) else {
            return 0;
        };
        d.rows[index..]
            .iter()
            .find_map(|(_, _, k)| match k {
                Kept::Memory { pool, size } if pool == fw => Some(*size),
                _ => None,
            })
            .unwrap_or(0)
    }
}

/// One step of an edit script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edit {
    /// `base[i]` and `compare[j]` match.
    Both(usize, usize),
    /// Only in base.
    Base(usize),
    /// Only in compare.
    Compare(usize),
}

/// Myers' greedy shortest edit script between `a` (base) and `b` (compare), in forward order.
/// Ties are broken as msMemScope does: a step down (compare-only) when
/// `V[k-1] < V[k+1]`, otherwise a step right (base-only).
pub fn myers<T: PartialEq>(a: &[T], b: &[T], deadline: Option<Instant>) -> Result<Vec<Edit>> {
    if a.len() + b.len() >= u32::MAX as usize {
        anyhow::bail!("the op sequences are too long to compare");
    }
    let n = a.len() as i64;
    let m = b.len() as i64;
    let max = (n + m) as usize;
    let off = max as i64 + 1;
    let mut v = vec![0i64; 2 * max + 3];
    // v[k+1] = 0 start: the virtual step into (0, 0).
    let mut trace: Vec<Vec<u32>> = Vec::new();
    let snapshot = |v: &[i64], d: i64| -> Vec<u32> {
        v[(off - d) as usize..=(off + d) as usize]
            .iter()
            .map(|&x| x as u32)
            .collect()
    };
    let mut entries = 0usize;
    let mut found = None;
    'outer: for d in 0..=max as i64 {
        if let Some(dl) = deadline
            && Instant::now() >= dl
        {
            anyhow::bail!("the op sequences differ too much: gave up after {d} edits (time limit)");
        }
        let mut k = -d;
        while k <= d {
            let idx = (k + off) as usize;
            let mut x = if k == -d || (k != d && v[idx - 1] < v[idx + 1]) {
                v[idx + 1]
            } else {
                v[idx - 1] + 1
            };
            let mut y = x - k;
            while x < n && y < m && a[x as usize] == b[y as usize] {
                x += 1;
                y += 1;
            }
            v[idx] = x;
            if x >= n && y >= m {
                found = Some((d, k));
                // Record this step's values too for the backtrack.
                trace.push(snapshot(&v, d));
                break 'outer;
            }
            k += 2;
        }
        entries += 2 * d as usize + 1;
        if entries > MAX_TRACE_ENTRIES {
            anyhow::bail!("the op sequences differ too much: more than {d} edits");
        }
        trace.push(snapshot(&v, d));
    }
    let (dmax, _) = found.expect("Myers always reaches the end");
    // Backtrack. trace[d][k + d] is the furthest x on diagonal k after d edits.
    let at = |d: i64, k: i64| i64::from(trace[d as usize][(k + d) as usize]);
    let mut out = Vec::new();
    let (mut x, mut y) = (n, m);
    for d in (0..=dmax).rev() {
        let k = x - y;
        let (sx, sy, edit) = if d == 0 {
            (0, 0, None)
        } else {
            let down = k == -d || (k != d && at(d - 1, k - 1) < at(d - 1, k + 1));
            let pk = if down { k + 1 } else { k - 1 };
            let px = at(d - 1, pk);
            let py = px - pk;
            let (mx, my) = if down { (px, py + 1) } else { (px + 1, py) };
            let e = if down {
                Edit::Compare((my - 1) as usize)
            } else {
                Edit::Base((mx - 1) as usize)
            };
            (mx, my, Some((e, px, py)))
        };
        // The snake from (sx, sy) to (x, y), backwards.
        while x > sx && y > sy {
            x -= 1;
            y -= 1;
            out.push(Edit::Both(x as usize, y as usize));
        }
        if let Some((e, px, py)) = edit {
            out.push(e);
            x = px;
            y = py;
        }
    }
    out.reverse();
    Ok(out)
}

/// One entry of the comparison: an op (or kernel) of one run or both, with the framework
/// memory after it in each (`None`: not in that run).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompareRow {
    pub event: String,
    pub name: String,
    pub device: u32,
    pub base: Option<i64>,
    pub compare: Option<i64>,
}

impl CompareRow {
    /// `compare - base`, a missing side counting as 0 (msMemScope's column).
    pub fn diff(&self) -> i64 {
        self.compare
            .unwrap_or(0)
            .saturating_sub(self.base.unwrap_or(0))
    }

    /// The CSV line.
    fn line(&self) -> String {
        let show = |v: Option<i64>| v.map_or("N/A".to_string(), |v| v.to_string());
        format!(
            "{},{},{},{},{},{}",
            self.event,
            self.name,
            self.device,
            show(self.base),
            show(self.compare),
            self.diff()
        )
    }
}

/// The result rows (without the header), in output order.
fn compare_rows(
    base: &Input,
    cmp: &Input,
    levels: &Levels,
    framework: Option<&str>,
) -> Result<Vec<CompareRow>> {
    if levels.op && framework == Some("MINDSPORE") {
        return Err(InputError::file(
            &base.path,
            "op-level comparison of MindSpore dumps is not supported (msMemScope refuses it too); \
             use --level=kernel",
        )
        .into());
    }
    let mut devices: Vec<u32> = base
        .devices
        .keys()
        .chain(cmp.devices.keys())
        .copied()
        .collect();
    devices.sort_unstable();
    devices.dedup();
    let deadline = Instant::now() + TIME_LIMIT;
    let mut out = Vec::new();
    for dev in devices {
        let a = base.launches(dev);
        let b = cmp.launches(dev);
        if a.is_empty() && b.is_empty() {
            continue;
        }
        let an: Vec<&str> = a.iter().map(|l| l.name.as_str()).collect();
        let bn: Vec<&str> = b.iter().map(|l| l.name.as_str()).collect();
        let script = myers(&an, &bn, Some(deadline))
            .with_context(|| format!("cannot compare device {dev}"))?;
        for e in script {
            let (event, name, bv, cv) = match e {
                Edit::Both(i, j) => (
                    &b[j].event,
                    &b[j].name,
                    Some(base.memory_at(dev, a[i].index, framework)),
                    Some(cmp.memory_at(dev, b[j].index, framework)),
                ),
                Edit::Base(i) => (
                    &a[i].event,
                    &a[i].name,
                    Some(base.memory_at(dev, a[i].index, framework)),
                    None,
                ),
                Edit::Compare(j) => (
                    &b[j].event,
                    &b[j].name,
                    None,
                    Some(cmp.memory_at(dev, b[j].index, framework)),
                ),
            };
            out.push(CompareRow {
                event: event.clone(),
                name: name.clone(),
                device: dev,
                base: bv,
                compare: cv,
            });
        }
    }
    Ok(out)
}

/// Compares two dumps: the comparison's entries in output order.
pub fn compare_entries(base: &Path, cmp: &Path, levels: &Levels) -> Result<Vec<CompareRow>> {
    let mut framework = None;
    let b = load(base, levels, &mut framework)?;
    let c = load(cmp, levels, &mut framework)?;
    let fw = framework.as_ref().map(|(f, _)| f.as_str());
    compare_rows(&b, &c, levels, fw)
}

/// Compares two dumps and returns the comparison's lines (header included).
pub fn compare_files(base: &Path, cmp: &Path, levels: &Levels) -> Result<Vec<String>> {
    let rows = compare_entries(base, cmp, levels)?;
    let mut lines: Vec<String> = COMPARE_HEADER.iter().map(|s| s.to_string()).collect();
    lines.extend(rows.iter().map(CompareRow::line));
    Ok(lines)
}

/// How many of the largest differences the terminal summary lists.
pub const SUMMARY_ROWS: usize = 10;

/// The terminal summary of a comparison: how the sequences lined up, and the entries whose
/// memory differs most (largest `|compare - base|` first, ties in file order), each with its
/// line in `csv_name`, exact bytes and human units.
pub fn summary(rows: &[CompareRow], csv_name: &str, top: usize) -> String {
    let both = rows
        .iter()
        .filter(|r| r.base.is_some() && r.compare.is_some())
        .count();
    let only_base = rows.iter().filter(|r| r.compare.is_none()).count();
    let only_compare = rows.iter().filter(|r| r.base.is_none()).count();
    let mut s = format!(
        "{} entries: {both} in both runs, {only_base} only in base, {only_compare} only in compare\n",
        rows.len()
    );
    let mut differing: Vec<(usize, &CompareRow)> = rows
        .iter()
        .enumerate()
        .filter(|(_, r)| r.diff() != 0)
        .collect();
    if differing.is_empty() {
        s.push_str("no entry's memory differs between the runs\n");
        return s;
    }
    differing.sort_by_key(|(i, r)| (std::cmp::Reverse(r.diff().unsigned_abs()), *i));
    let shown = differing.len().min(top);
    s.push_str(&format!(
        "{} entries differ; the largest {shown} (compare - base; line in {csv_name}):\n",
        differing.len()
    ));
    let side = |v: Option<i64>| match v {
        None => "N/A".to_owned(),
        Some(v) => u64::try_from(v).map_or_else(|_| log::signed_bytes(v), log::bytes),
    };
    for (i, r) in differing.into_iter().take(top) {
        s.push_str(&format!(
            "  line {:<6} device {:<3} {:<28} {:>30}   base {}, compare {}\n",
            i + COMPARE_HEADER.len() + 1,
            r.device,
            r.name,
            log::signed_bytes(r.diff()),
            side(r.base),
            side(r.compare),
        ));
    }
    s
}

/// `--compare`: writes the comparison, prints its summary on stdout and returns the path.
pub fn run(opts: &super::OfflineSettings, inputs: &[PathBuf; 2]) -> Result<PathBuf> {
    let started = Instant::now();
    let rows = compare_entries(&inputs[0], &inputs[1], &opts.levels)?;
    let mut lines: Vec<String> = COMPARE_HEADER.iter().map(|s| s.to_string()).collect();
    lines.extend(rows.iter().map(CompareRow::line));
    if rows.is_empty() {
        log::warn(&format!(
            "no {} rows on an NPU device in either input: the comparison is empty",
            if opts.levels.kernel && !opts.levels.op {
                "KERNEL_LAUNCH"
            } else {
                "ATEN_END/ATB_END/ACLNN_END"
            }
        ));
    }
    let mut out = ProcessOutput::new(
        &opts.output_dir,
        std::process::id(),
        opts.config_json.clone(),
    );
    let dir = out.subdir("compare")?;
    let (path, f) =
        dir.create_unique_file(&format!("memory_compare_{}", local_timestamp()), ".csv")?;
    let mut f = std::io::BufWriter::new(f);
    for l in &lines {
        writeln!(f, "{l}").with_context(|| format!("cannot write {}", path.display()))?;
    }
    f.flush()
        .with_context(|| format!("cannot write {}", path.display()))?;
    log::info(&format!(
        "compared {} with {}: {} row(s) in {:.1} s",
        inputs[0].display(),
        inputs[1].display(),
        lines.len() - COMPARE_HEADER.len(),
        started.elapsed().as_secs_f64()
    ));
    log::info(&format!("comparison written to {}", path.display()));
    // The answer last, after the messages about it.
    if !rows.is_empty() {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        print!("{}", summary(&rows, &name, SUMMARY_ROWS));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(a: &str, b: &str) -> String {
        let a: Vec<char> = a.chars().collect();
        let b: Vec<char> = b.chars().collect();
        myers(&a, &b, None)
            .unwrap()
            .into_iter()
            .map(|e| match e {
                Edit::Both(i, _) => a[i].to_string(),
                Edit::Base(i) => format!("-{}", a[i]),
                Edit::Compare(j) => format!("+{}", b[j]),
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn myers_shortest_scripts() {
        assert_eq!(script("", ""), "");
        assert_eq!(script("abc", "abc"), "a b c");
        assert_eq!(script("", "ab"), "+a +b");
        assert_eq!(script("ab", ""), "-a -b");
        assert_eq!(script("abc", "abd"), "a b -c +d");
        assert_eq!(script("axc", "ac"), "a -x c");
        assert_eq!(script("ac", "ayc"), "a +y c");
        // The classic example from Myers' paper: 5 edits.
        let s = script("abcabba", "cbabac");
        assert_eq!(s.split(' ').filter(|t| t.len() > 1).count(), 5, "{s}");
        assert_eq!(s, "-a -b c +b a b -b a +c");
    }

    #[test]
    fn myers_script_is_consistent_on_random_inputs() {
        // Deterministic pseudo-random sequences over a small alphabet.
        let mut seed = 12345u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize
        };
        for _ in 0..200 {
            let a: Vec<u8> = (0..next() % 30)
                .map(|_| b'a' + (next() % 4) as u8)
                .collect();
            let b: Vec<u8> = (0..next() % 30)
                .map(|_| b'a' + (next() % 4) as u8)
                .collect();
            let s = myers(&a, &b, None).unwrap();
            let (mut i, mut j) = (0, 0);
            let mut matched = 0;
            for e in &s {
                match *e {
                    Edit::Both(x, y) => {
                        assert_eq!((x, y), (i, j));
                        assert_eq!(a[x], b[y]);
                        i += 1;
                        j += 1;
                        matched += 1;
                    }
                    Edit::Base(x) => {
                        assert_eq!(x, i);
                        i += 1;
                    }
                    Edit::Compare(y) => {
                        assert_eq!(y, j);
                        j += 1;
                    }
                }
            }
            assert_eq!((i, j), (a.len(), b.len()));
            // Shortest: the matches form a longest common subsequence.
            assert_eq!(matched, lcs(&a, &b), "{a:?} {b:?}");
        }
    }

    fn lcs(a: &[u8], b: &[u8]) -> usize {
        let mut dp = vec![vec![0usize; b.len() + 1]; a.len() + 1];
        for i in 0..a.len() {
            for j in 0..b.len() {
                dp[i + 1][j + 1] = if a[i] == b[j] {
                    dp[i][j] + 1
                } else {
                    dp[i][j + 1].max(dp[i + 1][j])
                };
            }
        }
        dp[a.len()][b.len()]
    }

    #[test]
    fn summary_lists_the_largest_differences_first() {
        let row = |name: &str, device, base, compare| CompareRow {
            event: "OP_LAUNCH".to_owned(),
            name: name.to_owned(),
            device,
            base,
            compare,
        };
        let rows = [
            row("aclnnAdd", 0, Some(512), Some(512)),
            row("aclnnMul", 0, Some(1 << 20), Some(3 << 20)),
            row("aclnnRelu", 0, None, Some(2048)),
            row("aclnnSum", 1, Some(4096), None),
            row("aclnnCat", 1, Some(4096), Some(0)),
            row("aclnnExp", 0, Some(1), Some(2)),
        ];
        let s = summary(&rows, "memory_compare_1.csv", 3);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(
            lines[0],
            "6 entries: 4 in both runs, 1 only in base, 1 only in compare"
        );
        assert_eq!(
            lines[1],
            "5 entries differ; the largest 3 (compare - base; line in memory_compare_1.csv):"
        );
        // +2 MiB, then the two 4096-byte drops in file order (a missing side counts as 0).
        assert!(lines[2].starts_with("  line 4 "), "{s}");
        assert!(
            lines[2].contains("aclnnMul")
                && lines[2].contains("+2097152 bytes (+2.00 MiB)")
                && lines[2]
                    .contains("base 1048576 bytes (1.00 MiB), compare 3145728 bytes (3.00 MiB)"),
            "{s}"
        );
        assert!(lines[3].starts_with("  line 6 ") && lines[3].contains("-4096 bytes (-4.00 KiB)"));
        assert!(lines[3].contains("compare N/A"), "{s}");
        assert!(
            lines[4].starts_with("  line 7 ") && lines[4].contains("aclnnCat"),
            "{s}"
        );
        assert_eq!(lines.len(), 5, "{s}");
        let same = [row("aclnnAdd", 0, Some(5), Some(5))];
        assert!(summary(&same, "f.csv", 10).contains("no entry's memory differs"));
    }

    #[test]
    fn levels_select_rows() {
        let op = Levels {
            op: true,
            kernel: false,
        };
        let kernel = Levels {
            op: false,
            kernel: true,
        };
        assert!(wanted(&op, "ATEN_END") && wanted(&op, "ATB_END") && wanted(&op, "ACLNN_END"));
        assert!(!wanted(&op, "ATEN_START") && !wanted(&op, "KERNEL_LAUNCH"));
        assert!(wanted(&kernel, "KERNEL_LAUNCH") && !wanted(&kernel, "ATEN_END"));
    }
}
