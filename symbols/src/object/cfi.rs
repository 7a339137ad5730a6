//! Call frame information: the FDE index over `.eh_frame` and `.debug_frame`, and the
//! unwind rules that hold at an address, owned so the unwinder borrows nothing.

use std::{collections::HashMap, sync::Arc};

use gimli::{
    BaseAddresses, CieOrFde, DebugFrame, EhFrame, EndianSlice, RunTimeEndian, UnwindContext,
    UnwindSection,
};

use super::ObjectInfo;

#[derive(Clone, Copy, Debug)]
pub(crate) struct FdeRange {
    start: u64,
    end: u64,
    offset: usize,
    debug_frame: bool,
}

/// Raw CFI sections and the addresses gimli needs for pointer encodings.
#[derive(Clone, Debug, Default)]
pub(crate) struct CfiSections {
    pub(crate) endian: Option<RunTimeEndian>,
    pub(crate) eh_frame: Option<(u64, Arc<[u8]>)>,
    pub(crate) debug_frame: Option<Arc<[u8]>>,
    pub(crate) eh_frame_hdr: Option<u64>,
    pub(crate) text: Option<u64>,
    pub(crate) got: Option<u64>,
    pub(crate) address_size: u8,
    /// An arm64 object: its CFI may hold `DW_CFA_AARCH64_negate_ra_state` (code built with
    /// `-mbranch-protection`), which shares its opcode with SPARC's `DW_CFA_GNU_window_save`
    /// and which gimli only reads as such when told the vendor; else every row of a function
    /// that signs its return address fails to parse.
    pub(crate) aarch64: bool,
}

impl CfiSections {
    fn bases(&self) -> BaseAddresses {
        let mut b = BaseAddresses::default();
        if let Some((addr, _)) = &self.eh_frame {
            b = b.set_eh_frame(*addr);
        }
        if let Some(a) = self.eh_frame_hdr {
            b = b.set_eh_frame_hdr(a);
        }
        if let Some(a) = self.text {
            b = b.set_text(a);
        }
        if let Some(a) = self.got {
            b = b.set_got(a);
        }
        b
    }

    fn eh(&self) -> Option<EhFrame<EndianSlice<'_, RunTimeEndian>>> {
        let (_, data) = self.eh_frame.as_ref()?;
        let mut s = EhFrame::new(data, self.endian?);
        s.set_address_size(self.address_size);
        if self.aarch64 {
            s.set_vendor(gimli::Vendor::AArch64);
        }
        Some(s)
    }

    fn debug(&self) -> Option<DebugFrame<EndianSlice<'_, RunTimeEndian>>> {
        let data = self.debug_frame.as_ref()?;
        let mut s = DebugFrame::new(data, self.endian?);
        s.set_address_size(self.address_size);
        if self.aarch64 {
            s.set_vendor(gimli::Vendor::AArch64);
        }
        Some(s)
    }

    /// Every FDE's address range, sorted; CIEs parsed once each.
    fn index(&self) -> Vec<FdeRange> {
        let bases = self.bases();
        let mut out = Vec::new();
        if let Some(eh) = self.eh() {
            index_section(&eh, &bases, false, &mut out);
        }
        if let Some(df) = self.debug() {
            index_section(&df, &bases, true, &mut out);
        }
        out.sort_by_key(|f| (f.start, f.debug_frame));
        out
    }
}

fn index_section<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    debug_frame: bool,
    out: &mut Vec<FdeRange>,
) where
    S: UnwindSection<EndianSlice<'a, RunTimeEndian>>,
    S::Offset: gimli::UnwindOffset<usize> + std::hash::Hash + Eq + Copy,
{
    let mut cies = HashMap::new();
    let mut entries = section.entries(bases);
    // A bound on entries keeps a hostile section from looping for long.
    for _ in 0..10_000_000 {
        let Ok(Some(entry)) = entries.next() else {
            break;
        };
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial.parse(|sec, b, off| {
            if let Some(c) = cies.get(&off) {
                return Ok(Clone::clone(c));
            }
            let c = sec.cie_from_offset(b, off)?;
            cies.insert(off, c.clone());
            Ok(c)
        });
        let Ok(fde) = fde else { continue };
        let start = fde.initial_address();
        let Some(end) = start.checked_add(fde.len()) else {
            continue;
        };
        if fde.len() == 0 {
            continue;
        }
        out.push(FdeRange {
            start,
            end,
            offset: fde.offset(),
            debug_frame,
        });
    }
}

/// How to recover a register in the caller, owned so the unwinder borrows nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Rule {
    Undefined,
    SameValue,
    Offset(i64),
    ValOffset(i64),
    Register(u16),
    Expression(Vec<u8>),
    ValExpression(Vec<u8>),
    Constant(u64),
    Unsupported,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CfaRule {
    RegisterOffset(u16, i64),
    Expression(Vec<u8>),
}

/// The unwind rules that hold at one address.
#[derive(Clone, Debug)]
pub(crate) struct UnwindRow {
    pub cfa: CfaRule,
    pub return_address_register: u16,
    pub rules: Vec<(u16, Rule)>,
    pub encoding: gimli::Encoding,
    pub endian: RunTimeEndian,
}

fn row_from<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    offset: usize,
    vaddr: u64,
    ctx: &mut UnwindContext<usize>,
    endian: RunTimeEndian,
) -> Option<UnwindRow>
where
    S: UnwindSection<EndianSlice<'a, RunTimeEndian>>,
    S::Offset: gimli::UnwindOffset<usize>,
{
    let fde = section
        .fde_from_offset(bases, S::Offset::from(offset), S::cie_from_offset)
        .ok()?;
    let encoding = fde.cie().encoding();
    let ra = fde.cie().return_address_register().0;
    let row = fde
        .unwind_info_for_address(section, bases, ctx, vaddr)
        .ok()?;
    let expr_bytes = |e: &gimli::UnwindExpression<usize>| -> Option<Vec<u8>> {
        let expr: gimli::Expression<EndianSlice<'a, RunTimeEndian>> = e.get(section).ok()?;
        Some(expr.0.slice().to_vec())
    };
    let cfa = match row.cfa() {
        gimli::CfaRule::RegisterAndOffset { register, offset } => {
            CfaRule::RegisterOffset(register.0, *offset)
        }
        gimli::CfaRule::Expression(e) => CfaRule::Expression(expr_bytes(e)?),
    };
    let rules = row
        .registers()
        .map(|(reg, rule)| {
            let r = match rule {
                gimli::RegisterRule::Undefined => Rule::Undefined,
                gimli::RegisterRule::SameValue => Rule::SameValue,
                gimli::RegisterRule::Offset(o) => Rule::Offset(*o),
                gimli::RegisterRule::ValOffset(o) => Rule::ValOffset(*o),
                gimli::RegisterRule::Register(r) => Rule::Register(r.0),
                gimli::RegisterRule::Expression(e) => {
                    expr_bytes(e).map_or(Rule::Unsupported, Rule::Expression)
                }
                gimli::RegisterRule::ValExpression(e) => {
                    expr_bytes(e).map_or(Rule::Unsupported, Rule::ValExpression)
                }
                gimli::RegisterRule::Constant(c) => Rule::Constant(*c),
                _ => Rule::Unsupported,
            };
            (reg.0, r)
        })
        .collect();
    Some(UnwindRow {
        cfa,
        return_address_register: ra,
        rules,
        encoding,
        endian,
    })
}

impl ObjectInfo {
    /// True when the object has CFI (`.eh_frame` or `.debug_frame`).
    pub fn has_cfi(&self) -> bool {
        self.cfi.eh_frame.is_some() || self.cfi.debug_frame.is_some()
    }

    /// Number of FDEs (building the index on first use).
    pub fn fde_count(&self) -> usize {
        self.cfi_index.get_or_init(|| self.cfi.index()).len()
    }

    /// The CFI row that holds at `vaddr`, if an FDE covers it.
    pub(crate) fn unwind_row(
        &self,
        vaddr: u64,
        ctx: &mut UnwindContext<usize>,
    ) -> Option<UnwindRow> {
        let index = self.cfi_index.get_or_init(|| self.cfi.index());
        let idx = index.partition_point(|f| f.start <= vaddr);
        let fde = index[..idx]
            .iter()
            .rev()
            .take(4)
            .find(|f| vaddr < f.end)
            .copied()?;
        let bases = self.cfi.bases();
        let endian = self.cfi.endian?;
        if fde.debug_frame {
            row_from(&self.cfi.debug()?, &bases, fde.offset, vaddr, ctx, endian)
        } else {
            row_from(&self.cfi.eh()?, &bases, fde.offset, vaddr, ctx, endian)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-assembled arm64 `.eh_frame` at 0x1000 for one function at 0x2000 as GCC
    /// describes it with `-mbranch-protection=standard`: `paciasp` (then
    /// `DW_CFA_AARCH64_negate_ra_state`), `stp x29, x30, [sp, #-16]!`, then the body.
    fn signed_function_eh_frame() -> Vec<u8> {
        let mut cie = vec![0, 0, 0, 0]; // CIE id
        cie.extend([1, b'z', b'R', 0]); // version 1, augmentation "zR"
        cie.extend([4, 0x78, 30]); // code align 4, data align -8, return address x30
        cie.extend([1, 0x1b]); // augmentation data: FDE pointers pcrel sdata4
        cie.extend([0x0c, 31, 0]); // DW_CFA_def_cfa sp, 0
        while !(cie.len() + 4).is_multiple_of(8) {
            cie.push(0); // DW_CFA_nop
        }
        let mut out = (cie.len() as u32).to_le_bytes().to_vec();
        out.extend(cie);
        let fde_at = out.len();
        let mut fde = ((fde_at + 4) as u32).to_le_bytes().to_vec(); // back to the CIE
        let pc_begin_at = 0x1000 + fde_at + 8;
        fde.extend((0x2000_i32 - pc_begin_at as i32).to_le_bytes());
        fde.extend(0x40_u32.to_le_bytes()); // 16 instructions
        fde.push(0); // no augmentation data
        fde.extend([0x41, 0x2d]); // advance 4; DW_CFA_AARCH64_negate_ra_state
        fde.extend([0x41, 0x0e, 16]); // advance 4; DW_CFA_def_cfa_offset 16
        fde.extend([0x80 | 29, 2, 0x80 | 30, 1]); // x29 at cfa-16, x30 at cfa-8
        while !(fde.len() + 4).is_multiple_of(8) {
            fde.push(0);
        }
        out.extend((fde.len() as u32).to_le_bytes());
        out.extend(fde);
        out.extend([0, 0, 0, 0]); // terminator
        out
    }

    fn row_at(aarch64: bool, vaddr: u64) -> Option<UnwindRow> {
        let cfi = CfiSections {
            endian: Some(RunTimeEndian::Little),
            eh_frame: Some((0x1000, Arc::from(signed_function_eh_frame()))),
            address_size: 8,
            aarch64,
            ..Default::default()
        };
        let fde = *cfi.index().first()?;
        let eh = cfi.eh()?;
        let mut ctx = UnwindContext::new();
        row_from(
            &eh,
            &cfi.bases(),
            fde.offset,
            vaddr,
            &mut ctx,
            RunTimeEndian::Little,
        )
    }

    /// Past `paciasp` the rows of a PAC-built arm64 function are read (the saved return
    /// address at cfa-8), which takes gimli's AArch64 vendor: without it the row fails to
    /// parse and the unwinder falls back to frame pointers or stops.
    #[test]
    fn rows_of_a_function_that_signs_its_return_address() {
        let row = row_at(true, 0x2010).expect("a row inside the function's body");
        assert_eq!(row.cfa, CfaRule::RegisterOffset(31, 16));
        assert!(
            row.rules.contains(&(30, Rule::Offset(-8))),
            "{:?}",
            row.rules
        );
        assert!(
            row.rules.contains(&(29, Rule::Offset(-16))),
            "{:?}",
            row.rules
        );
        // Before paciasp nothing is signed yet: the CIE's rules.
        assert!(row_at(true, 0x2000).is_some());
    }
}
