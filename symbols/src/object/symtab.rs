//! The function symbol table: `.symtab` and `.dynsym` entries sorted by address, one per
//! address, looked up by binary search.

#[derive(Clone, Debug)]
pub(crate) struct Sym {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    pub(crate) name: Box<str>,
}

/// Function symbols sorted by address.
#[derive(Clone, Debug, Default)]
pub(crate) struct SymbolTable {
    pub(crate) syms: Vec<Sym>,
}

impl SymbolTable {
    pub(crate) fn build(mut raw: Vec<(Sym, bool)>) -> Self {
        // At one address prefer a sized, global, then shorter-named symbol.
        raw.sort_by(|(a, ag), (b, bg)| {
            a.addr
                .cmp(&b.addr)
                .then((a.size == 0).cmp(&(b.size == 0)))
                .then(bg.cmp(ag))
                .then(a.name.len().cmp(&b.name.len()))
        });
        raw.dedup_by(|(a, _), (b, _)| a.addr == b.addr);
        SymbolTable {
            syms: raw.into_iter().map(|(s, _)| s).collect(),
        }
    }

    /// The function containing `vaddr` and the offset into it.
    pub(crate) fn lookup(&self, vaddr: u64) -> Option<(&str, u64)> {
        let idx = self.syms.partition_point(|s| s.addr <= vaddr);
        let mut i = idx;
        // A few symbols back, in case of nested or aliased ranges.
        while i > 0 && idx - i < 8 {
            i -= 1;
            let s = &self.syms[i];
            let off = vaddr - s.addr;
            if (s.size > 0 && off < s.size) || (s.size == 0 && i + 1 == idx) {
                return Some((&s.name, off));
            }
        }
        None
    }

    pub(crate) fn len(&self) -> usize {
        self.syms.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbol_table_prefers_sized_global_and_falls_back_to_nearest() {
        let s = |addr, size, name: &str| Sym {
            addr,
            size,
            name: name.into(),
        };
        let t = SymbolTable::build(vec![
            (s(0x100, 0x10, "local_alias"), false),
            (s(0x100, 0x10, "f"), true),
            (s(0x200, 0, "no_size"), true),
            (s(0x300, 0x8, "g"), true),
        ]);
        assert_eq!(t.len(), 3);
        assert_eq!(t.lookup(0x105), Some(("f", 5)));
        assert_eq!(t.lookup(0x110), None);
        assert_eq!(t.lookup(0x250), Some(("no_size", 0x50)));
        assert_eq!(t.lookup(0x307), Some(("g", 7)));
        assert_eq!(t.lookup(0x308), None);
        assert_eq!(t.lookup(0x50), None);
    }
}
