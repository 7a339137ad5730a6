//! aarch64: every instruction is 4 bytes. Measured in the arm64 VM (docs/placement.md,
//! `cargo xtask test-aarch64 --insn-cost`, Linux 6.12): the kernel simulates branches,
//! `adr`/`adrp`, the hints (`paciasp`, `bti c`) and the frame-record push `stp x29, x30,
//! [sp, #-N]!`, which is how compiled functions begin, and single-steps ALU and plain
//! load/store instructions. So the entry is already the cheap point: placement stays there.
//!
//! arm64 return sites (see `super::return_sites`). Every A64 instruction is one 32-bit
//! little-endian word, so the forms that end or leave a function are fixed bit patterns:
//!
//! * returns: `ret Xn`, and `retaa`/`retab` (authenticate the link register, then return);
//! * jumps that may leave the function: `b`, `b.cond`/`bc.cond`, `cbz`/`cbnz`, `tbz`/`tbnz`
//!   (targets outside the parts: a tail call), and the register branches `br`, `braa`,
//!   `brab`, `braaz`, `brabz` (indirect).
//!
//! A tail call (`b other` after the epilogue) is refused rather than probed: the function's
//! return value is only known when `other` returns, straight to our caller. `retaa`/`retab`
//! are refused too: the arm64 kernel neither single-steps a branch nor simulates these
//! (arch/arm64/kernel/probes/decode-insn.c simulates `b`, `bl`, `b.cond`, `cbz`, `tbz`, `br`,
//! `blr`, `ret`, `adr`, literal loads), so a probe there would not be installed. Both fall
//! back to a uretprobe, as on x86-64.

use super::Placement;

pub fn place(code: &[u8]) -> Placement {
    let first = code
        .get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .map(|w| format!("{w:#010x}"))
        .unwrap_or_default();
    Placement::entry(
        first,
        "aarch64 functions begin with instructions the kernel simulates (docs/placement.md)",
    )
}

/// What one instruction means for the function's exits.
#[derive(Debug, PartialEq, Eq)]
enum Exit {
    /// Neither a return nor a jump (calls included: they come back).
    None,
    Return,
    /// `retaa` / `retab`.
    AuthenticatedReturn,
    /// A direct jump to this address.
    Jump(u64),
    Indirect,
}

fn sign_extend(value: u32, bits: u32) -> i64 {
    let shift = 64 - bits;
    ((value as i64) << shift) >> shift
}

fn exit(word: u32, at: u64) -> Exit {
    // Unconditional branch (register): 1101011 opc:4 op2:5 op3:6 Rn:5 op4:5.
    if word >> 25 == 0b110_1011 {
        let opc = (word >> 21) & 0xf;
        let op3 = (word >> 10) & 0x3f;
        return match opc {
            0b0010 if op3 == 0 => Exit::Return,
            0b0010 => Exit::AuthenticatedReturn,
            // br, braaz/brabz (opc 0000) and braa/brab (1000).
            0b0000 | 0b1000 => Exit::Indirect,
            _ => Exit::None,
        };
    }
    let target = |imm: i64| Exit::Jump(at.wrapping_add_signed(imm * 4));
    if word & 0xfc00_0000 == 0x1400_0000 {
        // b imm26
        return target(sign_extend(word & 0x03ff_ffff, 26));
    }
    if word & 0xff00_0000 == 0x5400_0000 || word & 0x7e00_0000 == 0x3400_0000 {
        // b.cond / bc.cond imm19; cbz / cbnz imm19
        return target(sign_extend((word >> 5) & 0x7_ffff, 19));
    }
    if word & 0x7e00_0000 == 0x3600_0000 {
        // tbz / tbnz imm14
        return target(sign_extend((word >> 5) & 0x3fff, 14));
    }
    Exit::None
}

/// See `super::return_sites`: every `ret` in `parts` (start, code), provided no jump leaves
/// the parts and no return authenticates.
pub fn return_sites(parts: &[(u64, &[u8])]) -> Result<Vec<u64>, String> {
    let inside = |t: u64| {
        parts
            .iter()
            .any(|(start, code)| t >= *start && t < start + code.len() as u64)
    };
    let mut sites = Vec::new();
    for (start, code) in parts {
        if code.len() % 4 != 0 {
            return Err(format!("the code at {start:#x} is not whole instructions"));
        }
        for (i, insn) in code.chunks_exact(4).enumerate() {
            let at = start + 4 * i as u64;
            let word = u32::from_le_bytes(insn.try_into().expect("4 bytes"));
            match exit(word, at) {
                Exit::None => {}
                Exit::Return => sites.push(at),
                Exit::AuthenticatedReturn => {
                    return Err(format!(
                        "retaa/retab at {at:#x}, which the arm64 kernel cannot probe"
                    ));
                }
                Exit::Jump(t) if inside(t) => {}
                Exit::Jump(_) => {
                    return Err(format!(
                        "a jump at {at:#x} leaves the function (a tail call?)"
                    ));
                }
                Exit::Indirect => return Err(format!("indirect jump at {at:#x}")),
            }
        }
    }
    if sites.is_empty() {
        return Err("no return instruction".into());
    }
    Ok(sites)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(words: &[u32]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    // Encodings as aarch64-linux-gnu-as writes them.
    const PACIASP: u32 = 0xd503_233f;
    const AUTIASP: u32 = 0xd503_23bf;
    const RET: u32 = 0xd65f_03c0;
    const RET_X1: u32 = 0xd65f_0020;
    const RETAA: u32 = 0xd65f_0bff;
    const RETAB: u32 = 0xd65f_0fff;
    const BR_X16: u32 = 0xd61f_0200;
    const BRAAZ_X16: u32 = 0xd61f_081f | (16 << 5);
    const BL_FORWARD: u32 = 0x9400_0010;
    const BLR_X3: u32 = 0xd63f_0060;
    const NOP: u32 = 0xd503_201f;

    #[test]
    fn every_ret_is_a_site_and_calls_stay() {
        // paciasp; cbz x0, +12 (to the second epilogue); bl; autiasp; ret; blr x3; ret x1
        let c = code(&[
            PACIASP,
            0xb400_0060,
            BL_FORWARD,
            AUTIASP,
            RET,
            BLR_X3,
            RET_X1,
        ]);
        assert_eq!(return_sites(&[(0x1000, &c)]), Ok(vec![0x1010, 0x1018]));
    }

    #[test]
    fn jumps_out_authenticated_returns_and_indirect_jumps_are_refused() {
        // b +0x100: past the end, a tail call.
        let tail = code(&[NOP, 0x1400_0040, RET]);
        assert!(
            return_sites(&[(0x1000, &tail)])
                .unwrap_err()
                .contains("leaves")
        );
        // A backward b.ne, tbz and cbnz inside are fine.
        let inside = code(&[NOP, 0x54ff_ffe1, 0x3600_0000 | (0x3fff << 5), RET]);
        assert_eq!(return_sites(&[(0x1000, &inside)]), Ok(vec![0x100c]));
        for refused in [RETAA, RETAB, BR_X16, BRAAZ_X16] {
            assert!(return_sites(&[(0x1000, &code(&[NOP, refused, RET]))]).is_err());
        }
        assert!(return_sites(&[(0x1000, &code(&[NOP, BL_FORWARD]))]).is_err());
    }

    #[test]
    fn a_jump_into_the_cold_part_stays_inside() {
        // main: b.eq to the cold part at 0x2000 ((0x2000 - 0x1004) / 4 = 0x3ff); ret.
        let main = code(&[NOP, 0x5400_0000 | (0x3ff << 5), RET]);
        let cold = code(&[NOP, RET]);
        assert!(return_sites(&[(0x1000, &main)]).is_err());
        assert_eq!(
            return_sites(&[(0x1000, &main), (0x2000, &cold)]),
            Ok(vec![0x1008, 0x2004])
        );
    }
}
