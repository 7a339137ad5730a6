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
