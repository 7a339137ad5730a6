//! Arbitrary bytes through the ELF, DWARF and CFI parsing paths: object parsing, symbol and
//! line lookups, FDE indexing and unwinding a stack made of the same bytes.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use memscope_symbols::{
    ElfObject, ObjectInfo, ProcessView, Regs, StackSnapshot, Symbolizer, UnwindOptions, unwind,
};

fuzz_target!(|data: &[u8]| {
    let _ = ElfObject::parse(data);
    let Ok(obj) = ObjectInfo::from_bytes(Arc::<[u8]>::from(data)) else {
        return;
    };
    let _ = obj.fde_count();
    // Probe addresses: segment starts and a few taken from the input.
    let mut probes: Vec<u64> = obj.segments().iter().map(|s| s.vaddr).collect();
    probes.extend(
        data.chunks_exact(8)
            .take(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap())),
    );
    probes.extend([0, 0x1000, 0x1040, u64::MAX]);
    for &p in &probes {
        let _ = obj.symbolize(p);
        let _ = obj.symbol(p);
        let _ = obj.file_offset_to_vaddr(p);
    }
    // Unwind with the object mapped at 0x10000 and the input as the stack.
    let obj = Arc::new(obj);
    let view = ProcessView::with_object("fuzz.so", 0x10000, 0x10000 + 0x100000, 0, obj);
    let sym = Symbolizer::new();
    for &p in probes.iter().take(6) {
        let pc = 0x10000 + (p & 0xfffff);
        let _ = unwind(
            &Regs {
                pc,
                sp: 0x7000_0000,
                fp: 0x7000_0010,
                lr: None,
            },
            &StackSnapshot {
                base: 0x7000_0000,
                data,
            },
            &view,
            &sym,
            &UnwindOptions {
                max_depth: 32,
                ..UnwindOptions::default()
            },
        );
    }
});
