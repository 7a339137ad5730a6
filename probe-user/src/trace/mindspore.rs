//! MindSpore's pool counts its own used bytes (`memory_allocated()`): its exported
//! `AbstractDynamicMemPool::TotalUsedMemStatistics() const` returns a counter reached through
//! one pointer member of the pool (2.10 on x86-64: `mov 0xd8(%rdi),%rax; mov (%rax),%rax`,
//! the pool's memory statistics and their `used` field). The offsets are read from that code,
//! so that the pool's probes can read the counter at each block change (`READ_CHAIN`): a
//! process attached to (`--pid`) then has its blocks made before the attach in `used` too.

use std::{fs::File, os::unix::fs::FileExt, path::Path};

use memscope_symbols::elf::FunctionSymbol;

/// `size_t AbstractDynamicMemPool::TotalUsedMemStatistics() const`.
pub const TOTAL_USED: &str =
    "_ZNK9mindspore6device22AbstractDynamicMemPool22TotalUsedMemStatisticsEv";

/// The pool's used-bytes counter as (offset of the pointer member in the pool, offset of the
/// counter behind it), from the getter's code; None when it is not the expected two loads.
pub fn used_counter(path: &Path, getter: &FunctionSymbol) -> Option<(u16, u16)> {
    if getter.size == 0 || getter.size > 4096 {
        return None;
    }
    let mut code = vec![0u8; getter.size as usize];
    File::open(path)
        .ok()?
        .read_exact_at(&mut code, getter.file_offset)
        .ok()?;
    used_counter_in(&code)
}

/// The first load from `this` (`rdi`) into a register, then a load through that register
/// into the return register, before any call, branch or return.
pub fn used_counter_in(code: &[u8]) -> Option<(u16, u16)> {
    use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, OpKind, Register};
    let mut member: Option<(Register, u64)> = None;
    for insn in Decoder::with_ip(64, code, 0, DecoderOptions::NONE) {
        if insn.flow_control() != FlowControl::Next {
            return None;
        }
        if insn.code() != Code::Mov_r64_rm64
            || insn.op1_kind() != OpKind::Memory
            || insn.memory_index() != Register::None
        {
            continue;
        }
        let (base, disp) = (insn.memory_base(), insn.memory_displacement64());
        match member {
            None if base == Register::RDI => member = Some((insn.op0_register(), disp)),
            Some((reg, first)) if base == reg && insn.op0_register() == Register::RAX => {
                return Some((u16::try_from(first).ok()?, u16::try_from(disp).ok()?));
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_getter_of_mindspore_2_10() {
        // sub $0x18,%rsp; mov %fs:0x28,%rax; mov %rax,0x8(%rsp); xor %eax,%eax;
        // mov 0xd8(%rdi),%rax; mov (%rax),%rax; mov 0x8(%rsp),%rdx; ...
        let code = [
            0x48, 0x83, 0xec, 0x18, 0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0x00, 0x00, 0x00, 0x48,
            0x89, 0x44, 0x24, 0x08, 0x31, 0xc0, 0x48, 0x8b, 0x87, 0xd8, 0x00, 0x00, 0x00, 0x48,
            0x8b, 0x00, 0x48, 0x8b, 0x54, 0x24, 0x08, 0xc3,
        ];
        assert_eq!(used_counter_in(&code), Some((0xd8, 0)));
        // A getter that calls something first is not the two loads.
        let call_first = [
            0xe8, 0, 0, 0, 0, 0x48, 0x8b, 0x87, 0xd8, 0, 0, 0, 0x48, 0x8b, 0x00,
        ];
        assert_eq!(used_counter_in(&call_first), None);
        // One load only (the counter is in the pool itself): not this layout.
        assert_eq!(
            used_counter_in(&[0x48, 0x8b, 0x87, 0xd8, 0, 0, 0, 0xc3]),
            None
        );
    }
}
