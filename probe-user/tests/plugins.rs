//! End-to-end: shared objects loaded from a plugin directory (launch mode). The first
//! unplanned object of a directory stops the target; its siblings are planned while it runs
//! on, and ELF lookups are remembered on disk per file identity. Whatever the order and
//! whatever the cache holds, every call of a probed object is seen from its first one: the
//! expectations come from the workload's own ground-truth log.

mod common;

use std::{fs, path::Path, process::Command};

use common::*;

/// A plugin directory: `count` small objects with no probed function, named to sort before
/// or after `libascend_hal.so` (a copy of the simulated HAL) as `before_hal` says.
fn plugin_dir(dir: &Path, count: usize, before_hal: bool) -> Vec<String> {
    fs::create_dir_all(dir).unwrap();
    let dsos = fixtures().join("lib/bench/dso");
    let prefix = if before_hal {
        "lib_plugin"
    } else {
        "libz_plugin"
    };
    let mut names = Vec::new();
    for i in 0..count {
        let name = format!("{prefix}{i:03}.so");
        fs::copy(dsos.join(format!("libdso_{i:03}.so")), dir.join(&name)).unwrap();
        names.push(name);
    }
    fs::copy(
        fixtures().join("lib/libascend_hal.so"),
        dir.join("libascend_hal.so"),
    )
    .unwrap();
    names
}

/// Runs `workload_dlopen` under the tracer: it opens `first` (an unplanned plugin: a stop),
/// then the HAL of the same directory, and calls it; returns the tracer's stderr.
fn run_workload(dir: &Path, first: &str, cache: &Path, tag: &str) -> String {
    let log = dir.join(format!("gt-{tag}.log"));
    let out_dir = dir.join(format!("out-{tag}"));
    let out = Command::new(TRACER)
        .env_remove("SUDO_UID")
        .env("MEMSCOPE_BPF_CACHE", cache)
        .args(["--log-level=debug", "-o", out_dir.to_str().unwrap(), "--"])
        .arg(bin("workload_dlopen"))
        .arg("--first")
        .arg(dir.join(first))
        .arg("--lib-path")
        .arg(dir.join("libascend_hal.so"))
        .args(["--allocs", "4", "--log", log.to_str().unwrap()])
        .output()
        .expect("run memscope-bpf");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    // The scenario: the first plugin was unplanned, so the target stopped there.
    let stop = format!("stopped at open of {}", dir.join(first).display());
    assert!(stderr.contains(&stop), "{stderr}");
    let gt = parse_log(&log);
    assert_eq!(gt.of("MALLOC").len(), 4);
    let rows = rows_of(&out_dir, gt.pid);
    assert_eq!(
        memory_rows(&rows, "MALLOC"),
        gt_rows(&gt, &["MALLOC"]),
        "{stderr}"
    );
    assert_eq!(
        memory_rows(&rows, "FREE"),
        gt_rows(&gt, &["FREE"]),
        "{stderr}"
    );
    stderr
}

#[test]
fn a_plugin_opened_while_its_directory_is_being_planned_is_traced_from_its_first_call() {
    if !require_root(
        "a_plugin_opened_while_its_directory_is_being_planned_is_traced_from_its_first_call",
    ) {
        return;
    }
    let _serial = serial();
    let root = scratch("plugins-order");
    let cache = root.join("cache");
    // The HAL last in the queue (the target opens it long before its turn: a stop of its
    // own) and first in the queue (planned in the background, likely before the target gets
    // to it): both ways, no call is lost.
    for (tag, before_hal) in [("hal-last", true), ("hal-first", false)] {
        let dir = root.join(tag);
        let names = plugin_dir(&dir, 120, before_hal);
        run_workload(&dir, &names[0], &cache, tag);
    }
}
