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
        Some(s)
    }

    fn debug(&self) -> Option<DebugFrame<EndianSlice<'_, RunTimeEndian>>> {
        let data = self.debug_frame.as_ref()?;
        let mut s = DebugFrame::new(data, self.endian?);
        s.set_address_size(self.address_size);
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
