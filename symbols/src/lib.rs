//! memscope-bpf's object-file layer: ELF symbol tables, file offsets for uprobes, dynamic
//! dependencies, process memory maps, and stack symbolization: DWARF line tables and inline
//! frames, separate debug files, and CFI unwinding of captured user stacks. No BPF in here, so
//! it can be tested and fuzzed alone.
//!
//! The flow for one event: take a [`ProcessView`] of the process (when its maps change),
//! [`unwind`] the captured registers and stack bytes into pcs (or take the frame-pointer stack
//! the kernel gave), [`Symbolizer::symbolize_stack`] them, and [`format_stack`] the frames.

pub mod demangle;
pub mod elf;
pub mod format;
pub mod locate;
pub mod maps;
pub mod object;
pub mod process;
pub mod symbolize;
pub mod unwind;

pub use demangle::demangle;
pub use elf::{ElfObject, FunctionSymbol};
pub use format::{format_frame, format_stack};
pub use maps::{MapEntry, parse_maps, read_maps};
pub use object::{ObjectInfo, Segment, SourceFrame};
pub use process::{Mapping, ModuleAddress, ModuleFile, ProcessView};
pub use symbolize::{CacheStats, Frame, Symbolizer, SymbolizerOptions};
pub use unwind::{Arch, Regs, StackSnapshot, StopReason, UnwindOptions, Unwound, unwind};
