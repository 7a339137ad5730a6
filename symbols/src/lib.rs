//! memscope-bpf's object-file layer: ELF symbol tables, file offsets for uprobes, dynamic
//! dependencies, and process memory maps. No BPF in here, so it can be tested and fuzzed alone.
//!
//! Stack symbolization (DWARF line tables, inline frames, CFI unwinding) will live here too.

pub mod elf;
pub mod maps;

pub use elf::{ElfObject, FunctionSymbol};
pub use maps::{MapEntry, parse_maps, read_maps};
