//! End-to-end: shared objects loaded from a plugin directory (launch mode). The first
//! unplanned object of a directory stops the target; its siblings are planned while it runs
//! on, and ELF lookups are remembered on disk per file identity. Whatever the order and
//! whatever the cache holds, every call of a probed object is seen from its first one: the
//! expectations come from the workload's own ground-truth log.

mod common;

use std::{fs, os::unix::fs::PermissionsExt, path::Path, process::Command};

use common::*;

/// A plugin directory: `count` copies of a small object with no probed function
/// (`libplugin.so`), named to sort before or after `libascend_hal.so` (a copy of the simulated
/// HAL) as `before_hal` says.
fn plugin_dir(dir: &Path, count: usize, before_hal: bool) -> Vec<String> {
    fs::create_dir_all(dir).unwrap();
    let plugin = fixtures().join("lib/libplugin.so");
    let prefix = if before_hal {
        "lib_plugin"
    } else {
        "libz_plugin"
    };
    let mut names = Vec::new();
    for i in 0..count {
        let name = format!("{prefix}{i:03}.so");
        fs::copy(&plugin, dir.join(&name)).unwrap();
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
    // own) and first in the queue (planned at the first stop, with the object after it,
    // before the target runs on): both ways, no call is lost.
    for (tag, before_hal) in [("hal-last", true), ("hal-first", false)] {
        let dir = root.join(tag);
        let names = plugin_dir(&dir, 120, before_hal);
        run_workload(&dir, &names[0], &cache, tag);
    }
}

/// Runs `workload_dlopen` under the tracer (the cache at `cache`): it opens `libs`, then
/// calls the fixtures' own HAL; returns the tracer's stderr.
fn load_under_tracer(libs: &[&Path], cache: &Path, out_dir: &Path) -> String {
    let mut c = Command::new(TRACER);
    c.env_remove("SUDO_UID")
        .env("MEMSCOPE_BPF_CACHE", cache)
        .args(["--log-level=debug", "-o", out_dir.to_str().unwrap(), "--"])
        .arg(bin("workload_dlopen"));
    for lib in libs {
        c.arg("--first").arg(lib);
    }
    let out = c
        .arg("--lib-path")
        .arg(fixtures().join("lib/libascend_hal.so"))
        .args(["--allocs", "2"])
        .output()
        .expect("run memscope-bpf");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// How many objects the tracer's last "planned ..." debug line says came from the cache.
fn cache_hits(stderr: &str) -> usize {
    stderr
        .lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once("; ")?;
            rest.split_once(" found in the ELF lookup cache")?
                .0
                .parse()
                .ok()
        })
        .next_back()
        .unwrap_or(0)
}

#[test]
fn a_library_changed_since_it_was_cached_is_read_again() {
    if !require_root("a_library_changed_since_it_was_cached_is_read_again") {
        return;
    }
    let _serial = serial();
    let root = scratch("plugins-cache");
    let cache = root.join("cache");
    let dir = root.join("plugins");
    let names = plugin_dir(&dir, 20, true);
    let hal = dir.join("libascend_hal.so");
    let real_hal = fs::read(&hal).unwrap();
    // An object of the HAL's name with no probed function, seen (and cached) by a first run.
    let stand_in = fs::read(dir.join(&names[1])).unwrap();
    let first = dir.join(&names[0]);
    let cache_it = |tag: &str| {
        let stderr = load_under_tracer(&[&first, &hal], &cache, &root.join(tag));
        assert!(
            stderr.contains(&format!(
                "symbol halMemAlloc not found in {}",
                hal.display()
            )),
            "{stderr}"
        );
    };

    // Rewritten in place (same inode, new contents and times).
    fs::write(&hal, &stand_in).unwrap();
    cache_it("cache-1");
    let lines = fs::read_to_string(cache.join("elf_lookups")).unwrap();
    assert!(lines.lines().count() >= 21, "{lines}");
    let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
    let before = inode(&hal);
    fs::write(&hal, &real_hal).unwrap();
    assert_eq!(inode(&hal), before, "rewritten in place");
    let stderr = run_workload(&dir, &names[0], &cache, "in-place");
    // The siblings came from the cache, so the cache was in use for this directory.
    assert!(cache_hits(&stderr) >= 20, "{stderr}");

    // Replaced by a rename (another inode), after the stand-in was cached again.
    let staged = root.join("staged.so");
    fs::write(&staged, &stand_in).unwrap();
    fs::rename(&staged, &hal).unwrap();
    cache_it("cache-2");
    fs::write(&staged, &real_hal).unwrap();
    fs::rename(&staged, &hal).unwrap();
    let stderr = run_workload(&dir, &names[0], &cache, "renamed");
    assert!(cache_hits(&stderr) >= 20, "{stderr}");
}

#[test]
fn an_unusable_cache_is_a_warning_and_changes_nothing() {
    if !require_root("an_unusable_cache_is_a_warning_and_changes_nothing") {
        return;
    }
    let _serial = serial();
    let root = scratch("plugins-bad-cache");
    let dir = root.join("plugins");
    let names = plugin_dir(&dir, 10, true);
    type Spoil<'a> = &'a dyn Fn(&Path);
    let cases: [(&str, Spoil, &str); 3] = [
        (
            "corrupt",
            &|file| fs::write(file, b"\x00\xffnot a cache\nabc\tdef\n").unwrap(),
            "ignoring 2 unreadable line(s) of the ELF lookup cache",
        ),
        (
            "writable-by-others",
            &|file| {
                fs::write(file, b"").unwrap();
                fs::set_permissions(file, fs::Permissions::from_mode(0o666)).unwrap();
            },
            "not using the ELF lookup cache",
        ),
        (
            "a-directory",
            &|file| fs::create_dir_all(file).unwrap(),
            "not using the ELF lookup cache",
        ),
    ];
    for (tag, spoil, warning) in cases {
        let cache = root.join(format!("cache-{tag}"));
        fs::create_dir_all(&cache).unwrap();
        spoil(&cache.join("elf_lookups"));
        let stderr = run_workload(&dir, &names[0], &cache, tag);
        assert!(stderr.contains(warning), "{tag}: {stderr}");
    }
}
