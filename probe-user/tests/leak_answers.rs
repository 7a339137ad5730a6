//! Answers a user can act on: which tensor (or block) leaked, made on which line of the
//! program's own code, in which step, in every leak view, with no options at all; and the
//! memory a framework pool keeps cached on purpose never called a leak.
//!
//! * The released torch + torch_npu wheels on the simulated CANN (as real_torch.rs): the
//!   training script keeps one tensor per step from step 3 on (`kept.append`) and ends at once
//!   (`--keep-cache`: `os._exit`, so the caching allocator still holds its segments). The
//!   terminal summary, `leaks_*.csv`, the HTML report (its DOM in headless Chromium) and
//!   `analyze --by-site` are checked against the script's own log: each tensor's
//!   `data_ptr()`, the growth of `memory_allocated()`, its step, the line that made it
//!   (`traceback.extract_stack()`), and the pool's `memory_allocated()`/`memory_reserved()`
//!   at the end.
//! * A C program leaking through its own allocator wrapper: the site is the wrapper's caller,
//!   and `--drop-frames` moves it one caller further out.

mod common;

use std::{collections::BTreeSet, fs, path::Path, process::Command};

use common::chromium::{dump_dom, require_chromium};
use common::*;

const STEPS: u32 = 5;

/// A tensor the script kept on purpose: where and how big, its step, the line that made it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Kept {
    ptr: u64,
    size: u64,
    step: u32,
    site: String,
}

/// The first frame (innermost) of a `stack=[["file",line,"fn"],...]` field, as `file:line`.
fn innermost_line(line: &str) -> String {
    let json = line.split_once(" stack=[[").expect("stack field").1;
    let frame = json.split("],[").next().unwrap();
    let parts: Vec<&str> = frame.split(',').collect();
    format!("{}:{}", parts[0].trim_matches('"'), parts[1])
}

/// The tensors the script logged as kept (`LEAK`), with their `ALLOC` line's size and stack.
fn kept_tensors(log: &str) -> Vec<Kept> {
    let mut out = Vec::new();
    for leak in log_lines(log, "LEAK") {
        let name = leak["name"];
        let alloc = log
            .lines()
            .find(|l| l.starts_with(&format!("ALLOC name={name} ")))
            .unwrap_or_else(|| panic!("no ALLOC line for {name}"));
        let f = log_fields(alloc);
        out.push(Kept {
            ptr: hex(f["ptr"]),
            size: f["bytes"].parse().unwrap(),
            step: leak["step"].parse().unwrap(),
            site: innermost_line(alloc),
        });
    }
    out.sort();
    out
}

/// The rows of a process's `leaks_*.csv`: (ptr, size, step, leak, site).
fn leak_csv(dir: &Path) -> Vec<(u64, u64, u32, String, String)> {
    let mut rows = Vec::new();
    for f in find_files(dir, "leaks_") {
        let text = fs::read_to_string(&f).unwrap();
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some(memscope_bpf::output::leaks::LEAKS_HEADER)
        );
        for l in lines {
            let c = split_csv(l);
            assert_eq!(c.len(), 12, "{l}");
            rows.push((
                hex(&c[4]),
                c[5].parse().unwrap(),
                c[6].parse().unwrap(),
                c[10].clone(),
                c[11].clone(),
            ));
        }
    }
    rows.sort();
    rows
}

/// `attr="..."` of every element with `data-check="check"` in a DOM.
fn attr_values(dom: &str, check: &str, attr: &str) -> Vec<String> {
    let needle = format!("data-check=\"{check}\"");
    dom.match_indices(&needle)
        .map(|(pos, _)| {
            let start = dom[..pos].rfind('<').unwrap();
            let tag = &dom[start..pos + dom[pos..].find('>').unwrap()];
            let at = tag
                .find(&format!(" {attr}=\""))
                .unwrap_or_else(|| panic!("{attr} in {tag}"))
                + attr.len()
                + 3;
            tag[at..at + tag[at..].find('"').unwrap()].to_owned()
        })
        .collect()
}

#[test]
fn real_torch_leaks_name_the_tensor_its_line_and_step_with_no_options() {
    let Some(venvs) =
        torch_venvs("real_torch_leaks_name_the_tensor_its_line_and_step_with_no_options")
    else {
        return;
    };
    let can_render = require_chromium("real_torch_leaks_name_the_tensor_its_line_and_step");
    for venv in venvs {
        let release = bed_release(&venv);
        let _g = serial();
        let dir = scratch(&format!("leak-answers-{release}"));
        let log_path = dir.join("gt.log");
        // No option at all: the user's own command, from the user's directory.
        let out = Command::new(TRACER)
            .current_dir(&*dir)
            .arg("--")
            .arg(venv.join("bin/python"))
            .arg(torch_script())
            .args(["--log", log_path.to_str().unwrap()])
            .args(["--steps", &STEPS.to_string(), "--keep-cache", "--stacks"])
            .envs(cann_env())
            .output()
            .expect("run memscope-bpf");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{release}: {stderr}");
        let log = fs::read_to_string(&log_path).unwrap();
        let pid: u32 = log_lines(&log, "READY")[0]["pid"].parse().unwrap();
        let kept = kept_tensors(&log);
        // From step 3 on, one per step.
        assert_eq!(
            kept.iter().map(|k| k.step).collect::<BTreeSet<_>>(),
            (3..=STEPS).collect(),
            "{release}: {log}"
        );
        let end = &log_lines(&log, "END")[0];
        let (allocated, reserved): (u64, u64) = (
            end["allocated"].parse().unwrap(),
            end["reserved"].parse().unwrap(),
        );
        assert_eq!(
            allocated,
            kept.iter().map(|k| k.size).sum::<u64>(),
            "{release}: only the kept tensors are left: {log}"
        );
        let out_dir = dir.join("memscopeDumpResults");
        let proc_dir = process_dir(&out_dir, pid).expect("the process's directory");

        // 1. The terminal summary: every kept tensor by its line and step, no driver leak,
        //    the pool's segments as cached memory with the pool's own figures.
        assert!(
            stderr.contains(&format!(
                "leak report: {} tensor(s) leaked, {}",
                kept.len(),
                memscope_bpf::output::leaks::human_bytes(allocated)
            )),
            "{release}: {stderr}"
        );
        assert!(
            stderr.contains("; 0 driver block(s) no pool owns leaked, 0 bytes;"),
            "{release}: the pool's segments are no leak: {stderr}"
        );
        for k in &kept {
            let line = stderr
                .lines()
                .find(|l| l.contains(&format!("0x{:016x}", k.ptr)))
                .unwrap_or_else(|| panic!("{release}: no line for {k:?}: {stderr}"));
            assert!(
                line.contains(&format!("{} step {:<3} PTA", k.site, k.step))
                    && line.contains(&format!(" {} bytes", k.size)),
                "{release}: {k:?}: {line}"
            );
        }
        let cached = reserved - allocated;
        let pool_line = stderr
            .lines()
            .find(|l| l.contains("PTA pool on device 0 at exit"))
            .unwrap_or_else(|| panic!("{release}: {stderr}"));
        for want in [
            format!(
                "{} in {} live block(s)",
                memscope_bpf::output::leaks::human_bytes(allocated),
                kept.len()
            ),
            format!(
                "{} cached for reuse (not a leak)",
                memscope_bpf::output::leaks::human_bytes(cached)
            ),
            format!(
                "allocated {}, reserved {}",
                memscope_bpf::output::leaks::human_bytes(allocated),
                memscope_bpf::output::leaks::human_bytes(reserved)
            ),
        ] {
            assert!(pool_line.contains(&want), "{release}: {want}: {pool_line}");
        }

        // 2. leaks_*.csv: exactly the kept tensors, with their lines.
        let want: Vec<(u64, u64, u32, String, String)> = kept
            .iter()
            .map(|k| {
                let why = if k.step < STEPS {
                    format!("outlived_step_{STEPS}_and_live_at_exit")
                } else {
                    "live_at_exit".to_owned()
                };
                (k.ptr, k.size, k.step, why, k.site.clone())
            })
            .collect();
        assert_eq!(leak_csv(&proc_dir), want, "{release}");

        // 3. analyze --by-site on the dump: the same leaks in its summary, and every site it
        //    lists is a line of the script that made a tensor.
        let dump = find_files(&proc_dir, "memscope_dump_");
        assert_eq!(dump.len(), 1, "{release}");
        // The default walks the Python stack where a block is made, not where it is freed:
        // every tensor block the script's (main) thread made has frames, the kept ones the
        // script's line among them; none of its frees has any.
        let records = parse_dump_records(&fs::read_to_string(&dump[0]).unwrap());
        let tensor_rows = |event: &str| -> Vec<&Vec<String>> {
            records
                .iter()
                .filter(|r| r[1] == event && r[2] == "PTA" && r[6] == pid.to_string())
                .collect()
        };
        let (mallocs, frees) = (tensor_rows("MALLOC"), tensor_rows("FREE"));
        assert!(!mallocs.is_empty() && !frees.is_empty(), "{release}");
        for r in &mallocs {
            assert!(
                r[10].ends_with('\n') && !r[10].starts_with("[python"),
                "{release}: a MALLOC without frames: {r:?}"
            );
        }
        let script = torch_script().display().to_string();
        for k in &kept {
            let r = mallocs
                .iter()
                .find(|r| r[8] == format!("0x{:016x}", k.ptr))
                .unwrap_or_else(|| panic!("{release}: no MALLOC row for {k:?}"));
            assert!(r[10].contains(&script), "{release}: {k:?}: {r:?}");
        }
        for r in &frees {
            assert_eq!(r[10], "", "{release}: a FREE walked by default: {r:?}");
        }
        let a = Command::new(TRACER)
            .args(["analyze", "--by-site", "--at=peak", "-i"])
            .arg(&dump[0])
            .arg("-o")
            .arg(dir.join("analyzed"))
            .output()
            .unwrap();
        let a_err = String::from_utf8_lossy(&a.stderr);
        let a_out = String::from_utf8_lossy(&a.stdout);
        assert!(a.status.success(), "{release}: {a_err}");
        for k in &kept {
            assert!(
                a_err
                    .lines()
                    .any(|l| l.contains(&format!("0x{:016x}", k.ptr))
                        && l.contains(&format!("{} step {:<3} PTA", k.site, k.step))),
                "{release}: analyze: {k:?}: {a_err}"
            );
        }
        assert!(
            a_err.contains("; 0 driver block(s) no pool owns leaked, 0 bytes;"),
            "{release}: {a_err}"
        );
        let made_at: BTreeSet<String> = log
            .lines()
            .filter(|l| l.starts_with("ALLOC "))
            .map(innermost_line)
            .collect();
        let sites: Vec<&str> = a_out
            .lines()
            .filter(|l| l.contains(" block(s)  "))
            .map(|l| l.split(" block(s)  ").nth(1).unwrap())
            .collect();
        assert!(!sites.is_empty(), "{release}: {a_out}");
        for s in &sites {
            assert!(
                made_at.contains(*s),
                "{release}: site {s} not a script line: {a_out}"
            );
        }

        // 4. The HTML report, as a person sees it.
        let page = dir.join("memscope_report.html");
        let r = Command::new(TRACER)
            .args(["report", "-i"])
            .arg(&out_dir)
            .arg("-o")
            .arg(&*dir)
            .output()
            .unwrap();
        assert!(r.status.success(), "{release}: {r:?}");
        if can_render {
            let dom = dump_dom(&page, &dir.join("chrome-profile"));
            let figure = |name: &str| -> String {
                let at = dom
                    .find(&format!("data-check=\"{name}\""))
                    .unwrap_or_else(|| panic!("{release}: no {name}"));
                let v = at + dom[at..].find('>').unwrap() + 1;
                dom[v..v + dom[v..].find('<').unwrap()].to_owned()
            };
            assert_eq!(figure("tensor-leak-blocks"), kept.len().to_string());
            assert_eq!(
                attr_values(&dom, "tensor-leak-bytes", "data-bytes"),
                [allocated.to_string()]
            );
            assert_eq!(
                figure("leak-blocks"),
                "0",
                "{release}: segments called leaks"
            );
            assert_eq!(
                attr_values(&dom, "leak-bytes", "data-bytes"),
                ["0"],
                "{release}: segments called leaks"
            );
            assert_eq!(
                attr_values(&dom, "cached-bytes", "data-bytes"),
                [cached.to_string()]
            );
            assert_eq!(
                attr_values(&dom, "pool-held", "data-allocated"),
                [allocated.to_string()]
            );
            assert_eq!(
                attr_values(&dom, "pool-held", "data-reserved"),
                [reserved.to_string()]
            );
            let table_at = dom.find("data-check=\"tensor-leaks\"").expect("the table");
            let table = &dom[table_at..table_at + dom[table_at..].find("</table>").unwrap()];
            for k in &kept {
                let row_at = table
                    .find(&format!("0x{:016x}", k.ptr))
                    .unwrap_or_else(|| panic!("{release}: {k:?} not in the table"));
                let row_start = table[..row_at].rfind("<tr>").unwrap();
                let row = &table[row_start..row_at];
                assert!(
                    row.contains(&format!("<summary>{}</summary>", k.site))
                        && row.contains(&format!("<td class=\"n\">{}</td>", k.step)),
                    "{release}: {k:?}: {row}"
                );
            }
        }
    }
}

#[test]
fn a_leak_through_an_allocator_wrapper_is_named_by_its_caller() {
    if !require_root("a_leak_through_an_allocator_wrapper_is_named_by_its_caller") {
        return;
    }
    let _g = serial();
    let dir = scratch("leak-wrapper");
    for (n, drop) in [None, Some("load_,make_")].into_iter().enumerate() {
        let out_dir = dir.join(format!("out{n}"));
        let log_path = dir.join(format!("gt{n}.log"));
        let mut args = vec![
            format!("--output-path={}", out_dir.display()),
            "--call-stack=c".to_owned(),
        ];
        if let Some(d) = drop {
            args.push(format!("--drop-frames={d}"));
        }
        args.extend([
            "--".to_owned(),
            bin("wrapper_leak").display().to_string(),
            "--log".to_owned(),
            log_path.display().to_string(),
        ]);
        let out = run_tracer(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let log = fs::read_to_string(&log_path).unwrap();
        let leaked = log_lines(&log, "LEAK");
        assert_eq!(leaked.len(), 2, "{log}");
        let rows = leak_csv(&out_dir);
        assert_eq!(rows.len(), 2, "{rows:?}");
        for l in &leaked {
            let want = if drop.is_some() {
                l["outer"]
            } else {
                l["site"]
            };
            let row = rows
                .iter()
                .find(|r| r.0 == hex(l["addr"]))
                .unwrap_or_else(|| panic!("{l:?} not in {rows:?}"));
            assert_eq!(row.1, l["size"].parse::<u64>().unwrap());
            // The program logs its source path as compiled (src/...): the site's file ends so.
            assert!(
                row.4.ends_with(want.trim_start_matches("src")),
                "site {} for {want} (drop {drop:?})",
                row.4
            );
            // The terminal summary names it too.
            assert!(
                stderr.lines().any(|s| s.contains(&format!("0x{:016x}", row.0))
                    && s.contains(row.4.as_str())),
                "{stderr}"
            );
        }
    }
}
