//! Offline work on saved dumps: `--compare`, `analyze`, the dump readers and the db writer.
//! No root needed: every dump is written by hand (or through the library's writer) here.

mod common;

use std::{
    fs,
    io::{BufRead, BufReader},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{TRACER, find_files, run_tracer, scratch};
use memscope_bpf::{
    offline::reader::{self, DumpKind, DumpRow},
    output::leaks::LEAKS_HEADER,
    output::{DeviceKey, ProcessOutput, Row, csv::CSV_HEADER, csv::quote_text},
    settings::DataFormat,
    state::module_label,
};
use rusqlite::Connection;

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, body).unwrap();
    p
}

fn csv(rows: &[&str]) -> String {
    let mut s = format!("{CSV_HEADER}\n");
    for r in rows {
        s.push_str(r);
        s.push('\n');
    }
    s
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The only file under `dir` whose name starts with `prefix`.
fn only_file(dir: &Path, prefix: &str) -> PathBuf {
    let f = find_files(dir, prefix);
    assert_eq!(f.len(), 1, "one {prefix}* under {}: {f:?}", dir.display());
    f.into_iter().next().unwrap()
}

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().permissions().mode() & 0o777
}

// ---------------------------------------------------------------------------------------------
// Readers
// ---------------------------------------------------------------------------------------------

/// msMemScope's 2025-04 layout: `acl init`, decimal pointers, `host` device, `owner:`/`MID:`
/// Attr keys, negative FREE sizes; plus quoted C stacks that span several lines and contain
/// commas and doubled quotes.
const OLD_LAYOUT: &str = "\
ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,Ptr,Attr,Call Stack(Python),Call Stack(C)\r
1,SYSTEM,acl init,N/A,1746006014162153,2523740,2523740,N/A,N/A,,,\r
2,MALLOC,HAL,N/A,1746006014361575,2523740,2523740,0,20615843020800,\"{addr:20615843020800,size:16384,owner:,MID:7}\",,\"/lib/libascend_hal.so(halMemAlloc+0x1c) [0x7f00]
/usr/lib/libacl.so(aclrtMalloc+0x44, \"\"x\"\") [0x7f10]
\"\r
3,MALLOC,HAL,N/A,1746006014362653,2523740,2523740,host,20617990504448,\"{addr:20617990504448,size:6356992,owner:,MID:7}\",\"train.py(10): main
\",\r
4,MSTX,Mark,\"[mstx]: mstxMarkA :------training start----- \",1746006024486827,2523740,2523740,0,N/A,,,\r
5,FREE,HAL,N/A,1746006024578981,2523740,2523740,0,20615843020800,\"{addr:20615843020800,size:-16384,owner:,MID:7}\",,\r
6,MALLOC,PTA,N/A,1746006024579117,2523740,2523740,0,20616939214848,\"{addr:20616939214848,size:1024,owner:,total:2097152,used:3597824}\",,\r
";

#[test]
fn reads_old_msmemscope_layout_with_multiline_stacks() {
    let dir = scratch("off-old");
    let p = write(&dir, "memscope_dump_20250428113810.csv", OLD_LAYOUT);
    let mut locs = Vec::new();
    let mut rows = Vec::new();
    let kind = reader::for_each_row(&p, |loc, r| {
        locs.push(loc.n);
        rows.push(r);
        Ok(())
    })
    .unwrap();
    assert_eq!(kind, DumpKind::Csv);
    assert_eq!(locs, [2, 3, 6, 8, 9, 10], "first line of each record");
    assert_eq!(rows.len(), 6);
    assert_eq!(rows[0].event_type, "ACL_INIT");
    assert_eq!(rows[0].device, DeviceKey::NotApplicable);
    assert_eq!(rows[1].ptr, Some(20615843020800));
    assert_eq!(rows[1].attr("MID"), Some("7"));
    assert_eq!(rows[1].attr("owner"), Some(""));
    assert_eq!(
        rows[1].c_stack,
        "/lib/libascend_hal.so(halMemAlloc+0x1c) [0x7f00]\n\
         /usr/lib/libacl.so(aclrtMalloc+0x44, \"x\") [0x7f10]\n"
    );
    assert_eq!(rows[2].device, DeviceKey::Cpu);
    assert_eq!(rows[2].python_stack, "train.py(10): main\n");
    assert_eq!(rows[2].c_stack, "");
    assert_eq!(
        rows[3].name,
        "[mstx]: mstxMarkA :------training start----- "
    );
    assert_eq!(rows[4].attr("size"), Some("-16384"));
    assert_eq!(rows[5].attr("used"), Some("3597824"));
    fs::remove_dir_all(&dir).unwrap();
}

fn sample_rows() -> Vec<Row> {
    let r = |event: &'static str,
             event_type: &'static str,
             name: String,
             ts_ns: u64,
             device: DeviceKey,
             ptr: Option<u64>,
             attr: &str| Row {
        event,
        event_type,
        name: name.into(),
        ts_ns,
        pid: 4242,
        tid: 4243,
        device,
        ptr,
        size: None,
        attr: attr.to_string(),
        c_stack: None,
        py_stack: None,
    };
    vec![
        r(
            "SYSTEM",
            "ACL_INIT",
            "N/A".into(),
            1_700_000_000_000_000_001,
            DeviceKey::NotApplicable,
            None,
            "",
        ),
        r(
            "MALLOC",
            "HAL",
            "N/A".into(),
            1_700_000_000_000_000_002,
            DeviceKey::Npu(0),
            Some(0x1240_0000_0000),
            "allocation_id:1,addr:0x0000124000000000,size:2097152,used:2097152,page_type:huge,alloc_type:alloc",
        ),
        r(
            "MSTX",
            "Range_start",
            quote_text("step start"),
            1_700_000_000_000_000_003,
            DeviceKey::Npu(0),
            None,
            "",
        ),
        r(
            "MSTX",
            "Mark",
            quote_text("say \"hi\", twice"),
            1_700_000_000_000_000_004,
            DeviceKey::Npu(1),
            None,
            "",
        ),
        r(
            "MALLOC",
            "HOST",
            "N/A".into(),
            1_700_000_000_000_000_005,
            DeviceKey::Cpu,
            Some(0x7f00_0000_1000),
            "allocation_id:2,addr:0x00007f0000001000,size:64,pinned:true,used:64",
        ),
        r(
            "FREE",
            "HAL",
            "N/A".into(),
            1_700_000_000_000_000_006,
            DeviceKey::Npu(0),
            Some(0x1240_0000_0000),
            "allocation_id:1,addr:0x0000124000000000,size:2097152,used:0",
        ),
        r(
            "SYSTEM",
            "ACL_FINI",
            "N/A".into(),
            1_700_000_000_000_000_007,
            DeviceKey::NotApplicable,
            None,
            "",
        ),
    ]
}

fn write_through(dir: &Path, format: DataFormat) -> Vec<PathBuf> {
    let mut out = ProcessOutput::with_format(dir, 4242, "{}".into(), format);
    for row in sample_rows() {
        out.write(row).unwrap();
    }
    out.finish().unwrap();
    let mut files = out.dump_files();
    files.sort();
    files
}

#[test]
fn db_written_by_the_writer_holds_the_csv_rows() {
    let dir = scratch("off-db-eq");
    let csv_files = write_through(&dir.join("csv"), DataFormat::Csv);
    let db_files = write_through(&dir.join("db"), DataFormat::Db);
    assert_eq!(csv_files.len(), 3, "device 0, 1 and cpu: {csv_files:?}");
    assert_eq!(db_files.len(), 3);
    // One db stamp per process.
    let stamps: Vec<String> = db_files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(
        stamps.iter().all(|s| s == &stamps[0] && s.ends_with(".db")),
        "{stamps:?}"
    );
    for (c, d) in csv_files.iter().zip(&db_files) {
        assert_eq!(
            c.parent().unwrap().parent().unwrap().file_name(),
            d.parent().unwrap().parent().unwrap().file_name()
        );
        assert_eq!(mode(d), 0o640);
        let mut db_rows = Vec::new();
        let kind = reader::for_each_row(d, |_, r| {
            db_rows.push(r);
            Ok(())
        })
        .unwrap();
        assert_eq!(kind, DumpKind::Db);
        let csv_rows = reader::read_rows(c).unwrap();
        assert!(csv_rows.len() >= 3, "{c:?}");
        assert_eq!(csv_rows, db_rows, "{} vs {}", c.display(), d.display());
    }
    // The mark with quotes and a comma survives both ways.
    let dev1 = reader::read_rows(&db_files[1]).unwrap();
    assert!(
        dev1.iter().any(|r| r.name == "say \"hi\", twice"),
        "{dev1:?}"
    );
    // What is stored: msMemScope's column types and values.
    let conn = Connection::open(&db_files[0]).unwrap();
    let (id, name, attr, pid, dev): (i64, String, String, i64, String) = conn
        .query_row(
            "SELECT \"ID\", \"Name\", \"Attr\", \"Process Id\", \"Device Id\" FROM memscope_dump \
             WHERE \"Event\" = 'MSTX'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .unwrap();
    assert_eq!(
        (id, name.as_str(), attr.as_str(), pid, dev.as_str()),
        (2, "\"step start\"", "{}", 4242, "0")
    );
    let attr: String = conn
        .query_row(
            "SELECT \"Attr\" FROM memscope_dump WHERE \"ID\" = 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        attr,
        r#"{"allocation_id":"1","addr":"0x0000124000000000","size":"2097152","used":"2097152","page_type":"huge","alloc_type":"alloc"}"#
    );
    fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Compare
// ---------------------------------------------------------------------------------------------

/// Base run, device 0. Memory rows of a block are written together (msMemScope's order), so
/// the file is not in time order; the comparison sorts by timestamp.
fn base_csv() -> String {
    csv(&[
        "0,SYSTEM,START_TRACE,N/A,50,10,10,N/A,N/A,,,",
        "1,OP_LAUNCH,ATEN_START,aten.add,100,10,10,0,N/A,,,",
        "3,OP_LAUNCH,ATEN_END,aten.add,120,10,10,0,N/A,,,",
        "2,MALLOC,PTA,N/A,110,10,10,0,0x0000000000001000,\"{allocation_id:1,addr:0x0000000000001000,size:512,used:512,total:2097152}\",,",
        "4,FREE,PTA,N/A,130,10,10,0,0x0000000000001000,\"{allocation_id:1,addr:0x0000000000001000,size:512,used:0,total:2097152}\",,",
        "20,MALLOC,HAL,N/A,135,10,10,0,0x0000000000009000,\"{allocation_id:9,addr:0x0000000000009000,size:99999,used:99999,page_type:normal,alloc_type:alloc}\",,",
        "5,OP_LAUNCH,ATEN_END,aten.mul,140,10,10,0,N/A,,,",
        "21,KERNEL_LAUNCH,KERNEL_LAUNCH,k1,141,10,10,0,N/A,\"{streamId:1,taskId:1}\",,",
        "6,MALLOC,PTA,N/A,150,10,10,0,0x0000000000002000,\"{allocation_id:2,addr:0x0000000000002000,size:1024,used:1024,total:2097152}\",,",
        "22,KERNEL_LAUNCH,KERNEL_LAUNCH,k2,151,10,10,0,N/A,\"{streamId:1,taskId:2}\",,",
        "7,OP_LAUNCH,ATEN_END,aten.sum,160,10,10,0,N/A,,,",
        "8,MSTX,Mark,\"done\",170,10,10,0,N/A,,,",
        "9,MALLOC,PTA,N/A,180,10,10,cpu,0x0000000000003000,\"{allocation_id:3,addr:0x0000000000003000,size:5,used:5,total:5}\",,",
    ])
}

/// Compare run: aten.relu is new, aten.mul allocates more, aten.sum is gone, device 1 is new.
fn compare_csv() -> String {
    csv(&[
        "1,OP_LAUNCH,ATEN_END,aten.add,1000,20,20,0,N/A,,,",
        "2,FREE,PTA,N/A,1010,20,20,0,0x0000000000001000,\"{allocation_id:1,addr:0x0000000000001000,size:512,used:0,total:2097152}\",,",
        "3,OP_LAUNCH,ATEN_END,aten.relu,1020,20,20,0,N/A,,,",
        "4,MALLOC,PTA,N/A,1030,20,20,0,0x0000000000002000,\"{allocation_id:2,addr:0x0000000000002000,size:2048,used:2048,total:2097152}\",,",
        "5,OP_LAUNCH,ATEN_END,aten.mul,1040,20,20,0,N/A,,,",
        "21,KERNEL_LAUNCH,KERNEL_LAUNCH,k1,1041,20,20,0,N/A,,,",
        "6,MALLOC,PTA,N/A,1050,20,20,0,0x0000000000003000,\"{allocation_id:3,addr:0x0000000000003000,size:4096,used:6144,total:2097152}\",,",
        "22,KERNEL_LAUNCH,KERNEL_LAUNCH,k3,1051,20,20,0,N/A,,,",
        "23,MALLOC,PTA,N/A,1052,20,20,0,0x0000000000004000,\"{allocation_id:4,addr:0x0000000000004000,size:8,used:6152,total:2097152}\",,",
        "7,OP_LAUNCH,ATEN_END,aten.add,1060,20,21,1,N/A,,,",
        "8,MALLOC,PTA,N/A,1070,20,21,1,0x0000000000005000,\"{allocation_id:5,addr:0x0000000000005000,size:7,used:7,total:2097152}\",,",
        "9,OP_LAUNCH,ATEN_END,aten.never,1080,20,21,N/A,N/A,,,",
    ])
}

fn run_compare(dir: &Path, base: &Path, cmp: &Path, extra: &[&str]) -> (PathBuf, Vec<String>) {
    let tag: String = extra
        .join("")
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    let out_dir = dir.join(format!("out{tag}"));
    let mut args = vec![
        "--compare".to_string(),
        format!("--input-path={},{}", base.display(), cmp.display()),
        "-o".to_string(),
        out_dir.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_tracer(&refs);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let f = only_file(&out_dir, "memory_compare_");
    let text = fs::read_to_string(&f).unwrap();
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    check_compare_summary(&String::from_utf8_lossy(&out.stdout), &lines);
    (f, lines)
}

/// The terminal summary of `--compare`, checked against the file it summarises: the counts
/// from its N/A columns, then the (at most 10) lines with the largest |diff|, largest first
/// and in file order among equals, each with its line number and exact diff.
fn check_compare_summary(stdout: &str, lines: &[String]) {
    let entries: Vec<Vec<&str>> = lines[2..].iter().map(|l| l.split(',').collect()).collect();
    let na = |col: usize| entries.iter().filter(|e| e[col] == "N/A").count();
    let (only_base, only_compare) = (na(4), na(3));
    let both = entries.len() - only_base - only_compare;
    let first = format!(
        "{} entries: {both} in both runs, {only_base} only in base, {only_compare} only in compare",
        entries.len()
    );
    let out: Vec<&str> = stdout.lines().collect();
    assert_eq!(out.first().copied(), Some(first.as_str()), "{stdout}");
    let mut expected: Vec<(usize, i64)> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| (i + 3, e[5].parse::<i64>().unwrap()))
        .filter(|(_, d)| *d != 0)
        .collect();
    expected.sort_by_key(|(line, d)| (std::cmp::Reverse(d.unsigned_abs()), *line));
    expected.truncate(10);
    let got: Vec<(usize, i64)> = out
        .iter()
        .filter_map(|l| l.strip_prefix("  line "))
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let at = words.iter().position(|w| *w == "bytes").unwrap();
            (words[0].parse().unwrap(), words[at - 1].parse().unwrap())
        })
        .collect();
    assert_eq!(got, expected, "{stdout}");
}

#[test]
fn compare_writes_every_line_exactly() {
    let dir = scratch("off-compare");
    let base = write(&dir, "base.csv", &base_csv());
    let cmp = write(&dir, "cmp.csv", &compare_csv());
    let out_dir = dir.join("out");
    let (file, lines) = run_compare(&dir, &base, &cmp, &[]);
    // (The summary on the terminal is checked against these lines in run_compare.)
    assert_eq!(
        lines,
        [
            ",,,Base,Compare",
            "Event,Name,Device Id,Allocated Memory(byte),Allocated Memory(byte),Diff Memory(byte)",
            "OP_LAUNCH,aten.add,0,512,512,0",
            "OP_LAUNCH,aten.relu,0,N/A,2048,2048",
            "OP_LAUNCH,aten.mul,0,1024,4096,3072",
            "OP_LAUNCH,aten.sum,0,0,N/A,0",
            "OP_LAUNCH,aten.add,1,N/A,7,7",
        ]
    );
    // <out>/msmemscope_<our pid>_<ts>_ascend/compare/memory_compare_<ts>.csv, 0750/0640.
    let compare_dir = file.parent().unwrap();
    assert_eq!(compare_dir.file_name().unwrap(), "compare");
    let proc_dir = compare_dir.parent().unwrap();
    let name = proc_dir.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("msmemscope_") && name.ends_with("_ascend"),
        "{name}"
    );
    assert_eq!(proc_dir.parent().unwrap(), out_dir);
    assert_eq!(mode(compare_dir), 0o750);
    assert_eq!(mode(proc_dir), 0o750);
    assert_eq!(mode(&file), 0o640);
    assert!(proc_dir.join("config.json").exists());
    let cfg = fs::read_to_string(proc_dir.join("config.json")).unwrap();
    assert!(cfg.contains("\"enableCompare\": true"), "{cfg}");

    // Kernel level, with the base given as an msMemScope-style db (JSON Attr, quoted names).
    let db = dir.join("base.db");
    csv_to_msmemscope_db(&base, &db);
    let (_, lines) = run_compare(&dir, &db, &cmp, &["--level=kernel"]);
    assert_eq!(
        lines[2..],
        [
            "KERNEL_LAUNCH,k1,0,1024,4096,3072",
            "KERNEL_LAUNCH,k2,0,0,N/A,0",
            "KERNEL_LAUNCH,k3,0,N/A,8,8",
        ]
    );
    // Both levels: one sequence of both kinds in time order.
    let (_, lines) = run_compare(&dir, &base, &cmp, &["--level=op,kernel"]);
    assert_eq!(lines.len(), 2 + 8, "{lines:?}");
    fs::remove_dir_all(&dir).unwrap();
}

/// Writes the rows of a dump CSV into a db the way msMemScope does.
fn csv_to_msmemscope_db(csv: &Path, db: &Path) {
    let rows = reader::read_rows(csv).unwrap();
    let conn = Connection::open(db).unwrap();
    conn.execute_batch(&format!(
        "PRAGMA journal_mode=WAL; {};",
        memscope_bpf::output::db::CREATE_TABLE
    ))
    .unwrap();
    for r in rows {
        let name = if r.event == "MSTX" {
            format!("\"{}\"", r.name)
        } else {
            r.name.clone()
        };
        conn.execute(
            "INSERT INTO memscope_dump VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12)",
            rusqlite::params![
                r.id as i64,
                r.event,
                r.event_type,
                name,
                r.ts_ns as i64,
                r.pid as i64,
                r.tid as i64,
                r.device.to_string(),
                r.ptr.map_or("N/A".to_string(), |p| format!("0x{p:016x}")),
                memscope_bpf::output::attr::to_json(&r.attr),
                r.python_stack,
                r.c_stack,
            ],
        )
        .unwrap();
    }
}

#[test]
fn compare_of_identical_runs_has_zero_diffs() {
    let dir = scratch("off-compare-same");
    let base = write(&dir, "a.csv", &base_csv());
    let same = write(&dir, "b.csv", &base_csv());
    let (_, lines) = run_compare(&dir, &base, &same, &[]);
    assert_eq!(
        lines[2..],
        [
            "OP_LAUNCH,aten.add,0,512,512,0",
            "OP_LAUNCH,aten.mul,0,1024,1024,0",
            "OP_LAUNCH,aten.sum,0,0,0,0",
        ]
    );
    fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Analyze
// ---------------------------------------------------------------------------------------------

#[test]
fn analyze_reports_hal_blocks_never_freed() {
    let dir = scratch("off-analyze");
    let dump = write(
        &dir,
        "memscope_dump_1.csv",
        &csv(&[
            "0,SYSTEM,ACL_INIT,N/A,1,77,77,N/A,N/A,,,",
            "1,MSTX,Range_start,\"step start\",5,77,77,0,N/A,,,",
            "2,MALLOC,HAL,N/A,10,77,78,0,0x0000124000000000,\"{allocation_id:1,addr:0x0000124000000000,size:2097152,used:2097152,page_type:normal,alloc_type:alloc}\",,",
            "3,MALLOC,HAL,N/A,11,77,78,0,0x0000124000200000,\"{allocation_id:2,addr:0x0000124000200000,size:4096,used:2101248,page_type:normal,alloc_type:alloc}\",,",
            "4,FREE,HAL,N/A,12,77,78,0,0x0000124000000000,\"{allocation_id:1,addr:0x0000124000000000,size:2097152,used:4096}\",,",
            "5,MALLOC,HAL,N/A,13,77,79,1,0x0000134000000000,\"{allocation_id:3,addr:0x0000134000000000,size:1048576,used:1048576,page_type:normal,alloc_type:alloc}\",,",
            "6,MALLOC,PTA,N/A,14,77,79,1,0x0000134000000000,\"{allocation_id:4,addr:0x0000134000000000,size:512,used:512,total:1048576}\",,",
        ]),
    );
    let out_dir = dir.join("out");
    let out = run_tracer(&[
        "analyze",
        &format!("--input={}", dump.display()),
        "-o",
        out_dir.to_str().unwrap(),
    ]);
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("7 row(s); 3 HAL allocation(s), 1 free(s)"),
        "{err}"
    );
    // The 1 MiB block on device 1 holds a PTA block: the pool's segment, not a leak; the PTA
    // block itself is a tensor live at exit; the 4 KiB block on device 0 is leaked driver memory.
    assert!(
        err.contains(
            "leak report: 1 tensor(s) leaked, 512 bytes; 1 driver block(s) no pool owns leaked, \
             4.00 KiB (4096 bytes); 1023.50 KiB (1048064 bytes) cached by framework pools"
        ),
        "{err}"
    );
    assert!(
        err.contains(
            "PTA pool on device 1 at exit: 1 segment(s) of driver memory, 1.00 MiB (1048576 \
             bytes); 512 bytes in 1 live block(s); 1023.50 KiB (1048064 bytes) cached for reuse"
        ),
        "{err}"
    );
    assert!(err.contains("0x0000124000200000"), "{err}");
    let proc_dir = find_files(&out_dir, "leaks_")[0]
        .ancestors()
        .nth(3)
        .unwrap()
        .to_path_buf();
    assert!(
        proc_dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("msmemscope_77_"),
        "{}",
        proc_dir.display()
    );
    let d0 = fs::read_to_string(only_file(&proc_dir.join("device_0"), "leaks_")).unwrap();
    assert_eq!(
        d0.lines().collect::<Vec<_>>(),
        [
            LEAKS_HEADER,
            "77,78,0,HAL,0x0000124000200000,4096,1,2,UNKNOWN,11,live_at_exit,\
             [no call stack: trace with --call-stack=c]",
        ]
    );
    let d1 = fs::read_to_string(only_file(&proc_dir.join("device_1"), "leaks_")).unwrap();
    assert_eq!(
        d1.lines().collect::<Vec<_>>(),
        [
            LEAKS_HEADER,
            "77,79,1,PTA,0x0000134000000000,512,1,4,N/A,14,live_at_exit,\
             [no call stack: trace with --call-stack=c]",
        ]
    );
    fs::remove_dir_all(&dir).unwrap();
}

/// `analyze --by-site | head`: a reader that closes the pipe early is no failure of ours (exit 0,
/// no error line), while the leak files are still written.
#[test]
fn analyze_into_a_closed_pipe_exits_0() {
    let dir = scratch("off-analyze-pipe");
    let dump = write(
        &dir,
        "memscope_dump_1.csv",
        &csv(&[
            "0,MALLOC,HAL,N/A,10,77,78,0,0x0000124000200000,\"{allocation_id:1,addr:0x0000124000200000,size:4096,used:4096,page_type:normal,alloc_type:alloc}\",,",
        ]),
    );
    let out_dir = dir.join("out");
    let mut child = Command::new(TRACER)
        .args(["analyze", "-i", dump.to_str().unwrap(), "--by-site", "-o"])
        .arg(&out_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end before the table is printed.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("error"), "{err}");
    assert_eq!(find_files(&out_dir, "leaks_").len(), 1, "{err}");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn analyze_reads_msmemscope_old_layout_and_db() {
    let dir = scratch("off-analyze-old");
    let dump = write(&dir, "old.csv", OLD_LAYOUT);
    let out = run_tracer(&[
        "analyze",
        "-i",
        dump.to_str().unwrap(),
        "-o",
        dir.join("out").to_str().unwrap(),
    ]);
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("2 HAL allocation(s), 1 free(s)"), "{err}");
    // The pinned host block, and the PTA block left live at the end (no segment of the dump
    // holds it: the pool got it before the dump began).
    let out = dir.join("out");
    let leaks = fs::read_to_string(
        find_files(&out, "leaks_")
            .into_iter()
            .find(|f| f.to_string_lossy().contains("device_cpu"))
            .expect("the cpu leaks file"),
    )
    .unwrap();
    let tensors = fs::read_to_string(
        find_files(&out, "leaks_")
            .into_iter()
            .find(|f| f.to_string_lossy().contains("device_0"))
            .expect("device 0's leaks file"),
    )
    .unwrap();
    assert_eq!(
        tensors.lines().collect::<Vec<_>>(),
        [
            LEAKS_HEADER.to_string(),
            format!(
                "2523740,2523740,0,PTA,0x{:016x},1024,0,0,N/A,1746006024579117,live_at_exit,\
                 [no call stack: trace with --call-stack=c]",
                20616939214848u64
            ),
        ]
    );
    assert_eq!(
        leaks.lines().collect::<Vec<_>>(),
        [
            LEAKS_HEADER.to_string(),
            format!(
                // msMemScope's own Python column names the line.
                "2523740,2523740,cpu,HAL,0x{:016x},6356992,0,0,{},1746006014362653,live_at_exit,\
                 train.py:10",
                20617990504448u64,
                module_label(7)
            ),
        ]
    );

    // The same dump as an msMemScope db gives the same report.
    let db = dir.join("old.db");
    csv_to_msmemscope_db(&dump, &db);
    let out = run_tracer(&[
        "analyze",
        "-i",
        db.to_str().unwrap(),
        "-o",
        dir.join("out-db").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let contents = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = find_files(d, "leaks_")
            .iter()
            .map(|f| fs::read_to_string(f).unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(contents(&dir.join("out-db")), contents(&dir.join("out")));
    // Reading a db leaves nothing beside it.
    assert!(!dir.join("old.db-wal").exists() && !dir.join("old.db-shm").exists());
    // Names that need escaping in an SQLite URI.
    let odd = dir.join("we ird %3F?#&.db");
    fs::copy(&db, &odd).unwrap();
    assert_eq!(
        reader::read_rows(&odd).unwrap(),
        reader::read_rows(&db).unwrap()
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn analyze_without_leaks_writes_nothing() {
    let dir = scratch("off-analyze-none");
    let dump = write(
        &dir,
        "d.csv",
        &csv(&[
            "1,MALLOC,HAL,N/A,10,5,5,0,0x0000000000001000,\"{allocation_id:1,addr:0x0000000000001000,size:8,used:8}\",,",
            "2,FREE,HAL,N/A,11,5,5,0,0x0000000000001000,\"{allocation_id:1,addr:0x0000000000001000,size:8,used:0}\",,",
        ]),
    );
    let out = run_tracer(&[
        "analyze",
        "-i",
        dump.to_str().unwrap(),
        "-o",
        dir.join("out").to_str().unwrap(),
    ]);
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("leak report: no leaked tensor and no leaked driver memory"),
        "{err}"
    );
    assert!(find_files(&dir.join("out"), "leaks_").is_empty());
    fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Bad inputs
// ---------------------------------------------------------------------------------------------

const GOOD: &str = "1,MALLOC,HAL,N/A,10,5,5,0,0x0000000000001000,\"{allocation_id:1,size:8}\",,";

fn expect_exit_2(args: &[&str], needles: &[&str]) {
    let out = run_tracer(args);
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: expected {n:?} in {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn malformed_inputs_exit_2_naming_file_and_line() {
    let dir = scratch("off-bad");
    let out_dir = dir.join("out");
    let out = out_dir.to_str().unwrap();
    let good = write(&dir, "good.csv", &csv(&[GOOD]));
    // (name, contents, location after the path, message); the "size" case is a leak-analysis
    // rule (HAL rows), so only `analyze` sees it.
    let cases: Vec<(&str, Vec<u8>, &str, &str)> = vec![
        ("empty", vec![], "", "is empty"),
        (
            "header",
            b"ID,Event\n1,2\n".to_vec(),
            ":1:",
            "not a memscope_dump CSV",
        ),
        (
            "binary",
            vec![0xff, 0xfe, 0, 1, 2, b'\n'],
            ":1:",
            "not a memscope_dump CSV",
        ),
        (
            "fields",
            csv(&[GOOD, "2,FREE,HAL,N/A,11,5,5,0,0x1000,,"]).into_bytes(),
            ":3:",
            "expected 12 comma-separated fields, found 11",
        ),
        (
            "unclosed",
            csv(&[GOOD, "2,MSTX,Mark,\"never closed,11,5,5,0,N/A,,,", "3,x"]).into_bytes(),
            ":3:",
            "never closed",
        ),
        (
            "after-quote",
            csv(&["1,MSTX,Mark,\"a\"b,11,5,5,0,N/A,,,"]).into_bytes(),
            ":2:",
            "field 4 has text after its closing quote",
        ),
        (
            "id",
            csv(&["x,MSTX,Mark,N/A,11,5,5,0,N/A,,,"]).into_bytes(),
            ":2:",
            "ID 'x'",
        ),
        (
            "ts",
            csv(&[GOOD, "2,MSTX,Mark,N/A,-3,5,5,0,N/A,,,"]).into_bytes(),
            ":3:",
            "Timestamp(ns) '-3'",
        ),
        (
            "pid",
            csv(&["2,MSTX,Mark,N/A,3,five,5,0,N/A,,,"]).into_bytes(),
            ":2:",
            "Process Id 'five'",
        ),
        (
            "device",
            csv(&["2,MSTX,Mark,N/A,3,5,5,npu0,N/A,,,"]).into_bytes(),
            ":2:",
            "Device Id 'npu0'",
        ),
        (
            "ptr",
            csv(&["2,MALLOC,HAL,N/A,3,5,5,0,0xg1,,,"]).into_bytes(),
            ":2:",
            "Ptr '0xg1'",
        ),
        (
            "attr",
            csv(&["2,MALLOC,HAL,N/A,3,5,5,0,0x1,size:8,,"]).into_bytes(),
            ":2:",
            "Attr 'size:8'",
        ),
        (
            "size",
            csv(&["2,MALLOC,HAL,N/A,3,5,5,0,0x1,\"{size:big}\",,"]).into_bytes(),
            ":2:",
            "Attr size 'big'",
        ),
        (
            "utf8",
            [
                csv(&[]).as_bytes(),
                b"2,MSTX,Mark,\"\xff\",3,5,5,0,N/A,,,\n",
            ]
            .concat(),
            ":2:",
            "column \"Name\" is not valid UTF-8",
        ),
        // The line of a record after a multi-line stack.
        (
            "after-stack",
            csv(&[
                "1,MSTX,Mark,N/A,3,5,5,0,N/A,,,\"a\nb\nc\"",
                "2,MSTX,Mark,N/A,3,5,5,0,N/A,,",
            ])
            .into_bytes(),
            ":5:",
            "found 11",
        ),
    ];
    for (name, body, at, what) in &cases {
        let p = dir.join(format!("{name}.csv"));
        fs::write(&p, body).unwrap();
        let loc = format!("{}{at}", p.display());
        let arg = format!("--input-path={}", p.display());
        expect_exit_2(&["analyze", &arg, "-o", out], &[&loc, what]);
        if *name == "size" {
            continue;
        }
        let pair = format!("--input-path={},{}", good.display(), p.display());
        expect_exit_2(&["--compare", &pair, "-o", out], &[&loc, what]);
    }

    // Databases: no dump table, a bad column, bad JSON in a row.
    let no_table = dir.join("no_table.db");
    Connection::open(&no_table)
        .unwrap()
        .execute_batch("CREATE TABLE other (x INTEGER); INSERT INTO other VALUES (1);")
        .unwrap();
    let bad_cols = dir.join("bad_cols.db");
    Connection::open(&bad_cols)
        .unwrap()
        .execute_batch("CREATE TABLE memscope_dump (\"ID\" INTEGER, \"Event\" TEXT);")
        .unwrap();
    let bad_json = dir.join("bad_json.db");
    csv_to_msmemscope_db(&good, &bad_json);
    let conn = Connection::open(&bad_json).unwrap();
    conn.execute(
        "INSERT INTO memscope_dump VALUES (2,'FREE','HAL','N/A',11,5,5,'0','0x1','{\"size\":',NULL,NULL)",
        [],
    )
    .unwrap();
    drop(conn);
    for (p, needle) in [
        (
            &no_table,
            format!(
                "{}: is a SQLite database without a `memscope_dump` table",
                no_table.display()
            ),
        ),
        (
            &bad_cols,
            format!(
                "{}: table `memscope_dump` has the columns",
                bad_cols.display()
            ),
        ),
        (&bad_json, format!("{}: row 2: Attr", bad_json.display())),
    ] {
        let arg = format!("-i{}", p.display());
        expect_exit_2(&["analyze", &arg, "-o", out], &[&needle]);
    }

    // Compare only: one framework per comparison.
    let mixed = write(
        &dir,
        "mixed.csv",
        &csv(&[
            "1,MALLOC,PTA,N/A,10,5,5,0,0x1,\"{size:8}\",,",
            "2,MALLOC,MINDSPORE,N/A,11,5,5,0,0x2,\"{size:8}\",,",
        ]),
    );
    let pair = format!("-i{},{}", good.display(), mixed.display());
    expect_exit_2(
        &["--compare", &pair, "-o", out],
        &[
            &format!("{}:3:", mixed.display()),
            "MINDSPORE mixed with PTA",
        ],
    );
    let ms = write(
        &dir,
        "ms.csv",
        &csv(&["1,MALLOC,MINDSPORE,N/A,10,5,5,0,0x1,\"{size:8}\",,"]),
    );
    let pair = format!("-i{},{}", ms.display(), ms.display());
    expect_exit_2(
        &["--compare", &pair, "-o", out],
        &["MindSpore", "--level=kernel"],
    );

    // Nothing was written for any of them.
    assert!(find_files(&out_dir, "memory_compare_").is_empty());
    assert!(find_files(&out_dir, "leaks_").is_empty());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn symlink_inputs_are_rejected() {
    let dir = scratch("off-symlink");
    let real = write(&dir, "real.csv", &csv(&[GOOD]));
    let link = dir.join("link.csv");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let out = dir.join("out");
    let out = out.to_str().unwrap();
    expect_exit_2(
        &["analyze", &format!("-i{}", link.display()), "-o", out],
        &["link.csv", "symbolic link"],
    );
    expect_exit_2(
        &[
            "--compare",
            &format!("-i{},{}", real.display(), link.display()),
            "-o",
            out,
        ],
        &["link.csv", "symbolic link"],
    );
    // A directory and a missing file, too.
    expect_exit_2(
        &["analyze", &format!("-i{}", dir.display()), "-o", out],
        &["not a regular file"],
    );
    // The library refuses them as well (no following through the reader).
    let e = reader::read_rows(&link).unwrap_err().to_string();
    assert!(e.contains("symbolic link"), "{e}");
    fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// SIGKILL during a db write
// ---------------------------------------------------------------------------------------------

const CHILD_ENV: &str = "MEMSCOPE_OFFLINE_SIGKILL_CHILD_DIR";
const ROWS_PER_FLUSH: u64 = 50;

fn numbered_row(i: u64) -> Row {
    Row {
        event: "MALLOC",
        event_type: "HAL",
        name: "N/A".into(),
        ts_ns: 1_700_000_000_000_000_000 + i,
        pid: 4242,
        tid: 4243,
        device: DeviceKey::Npu(0),
        ptr: Some(0x1000 + i),
        size: None,
        attr: format!(
            "allocation_id:{},addr:0x{:016x},size:{i}",
            i + 1,
            0x1000 + i
        ),
        c_stack: None,
        py_stack: None,
    }
}

/// Not a test on its own: the child process of `sigkill_leaves_a_committed_prefix`, which
/// writes rows through the db writer until it is killed.
#[test]
fn sigkill_child_writer() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut out = ProcessOutput::with_format(Path::new(&dir), 4242, "{}".into(), DataFormat::Db);
    let mut i = 0;
    loop {
        for _ in 0..ROWS_PER_FLUSH {
            out.write(numbered_row(i)).unwrap();
            i += 1;
        }
        out.flush().unwrap();
        println!("committed {i}");
        // Uncommitted rows are in flight most of the time.
        for _ in 0..ROWS_PER_FLUSH / 2 {
            out.write(numbered_row(i)).unwrap();
            i += 1;
        }
        std::thread::sleep(Duration::from_millis(2));
        for _ in 0..ROWS_PER_FLUSH / 2 {
            out.write(numbered_row(i)).unwrap();
            i += 1;
        }
        out.flush().unwrap();
        println!("committed {i}");
    }
}

#[test]
fn sigkill_leaves_a_committed_prefix() {
    let dir = scratch("off-sigkill");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "sigkill_child_writer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut committed = 0u64;
    while committed < 1000 {
        assert!(Instant::now() < deadline, "the child writer is too slow");
        let line = lines.next().expect("child output").unwrap();
        if let Some(n) = line.strip_prefix("committed ") {
            committed = n.parse().unwrap();
        }
    }
    std::thread::sleep(Duration::from_millis(3));
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(!status.success());
    drop(lines);

    // The -wal (and -shm) files are still there: nobody checkpointed.
    let files = find_files(&dir, "memscope_dump_");
    let db: Vec<&PathBuf> = files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "db"))
        .collect();
    assert_eq!(db.len(), 1, "{files:?}");
    let db = db[0].clone();
    // SQLite itself finds the file sound.
    {
        let conn =
            Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
    }
    let rows: Vec<DumpRow> = reader::read_rows(&db).unwrap();
    let n = rows.len() as u64;
    assert!(n >= committed, "{n} rows, but {committed} were committed");
    assert_eq!(n % ROWS_PER_FLUSH, 0, "whole transactions only: {n}");
    for (i, r) in rows.iter().enumerate() {
        let i = i as u64;
        assert_eq!(r.id, i);
        assert_eq!(r.ts_ns, 1_700_000_000_000_000_000 + i);
        assert_eq!(r.ptr, Some(0x1000 + i));
        assert_eq!(r.attr("size"), Some(i.to_string().as_str()));
    }
    let _ = TRACER; // the binary is not involved here
    fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// End to end (root): a traced run written as db, analyzed offline
// ---------------------------------------------------------------------------------------------

/// The leak rows of every `leaks_*.csv` under `dir`, sorted, without the Module column (the
/// dump does not record the module) and, off device 0, without the Step column: the workload
/// marks steps from a thread on device 0, so only device 0's dump holds the "step start" rows.
fn leak_rows(dir: &Path) -> Vec<String> {
    let mut rows: Vec<String> = find_files(dir, "leaks_")
        .iter()
        .flat_map(|f| {
            fs::read_to_string(f)
                .unwrap()
                .lines()
                .skip(1)
                .map(|l| {
                    let mut c: Vec<&str> = l.split(',').collect();
                    c.remove(8);
                    if c[2] != "0" {
                        c.remove(6);
                    }
                    c.join(",")
                })
                .collect::<Vec<_>>()
        })
        .collect();
    rows.sort();
    rows
}

#[test]
fn traced_db_run_analyzed_offline_matches_the_online_leak_report() {
    if !common::require_root("traced_db_run_analyzed_offline_matches_the_online_leak_report") {
        return;
    }
    let _serial = common::serial();
    let dir = scratch("off-e2e-db");
    let out_dir = dir.join("out");
    let workload = common::bin("workload");
    let out = run_tracer(&[
        "-o",
        out_dir.to_str().unwrap(),
        "--format=db",
        "--device=npu,cpu",
        "--",
        workload.to_str().unwrap(),
        "--threads",
        "2",
        "--devices",
        "2",
        "--steps",
        "2",
        "--allocs",
        "3",
        "--leaks",
        "1",
        "--host",
        "--create",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let dbs: Vec<PathBuf> = find_files(&out_dir, "memscope_dump_")
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "db"))
        .collect();
    assert!(!dbs.is_empty(), "no db written");
    assert!(
        find_files(&out_dir, "memscope_dump_")
            .iter()
            .all(|p| !p.to_string_lossy().ends_with(".csv"))
    );
    let online = leak_rows(&out_dir);
    assert!(!online.is_empty(), "the workload leaks");
    let mut offline = Vec::new();
    for (n, db) in dbs.iter().enumerate() {
        let rows = reader::read_rows(db).unwrap();
        assert!(rows.iter().any(|r| r.event == "MALLOC"), "{}", db.display());
        let o = dir.join(format!("analyzed{n}"));
        let res = run_tracer(&[
            "analyze",
            "-i",
            db.to_str().unwrap(),
            "-o",
            o.to_str().unwrap(),
        ]);
        assert_eq!(res.status.code(), Some(0), "{}", stderr_of(&res));
        offline.extend(leak_rows(&o));
    }
    offline.sort();
    assert_eq!(offline, online);
    fs::remove_dir_all(&dir).unwrap();
}
