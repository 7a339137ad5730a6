//! msMemScope's own dumps, written the way msMemScope writes them (issue 27; seen by running
//! msMemScope, built from its public source, beside memscope-bpf): at exit it writes a FREE
//! row with `shadow:true` for every block still live, and its CSV writer wraps a name in
//! quotes once more for each device file it copies the name to. `analyze` and `--compare`
//! read both as msMemScope meant them: the shadow rows say what was live, and the name is
//! the name.

mod common;

use std::{fs, path::Path};

use common::*;

/// A HAL MALLOC row as msMemScope's CSV writer prints it.
fn malloc(id: u64, ts: u64, dev: u32, alloc_id: u64, addr: u64, size: u64) -> String {
    format!(
        "{id},MALLOC,HAL,N/A,{ts},4242,4242,{dev},0x{addr:016x},\"{{allocation_id:{alloc_id},addr:0x{addr:016x},size:{size},used:{size},page_type:normal,alloc_type:alloc}}\",,"
    )
}

fn free(id: u64, ts: u64, dev: u32, alloc_id: u64, addr: u64, size: u64) -> String {
    format!(
        "{id},FREE,HAL,N/A,{ts},4242,4242,{dev},0x{addr:016x},\"{{allocation_id:{alloc_id},addr:0x{addr:016x},size:{size},used:0}}\",,"
    )
}

/// The FREE msMemScope appends at process exit for a block still live (`CLEAN_UP/PROC_EXIT`:
/// a shadow event, no stats).
fn shadow_free(id: u64, ts: u64, dev: u32, alloc_id: u64, addr: u64, size: u64) -> String {
    format!(
        "{id},FREE,HAL,N/A,{ts},4242,4242,{dev},0x{addr:016x},\"{{allocation_id:{alloc_id},addr:0x{addr:016x},size:{size},shadow:true}}\",,"
    )
}

/// The rows with no device (init, the step range) go into every device file; msMemScope's
/// writer wraps the name in quotes again each time it writes it, so the `n`th file it reaches
/// (from 1) has `n` pairs.
fn device_less(n: usize) -> Vec<String> {
    let q = "\"".repeat(n);
    vec![
        "1,SYSTEM,ACL_INIT,N/A,1000,4242,4242,N/A,N/A,,,".to_owned(),
        format!("2,MSTX,Range_start,{q}step start{q},1500,4242,4242,N/A,N/A,,,"),
        format!("3,MSTX,Range_end,{q}Range end from id 1{q},9000,4242,4242,N/A,N/A,,,"),
    ]
}

fn write_dump(path: &Path, rows: &[String]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut text = String::from(HEADER);
    text.push('\n');
    for r in rows {
        text.push_str(r);
        text.push('\n');
    }
    fs::write(path, text).unwrap();
}

/// A run of msMemScope on a program that leaked three of its five HAL blocks (two on device 0,
/// one on device 1). Rows are in msMemScope's order: a block's rows when it is freed, the
/// live ones at exit each followed by its shadow FREE. Returns the two device files.
fn msmemscope_run(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    const A: u64 = 0x1240_0000_0000;
    let mut dev0 = device_less(1);
    dev0.extend([
        malloc(10, 2000, 0, 1, A, 2 << 20),
        free(11, 3000, 0, 1, A, 2 << 20),
        malloc(12, 2500, 0, 2, A + 0x20_0000, 4096),
        malloc(13, 2600, 0, 3, A + 0x40_0000, 1 << 20),
        // At exit: still live.
        shadow_free(14, 10_000, 0, 2, A + 0x20_0000, 4096),
        shadow_free(15, 10_000, 0, 3, A + 0x40_0000, 1 << 20),
    ]);
    let mut dev1 = device_less(2);
    dev1.extend([
        malloc(20, 2100, 1, 4, A + 0x1000_0000, 8192),
        free(21, 3100, 1, 4, A + 0x1000_0000, 8192),
        malloc(22, 2200, 1, 5, A + 0x2000_0000, 65536),
        shadow_free(23, 10_000, 1, 5, A + 0x2000_0000, 65536),
    ]);
    let run = dir.join("msmemscope_4242_20260101000000_ascend");
    let p0 = run.join("device_0/dump/memscope_dump_20260101000000.csv");
    let p1 = run.join("device_1/dump/memscope_dump_20260101000000.csv");
    write_dump(&p0, &dev0);
    write_dump(&p1, &dev1);
    (p0, p1)
}

fn analyze(dump: &Path, out: &Path) -> String {
    let o = run_tracer(&[
        "analyze",
        &format!("--input={}", dump.display()),
        "-o",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(
        o.status.code(),
        Some(0),
        "analyze {}: {err}",
        dump.display()
    );
    err
}

/// Python's csv module reads the twice-quoted file without complaint (msMemScope's own tools
/// are Python); we read it too, and its name as the step marker msMemScope meant.
#[test]
fn shadow_frees_are_live_blocks_and_twice_quoted_names_are_names() {
    let dir = scratch("msmemscope_quirks");
    let (p0, p1) = msmemscope_run(&dir);

    let err = analyze(&p0, &dir.join("out0"));
    assert!(
        err.contains("2 driver block(s) no pool owns leaked, 1.00 MiB (1052672 bytes)"),
        "the two blocks live at exit on device 0: {err}"
    );
    assert!(err.contains("0x0000124000200000"), "{err}");
    assert!(err.contains("0x0000124000400000"), "{err}");

    let err = analyze(&p1, &dir.join("out1"));
    assert!(
        err.contains("1 driver block(s) no pool owns leaked, 64.00 KiB (65536 bytes)"),
        "the block live at exit on device 1: {err}"
    );
    // Allocated inside the first "step start" range: the name was read as the marker.
    let leaks = find_files(&dir.join("out1"), "leaks_");
    let text = fs::read_to_string(&leaks[0]).unwrap();
    assert_eq!(
        text.lines().nth(1).map(|l| l.split(',').nth(6)),
        Some(Some("1")),
        "step of the leaked block: {text}"
    );

    // msMemScope's step compare of its own two device files.
    let pair = format!("{},{}", p0.display(), p1.display());
    let o = run_tracer(&[
        "--compare",
        &format!("--input={pair}"),
        "-o",
        dir.join("cmp").to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
