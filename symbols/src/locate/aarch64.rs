//! A64 (aarch64): every instruction is one little-endian 32-bit word, so the few forms the
//! search needs are fixed bit patterns, read here directly (the Arm ARM's encoding tables):
//! string addresses come from `adrp` + `add`/`ldr` (the page, then its low 12 bits) or `adr`,
//! calls are `bl imm26`, and a call's argument is what was stored since the previous call.
//!
//! Constants are followed through `movz`/`movn`/`movk` and register moves; any other
//! instruction forgets the registers it may write (its destination field, and for loads the
//! second and base registers), so a value is only ever known when it was set in plain sight.
//! Stores through a base register that changes afterwards (writeback, `sub sp`) are dropped:
//! their offsets no longer say where they went.

use super::{ByteStore, CallSite, Isa};

pub struct Aarch64;

/// How many instructions before a call its argument's stores are looked for.
const CALL_WINDOW: usize = 48;
/// How far after an `adrp` the `add`/`ldr` with its low bits is looked for.
const PAIR_WINDOW: usize = 64;
/// The register number that means `sp` as a base (and `xzr`/`wzr` as a source).
pub const SP: u32 = 31;

fn words(code: &[u8]) -> impl Iterator<Item = u32> + '_ {
    code.chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
}

fn sign_extend(value: u32, bits: u32) -> i64 {
    ((value as i64) << (64 - bits)) >> (64 - bits)
}

fn field(w: u32, lsb: u32, len: u32) -> u32 {
    (w >> lsb) & ((1 << len) - 1)
}

/// `bl`'s target.
fn bl_target(w: u32, pc: u64) -> Option<u64> {
    (w & 0xfc00_0000 == 0x9400_0000)
        .then(|| pc.wrapping_add((sign_extend(field(w, 0, 26), 26) * 4) as u64))
}

/// The target of `b`, `b.cond`, `cbz`/`cbnz` or `tbz`/`tbnz`.
fn jump_target(w: u32, pc: u64) -> Option<u64> {
    let offset = if w & 0xfc00_0000 == 0x1400_0000 {
        sign_extend(field(w, 0, 26), 26)
    } else if w & 0xff00_0010 == 0x5400_0000 || w & 0x7e00_0000 == 0x3400_0000 {
        sign_extend(field(w, 5, 19), 19)
    } else if w & 0x7e00_0000 == 0x3600_0000 {
        sign_extend(field(w, 5, 14), 14)
    } else {
        return None;
    };
    Some(pc.wrapping_add((offset * 4) as u64))
}

/// `blr`/`blraa`/`blrab`/`blraaz`/`blrabz` (an indirect call also ends an argument).
fn is_indirect_call(w: u32) -> bool {
    w & 0xfffffc1f == 0xd63f0000 || w & 0xfefff800 == 0xd63f0800
}

/// `adrp`'s page or `adr`'s address, with the destination register.
fn pc_relative(w: u32, pc: u64) -> Option<(u32, u64, bool)> {
    let imm = sign_extend(field(w, 29, 2) | (field(w, 5, 19) << 2), 21);
    match w & 0x9f00_0000 {
        0x9000_0000 => Some((
            field(w, 0, 5),
            (pc & !0xfff).wrapping_add((imm << 12) as u64),
            true,
        )),
        0x1000_0000 => Some((field(w, 0, 5), pc.wrapping_add(imm as u64), false)),
        _ => None,
    }
}

impl Isa for Aarch64 {
    fn address_loads(&self, code: &[u8], address: u64, target: u64) -> Vec<u64> {
        let insns: Vec<u32> = words(code).collect();
        let mut loads = Vec::new();
        for (i, &w) in insns.iter().enumerate() {
            let pc = address + 4 * i as u64;
            match pc_relative(w, pc) {
                Some((_, value, false)) if value == target => loads.push(pc),
                Some((rd, page, true)) if page == target & !0xfff => {
                    let low = target & 0xfff;
                    for (j, &next) in insns.iter().enumerate().skip(i + 1).take(PAIR_WINDOW) {
                        let rn = field(next, 5, 5);
                        // add Xd, Xn, #lo12 | ldr Xt, [Xn, #lo12] (scaled by 8)
                        let add = next & 0xffc0_0000 == 0x9100_0000
                            && u64::from(field(next, 10, 12)) == low;
                        let ldr = next & 0xffc0_0000 == 0xf940_0000
                            && u64::from(field(next, 10, 12)) * 8 == low;
                        if rn == rd && (add || ldr) {
                            loads.push(address + 4 * j as u64);
                        }
                        if matches!(pc_relative(next, 0), Some((r, _, _)) if r == rd) {
                            break;
                        }
                    }
                }
                _ => {}
            }
        }
        loads
    }

    fn direct_calls(&self, code: &[u8], address: u64, target: u64) -> Vec<u64> {
        words(code)
            .enumerate()
            .map(|(i, w)| (address + 4 * i as u64, w))
            .filter(|&(pc, w)| bl_target(w, pc) == Some(target))
            .map(|(pc, _)| pc)
            .collect()
    }

    fn direct_jumps(&self, code: &[u8], address: u64, target: u64) -> Vec<u64> {
        words(code)
            .enumerate()
            .map(|(i, w)| (address + 4 * i as u64, w))
            .filter(|&(pc, w)| jump_target(w, pc) == Some(target))
            .map(|(pc, _)| pc)
            .collect()
    }

    fn call_sites(&self, code: &[u8], address: u64) -> Vec<CallSite> {
        let insns: Vec<u32> = words(code).collect();
        let mut sites = Vec::new();
        for (i, &w) in insns.iter().enumerate() {
            let pc = address + 4 * i as u64;
            let Some(target) = bl_target(w, pc) else {
                continue;
            };
            let window = &insns[i.saturating_sub(CALL_WINDOW)..i];
            // Only the stores since the previous call build this call's argument.
            let window = match window
                .iter()
                .rposition(|&w| bl_target(w, 0).is_some() || is_indirect_call(w))
            {
                Some(p) => &window[p + 1..],
                None => window,
            };
            sites.push(CallSite {
                at: pc,
                target,
                stores: byte_stores(window),
            });
        }
        sites
    }
}

/// A store with an immediate offset: (source register, base, offset, bytes per register,
/// registers stored, source is a general register).
struct Store {
    rt: u32,
    rt2: Option<u32>,
    base: u32,
    offset: i64,
    width: u32,
    general: bool,
    writeback: bool,
}

/// The immediate-offset stores (`str`/`strb`/`strh`/`stur*`/`stp`, general and SIMD&FP).
/// Register-offset stores are left out, as on x86-64.
fn store(w: u32) -> Option<Store> {
    let (rt, rn, rt2) = (field(w, 0, 5), field(w, 5, 5), field(w, 10, 5));
    // Load/store register, unsigned immediate: size 111 V 01 opc imm12 Rn Rt.
    if w & 0x3b00_0000 == 0x3900_0000 {
        let (size, simd, opc) = (field(w, 30, 2), field(w, 26, 1) == 1, field(w, 22, 2));
        let width = match (simd, opc) {
            (false, 0) => 1 << size,
            (true, 0) => 1 << size,
            (true, 2) if size == 0 => 16,
            _ => return None, // a load (or prefetch)
        };
        return Some(Store {
            rt,
            rt2: None,
            base: rn,
            offset: i64::from(field(w, 10, 12)) * i64::from(width),
            width,
            general: !simd,
            writeback: false,
        });
    }
    // Load/store register, imm9: size 111 V 00 opc 0 imm9 idx Rn Rt (unscaled, post, pre).
    if w & 0x3b20_0000 == 0x3800_0000 && field(w, 10, 2) != 2 {
        let (size, simd, opc) = (field(w, 30, 2), field(w, 26, 1) == 1, field(w, 22, 2));
        let width = match (simd, opc) {
            (_, 0) => 1 << size,
            (true, 2) if size == 0 => 16,
            _ => return None,
        };
        let post = field(w, 10, 2) == 1;
        return Some(Store {
            rt,
            rt2: None,
            base: rn,
            offset: if post {
                0
            } else {
                sign_extend(field(w, 12, 9), 9)
            },
            width,
            general: !simd,
            writeback: writes_back(w),
        });
    }
    // Load/store pair: opc 101 V 0 idx L imm7 Rt2 Rn Rt (idx 00 no-allocate and 10 offset,
    // 01 post, 11 pre).
    if w & 0x3a40_0000 == 0x2800_0000 {
        let (opc, simd) = (field(w, 30, 2), field(w, 26, 1) == 1);
        let width = match (simd, opc) {
            (false, 0) => 4,
            (false, 2) => 8,
            (true, 0) => 4,
            (true, 1) => 8,
            (true, 2) => 16,
            _ => return None,
        };
        let post = field(w, 23, 2) == 1;
        return Some(Store {
            rt,
            rt2: Some(rt2),
            base: rn,
            offset: if post {
                0
            } else {
                sign_extend(field(w, 15, 7), 7) * i64::from(width)
            },
            width,
            general: !simd,
            writeback: writes_back(w),
        });
    }
    None
}

/// The constant an instruction puts in a general register, given those known before:
/// `movz`, `movn`, `movk` and `mov Rd, Rm` (`orr Rd, zr, Rm`). `None`: not such an instruction.
fn constant(w: u32, regs: &[Option<u64>; 32]) -> Option<(u32, Option<u64>)> {
    let rd = field(w, 0, 5);
    let is64 = field(w, 31, 1) == 1;
    let mask = if is64 { u64::MAX } else { u32::MAX as u64 };
    // Move wide: sf opc 100101 hw imm16 Rd.
    if w & 0x1f80_0000 == 0x1280_0000 {
        let shift = 16 * field(w, 21, 2);
        let imm = u64::from(field(w, 5, 16)) << shift;
        let value = match field(w, 29, 2) {
            0 => Some(!imm & mask),
            2 => Some(imm),
            3 => regs[rd as usize].map(|v| (v & !(0xffff << shift) | imm) & mask),
            _ => return None,
        };
        return Some((rd, value));
    }
    // orr Rd, zr, Rm (no shift): `mov`.
    if w & 0x7fe0_ffe0 == 0x2a00_03e0 {
        let rm = field(w, 16, 5) as usize;
        return Some((
            rd,
            if rm == 31 {
                Some(0)
            } else {
                regs[rm].map(|v| v & mask)
            },
        ));
    }
    None
}

/// The bytes written to `[base + imm]`, with the constants put in registers followed along.
fn byte_stores(window: &[u32]) -> Vec<ByteStore> {
    let mut regs: [Option<u64>; 32] = [None; 32];
    let mut stores: Vec<ByteStore> = Vec::new();
    for &w in window {
        if let Some((rd, value)) = constant(w, &regs) {
            if rd != 31 {
                regs[rd as usize] = value;
            }
            continue;
        }
        if let Some(s) = store(w) {
            let value = |r: u32| match (s.general, r) {
                (true, 31) => Some(0),
                (true, r) => regs[r as usize],
                (false, _) => None,
            };
            for (k, r) in [Some(s.rt), s.rt2].into_iter().flatten().enumerate() {
                let v = value(r);
                let at = s.offset + (k as i64) * i64::from(s.width);
                for b in 0..i64::from(s.width) {
                    stores.push(ByteStore {
                        base: s.base,
                        offset: at + b,
                        value: v.filter(|_| b < 8).map(|v| (v >> (8 * b)) as u8),
                        width: s.width as u8,
                    });
                }
            }
            if s.writeback {
                stores.retain(|st| st.base != s.base);
            }
            continue;
        }
        forget_writes(w, &mut regs, &mut stores);
    }
    stores
}

/// What an instruction that is neither a tracked move nor a store may have changed: its
/// destination field always; for loads and stores also the second register and the base
/// (pair loads, writeback); `sp` through `add`/`sub` immediate.
fn forget_writes(w: u32, regs: &mut [Option<u64>; 32], stores: &mut Vec<ByteStore>) {
    let (rd, rn, rt2) = (field(w, 0, 5), field(w, 5, 5), field(w, 10, 5));
    let loads_and_stores = w & 0x0a00_0000 == 0x0800_0000;
    let mut written = vec![rd];
    if loads_and_stores {
        written.extend([rn, rt2]);
    }
    for r in written {
        if r != 31 {
            regs[r as usize] = None;
        }
    }
    // add/sub (immediate or extended register: the forms that can write sp) to sp, or a
    // load with writeback of its base: stores through that register are stale.
    let add_sub_sp = w & 0x1f00_0000 == 0x1100_0000 || w & 0x1f20_0000 == 0x0b20_0000;
    if add_sub_sp && rd == SP {
        stores.retain(|st| st.base != SP);
    }
    if loads_and_stores && writes_back(w) {
        stores.retain(|st| st.base != rn);
    }
}

/// Loads/stores that change their base register (pre/post-indexed).
fn writes_back(w: u32) -> bool {
    let pair = w & 0x3a00_0000 == 0x2800_0000 && matches!(field(w, 23, 2), 1 | 3);
    let single = w & 0x3b20_0000 == 0x3800_0000 && matches!(field(w, 10, 2), 1 | 3);
    pair || single
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: u64 = 0x10_0000;

    fn code(words: &[u32]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// The free report of torch_npu 2.1.0.post13 (aarch64) at 0x7da720, as objdump prints it.
    #[test]
    fn a_call_comes_with_the_bytes_stored_since_the_previous_call() {
        let code = code(&[
            0x94683808, // bl (a previous call: its stores do not count)
            0xf9403fe1, // ldr x1, [sp, #120]
            0x52800280, // mov w0, #0x14
            0x390263e0, // strb w0, [sp, #152]
            0x52802002, // mov w2, #0x100
            0xf940da64, // ldr x4, [x19, #432]
            0xcb1403f4, // neg x20, x20
            0xb9400023, // ldr w3, [x1]
            0xaa1a03e0, // mov x0, x26
            0x390267e3, // strb w3, [sp, #153]
            0x790137e2, // strh w2, [sp, #154]
            0x390273f7, // strb w23, [sp, #156]
            0xa90a53f6, // stp x22, x20, [sp, #160]
            0xa90c07ff, // stp xzr, x1, [sp, #192]
            0x94000000, // bl +0
        ]);
        let sites = Aarch64.call_sites(&code, AT);
        assert_eq!(sites.len(), 2);
        assert!(sites[0].stores.is_empty());
        let last = &sites[1];
        assert_eq!((last.at, last.target), (AT + 56, AT + 56));
        let byte = |offset: i64| {
            last.stores
                .iter()
                .rev()
                .find(|s| s.base == SP && s.offset == offset)
                .map(|s| (s.value, s.width))
        };
        assert_eq!(byte(152), Some((Some(0x14), 1)));
        assert_eq!(byte(153), Some((None, 1)), "w3 was loaded");
        assert_eq!(byte(154), Some((Some(0), 2)));
        assert_eq!(byte(155), Some((Some(1), 2)));
        assert_eq!(byte(156), Some((None, 1)));
        assert_eq!(byte(160), Some((None, 8)));
        assert_eq!(byte(168), Some((None, 8)), "x20 was negated");
        assert_eq!(byte(192), Some((Some(0), 8)), "xzr");
        assert_eq!(byte(200), Some((None, 8)));
        assert_eq!(byte(157), None);
    }

    #[test]
    fn constants_are_forgotten_when_overwritten_and_stale_stores_dropped() {
        let code = code(&[
            0x52800280, // mov w0, #0x14
            0x390263e0, // strb w0, [sp, #152]
            0xf9400fe0, // ldr x0, [sp, #24]: w0 is no longer 0x14
            0x390267e0, // strb w0, [sp, #153]
            0x52800281, // mov w1, #0x14
            0x72a00021, // movk w1, #0x1, lsl #16
            0x790273e1, // strh w1, [sp, #312]
            0x12800002, // mov w2, #-1 (movn)
            0x2a0203e3, // mov w3, w2
            0x39000be3, // strb w3, [sp, #2]
            0x94000000, // bl +0
            0x52800280, // mov w0, #0x14
            0x390263e0, // strb w0, [sp, #152]
            0xd10043ff, // sub sp, sp, #0x10: the store above is stale
            0x94000000, // bl +0
        ]);
        let sites = Aarch64.call_sites(&code, AT);
        let value = |site: &CallSite, offset: i64| {
            site.stores
                .iter()
                .rev()
                .find(|s| s.base == SP && s.offset == offset)
                .and_then(|s| s.value)
        };
        assert_eq!(value(&sites[0], 152), Some(0x14));
        assert_eq!(value(&sites[0], 153), None);
        assert_eq!(value(&sites[0], 312), Some(0x14));
        assert_eq!(value(&sites[0], 313), Some(0));
        assert_eq!(value(&sites[0], 2), Some(0xff));
        assert!(sites[1].stores.is_empty());
    }

    #[test]
    fn string_loads_and_direct_calls_are_found_by_their_targets() {
        // adrp x1, page(AT) + 0x1000; (other work); add x1, x1, #0x570
        // adrp x2, same page; ldr x0, [x2, #0x578]; adr x3, AT + 0x40; bl AT
        let code = code(&[
            0xd503201f, // nop
            0xb0000001, // adrp x1, +0x1000
            0xaa1303e0, // mov x0, x19
            0x9115c021, // add x1, x1, #0x570
            0xb0000002, // adrp x2, +0x1000
            0xf942bc40, // ldr x0, [x2, #0x578]
            0x10000143, // adr x3, +0x28 (AT + 0x40)
            0x97fffff9, // bl -0x1c (AT)
        ]);
        assert_eq!(Aarch64.address_loads(&code, AT, AT + 0x1570), vec![AT + 12]);
        assert_eq!(Aarch64.address_loads(&code, AT, AT + 0x1578), vec![AT + 20]);
        assert_eq!(Aarch64.address_loads(&code, AT, AT + 0x40), vec![AT + 24]);
        assert!(Aarch64.address_loads(&code, AT, AT + 0x1571).is_empty());
        assert_eq!(Aarch64.direct_calls(&code, AT, AT), vec![AT + 28]);
        assert!(Aarch64.direct_jumps(&code, AT, AT).is_empty());
    }

    #[test]
    fn tail_calls_are_found_by_their_targets() {
        let code = code(&[
            0x14000000, // b AT
            0x54ffffe0, // b.eq -4 (AT)
            0xb4ffffc0, // cbz x0, -8 (AT)
            0x3607ffa0, // tbz w0, #0, -12 (AT)
            0x97fffffc, // bl -16 (AT): a call, not a jump
        ]);
        assert_eq!(
            Aarch64.direct_jumps(&code, AT, AT),
            vec![AT, AT + 4, AT + 8, AT + 12]
        );
        assert!(Aarch64.direct_jumps(&code, AT, AT + 4).is_empty());
    }
}
