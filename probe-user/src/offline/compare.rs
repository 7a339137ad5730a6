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

/// The result rows (without the header), in output order.
fn compare_rows(
    base: &Input,
    cmp: &Input,
    levels: &Levels,
    framework: Option<&str>,
) -> Result<Vec<String>> {
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
    let mut lines = Vec::new();
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
            let show = |v: Option<i64>| v.map_or("N/A".to_string(), |v| v.to_string());
            let diff = cv.unwrap_or(0).saturating_sub(bv.unwrap_or(0));
            lines.push(format!(
                "{event},{name},{dev},{},{},{diff}",
                show(bv),
                show(cv)
            ));
        }
    }
    Ok(lines)
}

/// Compares two dumps and returns the comparison's lines (header included).
pub fn compare_files(base: &Path, cmp: &Path, levels: &Levels) -> Result<Vec<String>> {
    let mut framework = None;
    let b = load(base, levels, &mut framework)?;
    let c = load(cmp, levels, &mut framework)?;
    let fw = framework.as_ref().map(|(f, _)| f.as_str());
    let rows = compare_rows(&b, &c, levels, fw)?;
    let mut lines: Vec<String> = COMPARE_HEADER.iter().map(|s| s.to_string()).collect();
    lines.extend(rows);
    Ok(lines)
}

/// `--compare`: writes the comparison and returns its path.
pub fn run(opts: &super::OfflineSettings, inputs: &[PathBuf; 2]) -> Result<PathBuf> {
    let started = Instant::now();
    let lines = compare_files(&inputs[0], &inputs[1], &opts.levels)?;
    if lines.len() == COMPARE_HEADER.len() {
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
