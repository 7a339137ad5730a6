//! The house in order (issue 18), checked from the source tree alone (no BPF, no root):
//!
//! * the one-way flow of `probe-user/src`: each top-level module (a folder such as `trace/`,
//!   or a root file such as `cli.rs`) may use only the modules its doc names; the table below
//!   mirrors those docs, and a module missing from it fails, so a new folder gets a decision;
//! * no source file over 800 lines anywhere in the workspace, tests excepted (`tests/`
//!   folders, `tests.rs` files).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// What each top-level module of `probe-user/src` may use (`crate::<name>`), as its module
/// doc says. The stages run `trace -> events -> state -> analysis -> output`; `session` wires
/// them; `offline`, `report` and `agent` are further entries; `cli` is the front end, which
/// no stage uses (they take typed settings); `settings`, `log` and `digits` are shared.
/// Nothing flows back up.
const MAY_USE: &[(&str, &[&str])] = &[
    ("trace", &["settings", "log"]),
    ("events", &["trace", "log"]),
    // `analysis`: the online analyzers `state` feeds as each call is applied (they never use
    // `state` back).
    (
        "state",
        &["events", "trace", "analysis", "settings", "digits", "log"],
    ),
    ("analysis", &["events", "settings", "log"]),
    // config.json records the options `cli` hands over as `config_json::Recorded`.
    (
        "output",
        &["state", "analysis", "settings", "digits", "log"],
    ),
    (
        "session",
        &[
            "trace", "events", "state", "analysis", "output", "settings", "log",
        ],
    ),
    (
        "offline",
        &[
            "analysis", "state", "events", "output", "settings", "digits", "log",
        ],
    ),
    (
        "report",
        &["offline", "analysis", "output", "settings", "log"],
    ),
    (
        "agent",
        &[
            "session", "trace", "events", "state", "analysis", "output", "settings", "log",
        ],
    ),
    // The front end: builds the settings and hands subcommands to their modules; nothing
    // uses it back (`the_stage_order_has_no_cycle` follows it like any stage).
    (
        "cli",
        &["agent", "offline", "output", "report", "settings", "log"],
    ),
    ("settings", &[]),
    ("log", &["settings"]),
    ("digits", &[]),
];

/// Source files longer than this are split (issue 18).
const MAX_LINES: usize = 800;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("probe-user sits in the workspace")
        .to_path_buf()
}

fn rust_files(dir: &Path, skip_dir: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if !skip_dir(&p) {
                rust_files(&p, skip_dir, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level modules a source text names through `crate::`: `crate::a::b`, `use
/// crate::a;`, and the first names of each item in `use crate::{a::x, b, c::{..}}`. Comment
/// lines (docs included) are left out: prose may name a module without using it.
fn crate_modules(text: &str) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        // `memscope_crate::` or `foo_crate::` are other paths.
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // Walk the group; a name right after `{` or a top-level `,` is a module.
            let mut depth = 1;
            let mut expect = true;
            let mut i = 0;
            let bytes = group.as_bytes();
            while i < bytes.len() && depth > 0 {
                let c = bytes[i] as char;
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => expect = true,
                    c if c.is_whitespace() => {}
                    _ if expect => {
                        let name = ident(&group[i..]);
                        if !name.is_empty() {
                            i += name.len() - 1;
                            found.insert(name);
                        }
                        expect = false;
                    }
                    _ => {}
                }
                i += 1;
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

#[test]
fn use_paths_are_parsed_from_plain_and_grouped_imports() {
    let text = "use crate::{\n    analysis::leaks::{self, LeakCause},\n    cli::DataFormat,\n    \
                log,\n};\n// crate::agent in a comment\nlet x = crate::output::local_timestamp();\n\
                use crate::trace::{probes::{A, B}, bpf};\nlet y = memscope_crate::nope;";
    let got: Vec<String> = crate_modules(text).into_iter().collect();
    assert_eq!(got, ["analysis", "cli", "log", "output", "trace"]);
}

/// The table itself is one-way: following "may use" from any module, the front end `cli`
/// included, never comes back to it (`log`, `settings` and `digits` use no stage).
#[test]
fn the_stage_order_has_no_cycle() {
    let table: BTreeMap<&str, &[&str]> = MAY_USE.iter().copied().collect();
    fn reaches(
        table: &BTreeMap<&str, &[&str]>,
        from: &str,
        to: &str,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for &next in table[from] {
            if next == to {
                return true;
            }
            if seen.insert(next.to_string()) && reaches(table, next, to, seen) {
                return true;
            }
        }
        false
    }
    for &(module, _) in MAY_USE {
        assert!(
            !reaches(&table, module, module, &mut BTreeSet::new()),
            "{module} reaches itself through MAY_USE: the stages must stay one-way"
        );
    }
}

/// The front end configures the stages; no stage reads the command line back.
#[test]
fn nothing_uses_the_front_end() {
    let users: Vec<&str> = MAY_USE
        .iter()
        .filter(|(_, uses)| uses.contains(&"cli"))
        .map(|(m, _)| *m)
        .collect();
    assert!(
        users.is_empty(),
        "{users:?} may use cli: hand them typed settings instead"
    );
}

#[test]
fn nothing_flows_back_up() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed: BTreeMap<&str, &[&str]> = MAY_USE.iter().copied().collect();
    let mut files = Vec::new();
    rust_files(&src, &|_| false, &mut files);
    let mut uses: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    let mut modules = BTreeSet::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        // The crate root and the binary wire everything together.
        if module == "lib" || module == "main" {
            continue;
        }
        modules.insert(module.clone());
        let text = fs::read_to_string(f).unwrap();
        for used in crate_modules(&text) {
            if used != module {
                uses.entry(module.clone())
                    .or_default()
                    .entry(used)
                    .or_default()
                    .insert(rel.display().to_string());
            }
        }
    }
    let unknown: Vec<_> = modules
        .iter()
        .filter(|m| !allowed.contains_key(m.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "top-level modules missing from MAY_USE (say what they may use, in their doc and here): {unknown:?}"
    );
    // The walk found the real wiring (a parser that finds nothing passes vacuously).
    assert!(
        uses.get("session")
            .is_some_and(|u| u.contains_key("state") && u.contains_key("trace")),
        "session's uses of state and trace not found: {uses:?}"
    );
    let mut wrong = Vec::new();
    for (module, used) in &uses {
        for (target, files) in used {
            if !allowed[module.as_str()].contains(&target.as_str()) {
                wrong.push(format!("{module} uses {target} in {files:?}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "uses that flow back up or across (see the module docs):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_source_file_over_800_lines_outside_tests() {
    let root = workspace_root();
    let skip = |p: &Path| {
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        name == "target" || name == "tests" || name.starts_with('.')
    };
    let mut files = Vec::new();
    rust_files(&root, &skip, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("probe-user/src/lib.rs")),
        "the walk missed probe-user/src/lib.rs"
    );
    let mut long: Vec<String> = files
        .iter()
        .filter(|f| !f.ends_with("tests.rs"))
        .filter_map(|f| {
            let n = fs::read_to_string(f).ok()?.lines().count();
            (n > MAX_LINES)
                .then(|| format!("{} ({n} lines)", f.strip_prefix(&root).unwrap().display()))
        })
        .collect();
    long.sort();
    assert!(
        long.is_empty(),
        "source files over {MAX_LINES} lines (split them by concern):\n{}",
        long.join("\n")
    );
}
