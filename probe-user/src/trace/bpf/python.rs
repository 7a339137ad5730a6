//! What the BPF side needs of each CPython process (`--call-stack=python`): where the
//! interpreter keeps its frames, and a probe on its `code_dealloc`.

use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use aya::maps::{HashMap, MapData};

use super::Bpf;

impl Bpf {
    /// Tells the BPF side where `pid`'s CPython keeps its frames (`--call-stack=python`).
    pub fn set_python_process(&mut self, pid: u32, layout: &probe_common::PyProcess) -> Result<()> {
        let mut map: HashMap<&mut MapData, u32, probe_common::PyProcess> = HashMap::try_from(
            self.ebpf
                .map_mut("PY_PROCS")
                .ok_or_else(|| anyhow!("BPF map PY_PROCS missing"))?,
        )?;
        map.insert(pid, *layout, 0)
            .with_context(|| format!("cannot store the Python layout of pid {pid}"))
    }

    /// Puts `py_code_gone` on `pid`'s `code_dealloc`, at `file_offset` of `path` (a
    /// multi-uprobe link for that process only; none where the kernel has no such links).
    pub fn watch_code_deaths(&mut self, pid: u32, path: &Path, file_offset: u64) -> Result<()> {
        let Some(multi) = &self.multi else {
            bail!("no multi-uprobe links");
        };
        let link = multi
            .attach("py_code_gone", false, path, &[(file_offset, 0)], pid)
            .with_context(|| format!("cannot probe {}+{file_offset:#x}", path.display()))?;
        self.unwatch_code_deaths(pid);
        self.code_gone_links.insert(pid, link);
        Ok(())
    }

    /// `pid` exited or exec'd: its interpreter is gone.
    pub fn forget_python_process(&mut self, pid: u32) {
        self.unwatch_code_deaths(pid);
        if let Some(m) = self.ebpf.map_mut("PY_PROCS")
            && let Ok(mut map) = HashMap::<&mut MapData, u32, probe_common::PyProcess>::try_from(m)
        {
            let _ = map.remove(&pid);
        }
    }
}
