//! The analyses beyond leaks, replayed over a saved dump (`analyze`): inefficient memory
//! (spec §6.8, offline form: rows in ID order, blocks keyed by process and allocation_id),
//! decompose (owner breakdown) and the OOM rows the dump holds.

use std::{collections::BTreeMap, io::Write, path::Path};

use anyhow::Result;

use super::reader::{self, DumpRow};
use crate::{
    analysis::{
        decompose::Decompose,
        inefficient::{self, InefficientAnalyzer, MemEvent},
    },
    log,
    output::{fsutil, local_timestamp},
};

/// Results per process.
#[derive(Debug, Default)]
pub struct Replayed {
    /// (allocation id, types) of flagged blocks.
    pub inefficient: BTreeMap<u32, Vec<(u64, String)>>,
    pub decompose: BTreeMap<u32, Decompose>,
    /// OOM_TRIGGER rows: (pid, device, Attr text).
    pub ooms: Vec<(u32, String, String)>,
}

fn owner_of(row: &DumpRow) -> String {
    if let Some(o) = row.attr("owner") {
        return o.to_string();
    }
    match row.event_type.as_str() {
        "PTA" | "MINDSPORE" | "ATB" | "CUDA" => row.event_type.clone(),
        _ => match row.attr("MID").and_then(|m| m.trim().parse::<u32>().ok()) {
            Some(id) => format!("CANN@{}", crate::state::module_label(id)),
            None => "CANN@UNKNOWN".to_string(),
        },
    }
}

/// Replays the rows of `path`.
pub fn replay(path: &Path) -> Result<Replayed> {
    let mut rows = reader::read_rows(path)?;
    rows.sort_by_key(|r| (r.pid, r.id));
    let mut ineff: BTreeMap<u32, (InefficientAnalyzer, InefficientAnalyzer)> = BTreeMap::new();
    let mut out = Replayed::default();
    let mut in_step: BTreeMap<u32, (u32, bool)> = BTreeMap::new();
    let mut owners: std::collections::HashMap<(u32, u64, String), String> = Default::default();
    for row in &rows {
        let (pta, atb) = ineff.entry(row.pid).or_default();
        let id = row
            .attr("allocation_id")
            .and_then(|a| a.trim().parse::<u64>().ok());
        // msMemScope's routing: PTA rows and accesses of PTA blocks feed the PTA state.
        let is_pta = row.event_type == "PTA" || row.attr("type") == Some("PTA");
        let state = if is_pta { &mut *pta } else { &mut *atb };
        match (row.event.as_str(), row.event_type.as_str()) {
            ("OP_LAUNCH", "ATEN_START") => pta.op_start(),
            ("OP_LAUNCH", "ATEN_END") => pta.op_end(),
            ("OP_LAUNCH", "ATB_START") => atb.op_start(),
            ("OP_LAUNCH", "ATB_END") => atb.op_end(),
            ("MALLOC", "PTA" | "ATB") | ("FREE", "PTA" | "ATB") | ("ACCESS", _) => {
                let Some(id) = id else { continue };
                let ev = match row.event.as_str() {
                    "MALLOC" => MemEvent::Malloc,
                    "FREE" => MemEvent::Free,
                    _ => MemEvent::Access,
                };
                state.event(id, ev);
            }
            ("OOM_DETAIL", "OOM_TRIGGER") => {
                let attr = row
                    .attr
                    .iter()
                    .map(|(k, v)| format!("{k}:{v}"))
                    .collect::<Vec<_>>()
                    .join(",");
                out.ooms.push((row.pid, row.device.to_string(), attr));
            }
            ("MSTX", "Range_start") if row.name == "step start" => {
                let s = in_step.entry(row.pid).or_default();
                s.0 += 1;
                s.1 = true;
            }
            ("MSTX", "Range_end") => {
                if let Some(s) = in_step.get_mut(&row.pid).filter(|s| s.1) {
                    s.1 = false;
                    out.decompose.entry(row.pid).or_default().on_step_end(s.0);
                }
            }
            _ => {}
        }
        if matches!(row.event.as_str(), "MALLOC" | "FREE") && row.event_type != "HOST" {
            let size = row
                .attr("size")
                .and_then(|s| s.trim().parse::<i64>().ok())
                .unwrap_or(0);
            let d = out.decompose.entry(row.pid).or_default();
            let key = (row.pid, id.unwrap_or(u64::MAX), row.event_type.clone());
            if row.event == "MALLOC" {
                let owner = owner_of(row);
                d.on_alloc(&owner, size.unsigned_abs());
                owners.insert(key, owner);
            } else if let Some(owner) = owners.remove(&key) {
                // A FREE row names no owner: it is that of its MALLOC (same allocation_id).
                d.on_free(&owner, size.unsigned_abs());
            }
        }
    }
    for (pid, (pta, atb)) in &ineff {
        let mut v: Vec<(u64, String)> = pta
            .flagged()
            .chain(atb.flagged())
            .map(|(id, f)| (id, inefficient::attr_value(f)))
            .collect();
        v.sort();
        if !v.is_empty() {
            out.inefficient.insert(*pid, v);
        }
    }
    out.decompose.retain(|_, d| !d.is_empty());
    Ok(out)
}

/// Prints the replayed analyses and writes `inefficient_<ts>.csv` into `dir`.
pub fn report(r: &Replayed, dir: &Path) -> Result<()> {
    for (pid, flagged) in &r.inefficient {
        let mut per_type = BTreeMap::<&str, usize>::new();
        for (_, types) in flagged {
            for t in types.split(',') {
                *per_type.entry(t).or_default() += 1;
            }
        }
        let counts: Vec<String> = per_type.iter().map(|(k, v)| format!("{k} {v}")).collect();
        log::info(&format!(
            "pid {pid}: inefficient memory: {} block(s): {}",
            flagged.len(),
            counts.join(", ")
        ));
    }
    if !r.inefficient.is_empty() {
        let root = fsutil::Dir::open_root(dir)?;
        let (path, f) =
            root.create_unique_file(&format!("inefficient_{}", local_timestamp()), ".csv")?;
        let mut f = std::io::BufWriter::new(f);
        writeln!(f, "Process Id,Allocation Id,Inefficient Type")?;
        for (pid, flagged) in &r.inefficient {
            for (id, types) in flagged {
                writeln!(f, "{pid},{id},\"{types}\"")?;
            }
        }
        f.flush()?;
        log::info(&format!("inefficient blocks written to {}", path.display()));
    }
    for (pid, d) in &r.decompose {
        log::info(&format!("pid {pid}: memory by owner (decompose)"));
        for line in d.report().lines() {
            log::info(&format!("  {line}"));
        }
    }
    for (pid, device, attr) in &r.ooms {
        log::warn(&format!(
            "pid {pid}: out of memory on device {device}: {attr}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_decompose_and_oom_rows_from_a_dump() {
        let dir = std::env::temp_dir().join(format!("memscope-analyses-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("memscope_dump_1.csv");
        let rows = [
            r#"0,MALLOC,HAL,N/A,10,7,7,0,0x0000000000001000,"{allocation_id:1,addr:0x0000000000001000,size:100,used:100,owner:CANN@APP,page_type:normal,alloc_type:alloc}",,"#,
            r#"1,MSTX,Range_start,"step start",11,7,7,0,N/A,,,"#,
            r#"2,MALLOC,PTA,N/A,12,7,7,0,0x0000000000001000,"{allocation_id:2,addr:0x0000000000001000,size:40,used:40,total:100}",,"#,
            r#"3,MSTX,Range_end,"Range end from id 1",13,7,7,0,N/A,,,"#,
            r#"4,FREE,PTA,N/A,14,7,7,0,0x0000000000001000,"{allocation_id:2,addr:0x0000000000001000,size:40,used:0,total:100}",,"#,
            r#"5,OOM_DETAIL,OOM_TRIGGER,OOM_Trigger,15,7,7,0,N/A,"{func:halMemAlloc,req_size:999,flag:1024}",,"#,
        ];
        std::fs::write(
            &path,
            format!("{}\n{}\n", crate::output::csv::CSV_HEADER, rows.join("\n")),
        )
        .unwrap();
        let r = replay(&path).unwrap();
        let d = &r.decompose[&7];
        assert_eq!(d.owners()["CANN@APP"].current, 100);
        assert_eq!((d.owners()["PTA"].current, d.owners()["PTA"].peak), (0, 40));
        assert!(d.report().contains("CANN@APP"));
        assert_eq!(
            r.ooms,
            vec![(
                7,
                "0".to_string(),
                "func:halMemAlloc,req_size:999,flag:1024".to_string()
            )]
        );
        assert!(r.inefficient.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
