//! Kernel names for launches that pass the kernel's stub function: the address is symbolized
//! in the target (while it is alive, when the launch is drained), once per address.

use std::{collections::HashMap, sync::Arc};

use memscope_symbols::{ProcessView, Symbolizer};

#[derive(Default)]
pub struct KernelNames {
    symbolizer: Symbolizer,
    views: HashMap<u32, Arc<ProcessView>>,
    names: HashMap<(u32, u64), Option<String>>,
}

impl KernelNames {
    /// The process's mappings changed: read them anew on the next miss.
    pub fn invalidate(&mut self, pid: u32) {
        self.views.remove(&pid);
    }

    /// The process is gone: its view (and the files it opened) and its names go too.
    pub fn forget(&mut self, pid: u32) {
        self.views.remove(&pid);
        self.names.retain(|(p, _), _| *p != pid);
    }

    /// The function at `addr` in process `pid`, if its module has a symbol for it.
    pub fn name(&mut self, pid: u32, addr: u64) -> Option<String> {
        if let Some(n) = self.names.get(&(pid, addr)) {
            return n.clone();
        }
        let view = match self.views.get(&pid) {
            Some(v) if v.lookup(addr).is_some() => v.clone(),
            _ => {
                let v = Arc::new(ProcessView::from_pid(pid).ok()?);
                self.views.insert(pid, v.clone());
                v
            }
        };
        let name = self
            .symbolizer
            .symbolize(&view, addr, false)
            .into_iter()
            .filter(|f| !f.inlined)
            .find_map(|f| f.function);
        self.names.insert((pid, addr), name.clone());
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn a_kernel_stub() -> u64 {
        std::hint::black_box(7)
    }

    #[test]
    fn names_a_function_of_this_process() {
        let addr = a_kernel_stub as fn() -> u64 as usize as u64;
        let mut k = KernelNames::default();
        let name = k.name(std::process::id(), addr).expect("symbolized");
        assert!(name.contains("a_kernel_stub"), "{name}");
        assert_eq!(k.name(std::process::id(), addr), Some(name), "cached");
        assert_eq!(
            k.name(std::process::id(), 8),
            None,
            "no module at address 8"
        );
    }
}
