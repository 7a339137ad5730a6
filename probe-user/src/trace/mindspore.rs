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

/// `size_t AbstractDynamicMemPool::TotalMemStatistics() const`: `memory_reserved()`.
pub const TOTAL_RESERVED: &str =
    "_ZNK9mindspore6device22AbstractDynamicMemPool18TotalMemStatisticsEv";

/// The pool's reserved bytes without VMM as (pointer member, the two counters summed behind
/// it), from `TotalMemStatistics()`'s code; None when that branch is not found.
pub fn reserved_counters(path: &Path, getter: &FunctionSymbol) -> Option<(u16, u16, u16)> {
    if getter.size == 0 || getter.size > 4096 {
        return None;
    }
    let mut code = vec![0u8; getter.size as usize];
    File::open(path)
        .ok()?
        .read_exact_at(&mut code, getter.file_offset)
        .ok()?;
    reserved_counters_in(&code)
}

/// The branch without VMM (2.10: `mov 0xd8(%rbx),%rdx; mov 0x18(%rdx),%rax;
/// add 0x10(%rdx),%rax`): a load of a member of `this` (`rdi`, or a register it was copied
/// to), then, as the next two instructions, a load and an add through it into the return
/// register. The VMM branch adds one counter to the virtual call's result: not this shape.
pub fn reserved_counters_in(code: &[u8]) -> Option<(u16, u16, u16)> {
    use iced_x86::{Code, Decoder, DecoderOptions, Instruction, OpKind, Register};
    let mem = |insn: &Instruction, code: Code| {
        (insn.code() == code
            && insn.op1_kind() == OpKind::Memory
            && insn.memory_index() == Register::None)
            .then(|| (insn.memory_base(), insn.memory_displacement64()))
    };
    let insns: Vec<Instruction> = Decoder::with_ip(64, code, 0, DecoderOptions::NONE)
        .into_iter()
        .collect();
    let mut this = vec![Register::RDI];
    for (i, insn) in insns.iter().enumerate() {
        // `mov %rdi,%rbx` (either encoding): `this` kept in a callee-saved register.
        if matches!(insn.code(), Code::Mov_r64_rm64 | Code::Mov_rm64_r64)
            && insn.op0_kind() == OpKind::Register
            && insn.op1_kind() == OpKind::Register
            && insn.op1_register() == Register::RDI
        {
            this.push(insn.op0_register());
        }
        let Some((base, member)) = mem(insn, Code::Mov_r64_rm64) else {
            continue;
        };
        if !this.contains(&base) {
            continue;
        }
        let reg = insn.op0_register();
        let (Some(load), Some(add)) = (insns.get(i + 1), insns.get(i + 2)) else {
            return None;
        };
        if let (Some((b1, a)), Some((b2, b))) =
            (mem(load, Code::Mov_r64_rm64), mem(add, Code::Add_r64_rm64))
            && b1 == reg
            && b2 == reg
            && load.op0_register() == Register::RAX
            && add.op0_register() == Register::RAX
        {
            return Some((
                u16::try_from(member).ok()?,
                u16::try_from(a).ok()?,
                u16::try_from(b).ok()?,
            ));
        }
    }
    None
}

/// `size_t AbstractAscendMemoryPoolSupport::GetVmmUsedMemSize() const`
/// (`plugin/ascend/libmindspore_ascend_res_manager.so`): with VMM on, the physical memory
/// MindSpore mapped, which `memory_reserved()` adds to the pool's own statistics.
pub const VMM_USED: &str =
    "_ZNK9mindspore6device6ascend31AbstractAscendMemoryPoolSupport17GetVmmUsedMemSizeEv";

/// Where `GetVmmUsedMemSize()` reads the mapped size: `AscendVmmAdapter::GetInstance()` is a
/// function-local static of the plugin (no symbol), inlined as a guard byte and two `size_t`
/// fields whose product is the size. Addresses are link-time (add the load bias).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmmAdapterRead {
    /// The static's initialisation guard: 0 while the adapter was never made (nothing mapped).
    pub guard: u64,
    /// The two fields multiplied (handle count and handle size).
    pub factors: (u64, u64),
}

/// The adapter read from the getter's code at link address `ip`: after the guard test
/// (`movzbl guard(%rip)`), `mov a(%rip),%rax; imul b(%rip),%rax`, both within the static
/// (a few dozen bytes after the guard). None for any other shape: no read on a guess.
pub fn vmm_adapter_in(code: &[u8], ip: u64) -> Option<VmmAdapterRead> {
    use iced_x86::{Code, Decoder, DecoderOptions, OpKind, Register};
    let rip_load = |insn: &iced_x86::Instruction| {
        (insn.op1_kind() == OpKind::Memory && insn.memory_base() == Register::RIP)
            .then(|| insn.memory_displacement64())
    };
    let (mut guard, mut first) = (None, None);
    for insn in Decoder::with_ip(64, code, ip, DecoderOptions::NONE) {
        match insn.code() {
            Code::Movzx_r32_rm8 if guard.is_none() => guard = rip_load(&insn),
            Code::Mov_r64_rm64 if guard.is_some() && first.is_none() => {
                first = rip_load(&insn).map(|a| (a, insn.op0_register()));
            }
            Code::Imul_r64_rm64 => {
                let (guard, (a, reg)) = (guard?, first?);
                let b = rip_load(&insn)?;
                let inside = |f: u64| f > guard && f - guard < 0x100;
                return (insn.op0_register() == reg && inside(a) && inside(b)).then_some(
                    VmmAdapterRead {
                        guard,
                        factors: (a, b),
                    },
                );
            }
            _ => {}
        }
    }
    None
}

/// What a running MindSpore process held on the device when the tracer attached (`--pid`),
/// as its Ascend plugin's VMM adapter tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeforeAttach {
    /// VMM in use: the physical memory mapped (`memory_reserved()`'s VMM part).
    VmmMapped(u64),
    /// The adapter was never made: VMM off, so the pool's own reserved counters, read by its
    /// probes, are `memory_reserved()` (with VMM they count the reserved address range).
    NoVmm,
}

/// What the process held before the attach, read once from its memory (read-only) through
/// the adapter that `GetVmmUsedMemSize()` reads. Ok(None) when no Ascend plugin is loaded;
/// Err says why the getter could not be read (then nothing is guessed).
pub fn before_attach(pid: u32) -> Result<Option<BeforeAttach>, String> {
    const LIB: &str = "/libmindspore_ascend_res_manager.so";
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| e.to_string())?;
    let mappings: Vec<(u64, u64, u64, &str)> = maps
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (range, path) = (f.first()?, *f.get(5)?);
            let (lo, hi) = range.split_once('-')?;
            let hex = |s: &str| u64::from_str_radix(s, 16).ok();
            path.ends_with(LIB)
                .then_some((hex(lo)?, hex(hi)?, hex(f.get(2)?)?, path))
        })
        .collect();
    let Some(&(_, _, _, path)) = mappings.first() else {
        return Ok(None);
    };
    let host = std::path::PathBuf::from(format!("/proc/{pid}/root{path}"));
    let lookup = memscope_symbols::elf::Lookup {
        names: &[VMM_USED],
        scan: None,
        cold_of: &|_| false,
    };
    let obj = memscope_symbols::elf::ElfObject::open_lookup(&host, &lookup)
        .map_err(|e| format!("{path}: {e}"))?;
    let getter = obj
        .function(VMM_USED)
        .ok_or_else(|| format!("{path} does not export GetVmmUsedMemSize()"))?;
    let mut code = vec![0u8; getter.size.min(4096) as usize];
    File::open(&host)
        .and_then(|f| f.read_exact_at(&mut code, getter.file_offset))
        .map_err(|e| format!("{path}: {e}"))?;
    let adapter = vmm_adapter_in(&code, getter.address).ok_or_else(|| {
        format!("GetVmmUsedMemSize() in {path} is not the code this tracer reads")
    })?;
    // The load bias, from the mapping that holds the getter's code.
    let &(start, _, offset, _) = mappings
        .iter()
        .find(|&&(lo, hi, off, _)| {
            getter.file_offset >= off && getter.file_offset < off + (hi - lo)
        })
        .ok_or_else(|| format!("{path}: the getter's code is not mapped"))?;
    let bias = (start + (getter.file_offset - offset)).wrapping_sub(getter.address);
    let mem = File::open(format!("/proc/{pid}/mem")).map_err(|e| e.to_string())?;
    let read = |addr: u64, len: usize| -> Result<u64, String> {
        let mut b = [0u8; 8];
        mem.read_exact_at(&mut b[..len], addr.wrapping_add(bias))
            .map_err(|e| format!("pid {pid} memory at {:#x}: {e}", addr.wrapping_add(bias)))?;
        Ok(u64::from_le_bytes(b))
    };
    if read(adapter.guard, 1)? == 0 {
        return Ok(Some(BeforeAttach::NoVmm));
    }
    let (a, b) = (read(adapter.factors.0, 8)?, read(adapter.factors.1, 8)?);
    Ok(Some(BeforeAttach::VmmMapped(a.saturating_mul(b))))
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

    #[test]
    fn the_reserved_counters_of_mindspore_2_10() {
        // TotalMemStatistics() of libmindspore_memory_pool.so (2.10.0, at 0x46320), up to
        // the branch without VMM and its jmp back.
        let code = [
            0x53, 0x48, 0x89, 0xfb, 0x48, 0x83, 0xec, 0x10, 0x64, 0x48, 0x8b, 0x04, 0x25, 0x28,
            0x00, 0x00, 0x00, 0x48, 0x89, 0x44, 0x24, 0x08, 0x31, 0xc0, 0x48, 0x8b, 0x07, 0x48,
            0x8b, 0x80, 0x20, 0x01, 0x00, 0x00, 0x48, 0x3b, 0x05, 0x0f, 0x87, 0x07, 0x00, 0x75,
            0x6d, 0x0f, 0xb6, 0x87, 0xe8, 0x00, 0x00, 0x00, 0x84, 0xc0, 0x74, 0x4a, 0x48, 0x8b,
            0x03, 0x48, 0x8b, 0x78, 0xe8, 0x48, 0x01, 0xdf, 0x48, 0x8b, 0x07, 0x48, 0x8b, 0x90,
            0xe0, 0x00, 0x00, 0x00, 0x31, 0xc0, 0x48, 0x3b, 0x15, 0x5d, 0x8a, 0x07, 0x00, 0x75,
            0x4b, 0x48, 0x8b, 0x93, 0xd8, 0x00, 0x00, 0x00, 0x48, 0x03, 0x42, 0x18, 0x48, 0x8b,
            0x4c, 0x24, 0x08, 0x64, 0x48, 0x33, 0x0c, 0x25, 0x28, 0x00, 0x00, 0x00, 0x75, 0x34,
            0x48, 0x83, 0xc4, 0x10, 0x5b, 0xc3, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x48, 0x8b, 0x93, 0xd8, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x42, 0x18, 0x48,
            0x03, 0x42, 0x10, 0xeb, 0xcf,
        ];
        assert_eq!(reserved_counters_in(&code), Some((0xd8, 0x18, 0x10)));
        // Without the branch without VMM (cut before it): nothing, not the VMM branch's one
        // counter.
        assert_eq!(reserved_counters_in(&code[..0x80]), None);
        // The add through another register than the loaded member: not this shape.
        let mut other = code;
        other[0x8d] = 0x43;
        assert_eq!(reserved_counters_in(&other), None);
    }

    #[test]
    fn the_vmm_adapter_of_mindspore_2_10() {
        // GetVmmUsedMemSize() of libmindspore_ascend_res_manager.so (2.10.0, at 0x233b260):
        // the virtual IsEnableVmm() call, then the guard 0x2f462f8 and
        // *(0x2f46318) * *(0x2f46308).
        let code = [
            0x55, 0x48, 0x83, 0xec, 0x10, 0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0x00, 0x00, 0x00,
            0x48, 0x89, 0x44, 0x24, 0x08, 0x31, 0xc0, 0x48, 0x8b, 0x07, 0x48, 0x03, 0x78, 0xe8,
            0x48, 0x8b, 0x07, 0xff, 0x90, 0x88, 0x01, 0x00, 0x00, 0x41, 0x89, 0xc0, 0x31, 0xc0,
            0x45, 0x84, 0xc0, 0x75, 0x19, 0x48, 0x8b, 0x4c, 0x24, 0x08, 0x64, 0x48, 0x33, 0x0c,
            0x25, 0x28, 0x00, 0x00, 0x00, 0x75, 0x6d, 0x48, 0x83, 0xc4, 0x10, 0x5d, 0xc3, 0x0f,
            0x1f, 0x00, 0x0f, 0xb6, 0x05, 0x49, 0xb0, 0xc0, 0x00, 0x84, 0xc0, 0x74, 0x15, 0x48,
            0x8b, 0x05, 0x5e, 0xb0, 0xc0, 0x00, 0x48, 0x0f, 0xaf, 0x05, 0x46, 0xb0, 0xc0, 0x00,
            0xeb, 0xcb, 0x0f, 0x1f, 0x40, 0x00, 0x48, 0x8d, 0x3d, 0x29, 0xb0, 0xc0, 0x00, 0xe8,
            0x0c, 0x17, 0xf8, 0xfd, 0x85, 0xc0, 0x74, 0xdb, 0x48, 0x8d, 0x3d, 0x21, 0xb0, 0xc0,
            0x00, 0xe8, 0xec, 0x14, 0x00, 0x00, 0x48, 0x8d, 0x15, 0x15, 0xbd, 0xae, 0x00, 0x48,
            0x8d, 0x35, 0x0e, 0xb0, 0xc0, 0x00, 0x48, 0x8d, 0x3d, 0x77, 0x14, 0x00, 0x00, 0xe8,
            0x02, 0xf7, 0xf7, 0xfd, 0x48, 0x8d, 0x3d, 0xf3, 0xaf, 0xc0, 0x00, 0xe8, 0x36, 0x21,
            0xf8, 0xfd, 0xeb, 0xa7, 0xe8, 0xdf, 0xd9, 0xf7, 0xfd,
        ];
        assert_eq!(
            vmm_adapter_in(&code, 0x233b260),
            Some(VmmAdapterRead {
                guard: 0x2f462f8,
                factors: (0x2f46318, 0x2f46308)
            })
        );
        // Cut before the multiply: no size, no guess.
        assert_eq!(vmm_adapter_in(&code[..90], 0x233b260), None);
        // The same code at another address reads elsewhere, still relative to itself.
        let moved = vmm_adapter_in(&code, 0x1000).unwrap();
        assert_eq!(moved.guard, 0x2f462f8 - 0x233b260 + 0x1000);
        // A load from the stack instead of the static is not this shape.
        let mut other = code;
        other[85..90].copy_from_slice(&[0x8b, 0x44, 0x24, 0x08, 0x90]);
        assert_eq!(vmm_adapter_in(&other, 0x233b260), None);
    }
}
