//! x86-64: string addresses come from RIP-relative `lea`/`mov` (with REX.W), calls are
//! `call rel32`, and a call's argument is what was stored since the previous call.

use std::collections::HashMap;

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};

use super::{ByteStore, CallSite, Isa};

pub struct X86_64;

/// How many instructions before a call its argument's stores are looked for.
const CALL_WINDOW: usize = 32;

impl Isa for X86_64 {
    fn address_loads(&self, code: &[u8], address: u64, target: u64) -> Vec<u64> {
        let mut loads = Vec::new();
        for i in 0..code.len().saturating_sub(7) {
            let (rex, opcode, modrm) = (code[i], code[i + 1], code[i + 2]);
            if rex & 0xf8 != 0x48 || !(opcode == 0x8d || opcode == 0x8b) || modrm & 0xc7 != 0x05 {
                continue;
            }
            let disp = i32::from_le_bytes([code[i + 3], code[i + 4], code[i + 5], code[i + 6]]);
            let next = address + i as u64 + 7;
            if next.wrapping_add(disp as i64 as u64) == target {
                loads.push(address + i as u64);
            }
        }
        loads
    }

    fn direct_calls(&self, code: &[u8], address: u64, target: u64) -> Vec<u64> {
        let mut calls = Vec::new();
        for i in 0..code.len().saturating_sub(4) {
            if code[i] != 0xe8 {
                continue;
            }
            let rel = i32::from_le_bytes([code[i + 1], code[i + 2], code[i + 3], code[i + 4]]);
            let next = address + i as u64 + 5;
            if next.wrapping_add(rel as i64 as u64) == target {
                calls.push(address + i as u64);
            }
        }
        calls
    }

    fn direct_jumps(&self, code: &[u8], address: u64, target: u64) -> Vec<u64> {
        let mut jumps = Vec::new();
        for i in 0..code.len().saturating_sub(5) {
            // jmp rel32, and jcc rel32 (0f 80-8f)
            let (len, rel_at) = match (code[i], code[i + 1]) {
                (0xe9, _) => (5, i + 1),
                (0x0f, 0x80..=0x8f) => (6, i + 2),
                _ => continue,
            };
            let Some(rel) = code.get(rel_at..rel_at + 4) else {
                continue;
            };
            let rel = i32::from_le_bytes([rel[0], rel[1], rel[2], rel[3]]);
            let next = address + (i + len) as u64;
            if next.wrapping_add(rel as i64 as u64) == target {
                jumps.push(address + i as u64);
            }
        }
        jumps
    }

    fn call_sites(&self, code: &[u8], address: u64) -> Vec<CallSite> {
        let insns: Vec<Instruction> = Decoder::with_ip(64, code, address, DecoderOptions::NONE)
            .into_iter()
            .collect();
        let mut sites = Vec::new();
        for (i, insn) in insns.iter().enumerate() {
            if insn.mnemonic() != Mnemonic::Call || insn.op0_kind() != OpKind::NearBranch64 {
                continue;
            }
            let window = &insns[i.saturating_sub(CALL_WINDOW)..i];
            // Only the stores since the previous call build this call's argument.
            let window = match window.iter().rposition(|w| w.mnemonic() == Mnemonic::Call) {
                Some(p) => &window[p + 1..],
                None => window,
            };
            sites.push(CallSite {
                at: insn.ip(),
                target: insn.near_branch_target(),
                stores: byte_stores(window),
            });
        }
        sites
    }
}

/// The bytes written to `[base + disp]` (no index register), with the constants that
/// `xor r, r` and `mov r, imm` put in registers followed along the way.
fn byte_stores(window: &[Instruction]) -> Vec<ByteStore> {
    let mut regs: HashMap<Register, u64> = HashMap::new();
    let mut stores = Vec::new();
    for insn in window {
        let dest_reg = (insn.op0_kind() == OpKind::Register).then(|| insn.op0_register());
        match insn.mnemonic() {
            Mnemonic::Xor
                if insn.op1_kind() == OpKind::Register && dest_reg == Some(insn.op1_register()) =>
            {
                regs.insert(insn.op0_register().full_register(), 0);
            }
            Mnemonic::Mov if dest_reg.is_some() => {
                let full = insn.op0_register().full_register();
                match insn.op1_kind() {
                    OpKind::Immediate32 | OpKind::Immediate8 | OpKind::Immediate16 => {
                        regs.insert(full, insn.immediate(1));
                    }
                    _ => {
                        regs.remove(&full);
                    }
                }
            }
            Mnemonic::Mov
                if insn.op0_kind() == OpKind::Memory && insn.memory_index() == Register::None =>
            {
                let value = match insn.op1_kind() {
                    OpKind::Register => regs.get(&insn.op1_register().full_register()).copied(),
                    OpKind::Immediate8 | OpKind::Immediate16 | OpKind::Immediate32 => {
                        Some(insn.immediate(1))
                    }
                    _ => None,
                };
                let offset = insn.memory_displacement64() as i64;
                let width = insn.memory_size().size();
                for k in 0..width as i64 {
                    stores.push(ByteStore {
                        base: insn.memory_base() as u32,
                        offset: offset + k,
                        value: value.map(|v| (v >> (8 * k)) as u8),
                        width: width as u8,
                    });
                }
            }
            _ => {
                if let Some(r) = dest_reg {
                    regs.remove(&r.full_register());
                }
            }
        }
    }
    stores
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: u64 = 0x1000;

    #[test]
    fn a_call_comes_with_the_bytes_stored_since_the_previous_call() {
        let rsp = Register::RSP as u32;
        let code = [
            0xe8, 0x00, 0x00, 0x00,
            0x00, // call +0 (a previous call: its stores do not count)
            0xc6, 0x04, 0x24, 0x14, // mov byte [rsp], 0x14
            0x31, 0xc0, // xor eax, eax
            0x88, 0x44, 0x24, 0x02, // mov [rsp+2], al (0)
            0xb9, 0x01, 0x00, 0x00, 0x00, // mov ecx, 1
            0x66, 0x89, 0x4c, 0x24, 0x03, // mov [rsp+3], cx (1, 0)
            0x48, 0x89, 0x7c, 0x24, 0x08, // mov [rsp+8], rdi (unknown)
            0xe8, 0x10, 0x00, 0x00, 0x00, // call +0x10
        ];
        let sites = X86_64.call_sites(&code, AT);
        assert_eq!(sites.len(), 2);
        assert_eq!(
            (sites[0].at, sites[0].target, sites[0].stores.len()),
            (AT, AT + 5, 0)
        );
        let last = &sites[1];
        assert_eq!((last.at, last.target), (AT + 30, AT + 35 + 0x10));
        let byte = |offset: i64| {
            last.stores
                .iter()
                .rev()
                .find(|s| s.base == rsp && s.offset == offset)
                .map(|s| (s.value, s.width))
        };
        assert_eq!(byte(0), Some((Some(0x14), 1)));
        assert_eq!(byte(2), Some((Some(0), 1)));
        assert_eq!(byte(3), Some((Some(1), 2)));
        assert_eq!(byte(4), Some((Some(0), 2)));
        assert_eq!(byte(8), Some((None, 8)));
        assert_eq!(byte(1), None);
    }

    #[test]
    fn string_loads_and_direct_calls_are_found_by_their_targets() {
        let code = [
            0x90, // nop
            0x48, 0x8d, 0x3d, 0xf8, 0x0f, 0x00, 0x00, // lea rdi, [rip + 0xff8] -> 0x2000
            0x4c, 0x8b, 0x05, 0xf1, 0x0f, 0x00, 0x00, // mov r8, [rip + 0xff1] -> 0x2000
            0xe8, 0xec, 0xff, 0xff, 0xff, // call -0x14 -> AT
        ];
        assert_eq!(
            X86_64.address_loads(&code, AT, 0x2000),
            vec![AT + 1, AT + 8]
        );
        assert_eq!(X86_64.address_loads(&code, AT, 0x2001), Vec::<u64>::new());
        assert_eq!(X86_64.direct_calls(&code, AT, AT), vec![AT + 15]);
        assert_eq!(X86_64.direct_jumps(&code, AT, AT), Vec::<u64>::new());
    }

    #[test]
    fn tail_calls_are_found_by_their_targets() {
        let code = [
            0xe9, 0xfb, 0xff, 0xff, 0xff, // jmp -5 -> AT
            0x0f, 0x84, 0xf5, 0xff, 0xff, 0xff, // je -11 -> AT
            0xe8, 0xf0, 0xff, 0xff, 0xff, // call -16 -> AT (a call, not a jump)
        ];
        assert_eq!(X86_64.direct_jumps(&code, AT, AT), vec![AT, AT + 5]);
        assert_eq!(X86_64.direct_jumps(&code, AT, AT + 1), Vec::<u64>::new());
    }
}
