//! Headless Chromium for the tests that look at a page as a person would (Debian's
//! `chromium`, installed by `cargo xtask setup`).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// The Chromium that `cargo xtask setup` installs (Debian package `chromium`).
pub fn find_chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find_map(|name| {
            let out = Command::new("which").arg(name).output().ok()?;
            out.status
                .success()
                .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        })
}

pub fn chromium() -> PathBuf {
    find_chromium()
        .expect("no chromium on PATH: `cargo xtask setup` installs it (Debian package chromium)")
}

/// True when Chromium is there. Setup installs it as root; without root and without it the
/// test is SKIPPED loudly (as the BPF tests are), with root its absence is a failure.
pub fn require_chromium(test: &str) -> bool {
    if find_chromium().is_some() {
        return true;
    }
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        panic!("{test}: no chromium on PATH; `cargo xtask setup` installs it (Debian chromium)");
    }
    eprintln!(
        "SKIPPED {test}: needs chromium (Debian package chromium; `cargo xtask setup` as root)"
    );
    println!("SKIPPED {test}: needs chromium");
    false
}

pub fn chrome(html: &Path, extra: &[String], profile: &Path) -> std::process::Output {
    Command::new("timeout")
        .arg("300")
        .arg(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--window-size=1400,2600",
            "--virtual-time-budget=20000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(format!("file://{}", html.display()))
        .output()
        .expect("run chromium")
}

/// The DOM of `html` after its scripts ran (`--dump-dom`); no console error allowed.
pub fn dump_dom(html: &Path, profile: &Path) -> String {
    let out = chrome(
        html,
        &[
            "--dump-dom".to_owned(),
            "--enable-logging=stderr".to_owned(),
        ],
        profile,
    );
    assert!(out.status.success(), "chromium --dump-dom failed: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for line in stderr.lines().filter(|l| l.contains("CONSOLE")) {
        assert!(
            !line.contains(":ERROR:") && !line.to_lowercase().contains("uncaught"),
            "console error in {}: {line}",
            html.display()
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}
