//! `decompose_<ts>.csv` (`--analysis=decompose`): what the owner analysis of `analysis/`
//! found, written into the process directory.

use std::{io::Write, path::PathBuf};

use anyhow::Result;

use super::{ProcessOutput, local_timestamp};
use crate::analysis::decompose::Decompose;

impl Decompose {
    /// `decompose_<ts>.csv` in the process directory: the bytes of each owner at the end of
    /// every step, then at the end of tracing (step `end`), with the peak.
    pub fn write_csv(&self, out: &mut ProcessOutput) -> Result<PathBuf> {
        let dir = out.ensure_dir()?;
        let (path, f) =
            dir.create_unique_file(&format!("decompose_{}", local_timestamp()), ".csv")?;
        let mut f = std::io::BufWriter::new(f);
        writeln!(f, "Step,Owner,Current(byte),Peak(byte)")?;
        for (step, owners) in self.step_snapshots() {
            for (owner, bytes) in owners {
                writeln!(f, "{step},{owner},{bytes},")?;
            }
        }
        for (owner, b) in self.owners() {
            writeln!(f, "end,{owner},{},{}", b.current, b.peak)?;
        }
        f.flush()?;
        Ok(path)
    }
}
