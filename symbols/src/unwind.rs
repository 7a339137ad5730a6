//! Unwinding a captured user stack in user space: registers plus a bounded copy of the stack
//! bytes from `sp` upwards, walked with DWARF CFI (`.eh_frame` / `.debug_frame`), falling back
//! to frame-pointer chasing for code that has no CFI.

use gimli::{
    EndianSlice, Evaluation, EvaluationResult, Expression, Location, UnwindContext, Value,
};

use crate::{
    object::{CfaRule, Rule, UnwindRow},
    process::ProcessView,
    symbolize::Symbolizer,
};

/// The CPU architecture of the captured registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    /// Checked end to end in an arm64 VM (`cargo xtask test-aarch64`).
    Aarch64,
}

impl Arch {
    /// The architecture this program was built for (the one whose processes it traces).
    #[cfg(target_arch = "aarch64")]
    pub const HOST: Arch = Arch::Aarch64;
    #[cfg(not(target_arch = "aarch64"))]
    pub const HOST: Arch = Arch::X86_64;

    /// DWARF register numbers of (stack pointer, frame pointer).
    fn sp_fp(self) -> (u16, u16) {
        match self {
            Arch::X86_64 => (7, 6),
            Arch::Aarch64 => (31, 29),
        }
    }

    /// A return address as the code's caller wrote it, less any pointer authentication code.
    /// Code built with `-mbranch-protection` (Armv8.3+) signs the link register before it
    /// saves it (`paciasp`): the PAC sits in the bits above the user address space, so the
    /// saved value is no address until they are cleared (what `xpaclri` does, and the
    /// kernel's own unwinder). Linux gives user space at most 48 bits of addresses unless a
    /// program asks for more with an `mmap` hint, which no code mapping is.
    fn strip_pointer_auth(self, return_address: u64) -> u64 {
        match self {
            Arch::X86_64 => return_address,
            Arch::Aarch64 => return_address & ((1 << 48) - 1),
        }
    }

    /// The DWARF register holding the return address at function entry, if it is a real
    /// register (aarch64's link register); x86-64 keeps it on the stack.
    fn link_register(self) -> Option<u16> {
        match self {
            Arch::X86_64 => None,
            Arch::Aarch64 => Some(30),
        }
    }
}

/// Number of DWARF registers tracked (x86-64 uses 0..=16, aarch64 0..=31).
const NREGS: usize = 33;

/// Registers captured at the event, arch-neutral.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Regs {
    pub pc: u64,
    pub sp: u64,
    pub fp: u64,
    /// The link register (aarch64 only).
    pub lr: Option<u64>,
}

/// A copy of user stack memory: `data[0]` is the byte at address `base` (the captured sp).
#[derive(Clone, Copy, Debug)]
pub struct StackSnapshot<'a> {
    pub base: u64,
    pub data: &'a [u8],
}

impl StackSnapshot<'_> {
    /// Reads a little-endian u64 at `addr`; `None` outside the snapshot.
    pub fn read_u64(&self, addr: u64) -> Option<u64> {
        let off = usize::try_from(addr.checked_sub(self.base)?).ok()?;
        let bytes = self.data.get(off..off.checked_add(8)?)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }
}

/// Unwinding limits and switches.
#[derive(Clone, Copy, Debug)]
pub struct UnwindOptions {
    pub arch: Arch,
    /// Most frames returned (the first pc included).
    pub max_depth: usize,
    /// Use CFI; when false only frame pointers are followed.
    pub use_cfi: bool,
    /// Follow frame pointers where there is no CFI.
    pub use_frame_pointers: bool,
}

impl Default for UnwindOptions {
    fn default() -> Self {
        UnwindOptions {
            arch: Arch::HOST,
            max_depth: 128,
            use_cfi: true,
            use_frame_pointers: true,
        }
    }
}

/// Why unwinding stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The outermost frame was reached (return address undefined or zero).
    Complete,
    /// `max_depth` frames were produced and there were more.
    DepthLimit,
    /// A read fell outside the stack snapshot.
    OutsideSnapshot,
    /// No CFI and no usable frame pointer for a pc.
    NoUnwindInfo,
    /// The recovered pc is in no executable mapping, or the stack went the wrong way.
    InvalidFrame,
}

/// The result of unwinding: pcs innermost first (the first is the exact pc, the rest return
/// addresses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unwound {
    pub pcs: Vec<u64>,
    pub stop: StopReason,
    /// How many frames were found through frame pointers rather than CFI.
    pub frame_pointer_steps: usize,
}

impl Unwound {
    /// The stack is incomplete: anything but reaching the outermost frame.
    pub fn truncated(&self) -> bool {
        self.stop != StopReason::Complete
    }
}

/// Register values and which of them are known (a bit each): half the bytes of an
/// `[Option<u64>; NREGS]`, and it is copied a few times per frame.
#[derive(Clone, Copy)]
struct RegFile {
    values: [u64; NREGS],
    known: u64,
}

const _: () = assert!(NREGS <= 64);

impl RegFile {
    fn empty() -> Self {
        RegFile {
            values: [0; NREGS],
            known: 0,
        }
    }
    fn get(&self, r: u16) -> Option<u64> {
        let r = usize::from(r);
        (r < NREGS && self.known & (1 << r) != 0).then(|| self.values[r])
    }
    fn set(&mut self, r: u16, v: Option<u64>) {
        let r = usize::from(r);
        if r >= NREGS {
            return;
        }
        match v {
            Some(v) => {
                self.values[r] = v;
                self.known |= 1 << r;
            }
            None => self.known &= !(1 << r),
        }
    }
}

// Register files are small and short-lived; no point boxing them.
#[allow(clippy::large_enum_variant)]
enum Step {
    Next { pc: u64, regs: RegFile },
    End,
    Stop(StopReason),
}

/// Unwinds the stack of `regs` / `stack` through `view`, using objects from `symbolizer`'s
/// cache for CFI.
pub fn unwind(
    regs: &Regs,
    stack: &StackSnapshot<'_>,
    view: &ProcessView,
    symbolizer: &Symbolizer,
    options: &UnwindOptions,
) -> Unwound {
    let arch = options.arch;
    let (sp_reg, fp_reg) = arch.sp_fp();
    let mut file = RegFile::empty();
    file.set(sp_reg, Some(regs.sp));
    file.set(fp_reg, Some(regs.fp));
    if let Some(lr) = arch.link_register() {
        file.set(lr, regs.lr.map(|lr| arch.strip_pointer_auth(lr)));
    }
    let mut out = Unwound {
        pcs: Vec::new(),
        stop: StopReason::Complete,
        frame_pointer_steps: 0,
    };
    if regs.pc == 0 || options.max_depth == 0 {
        out.stop = if regs.pc == 0 {
            StopReason::InvalidFrame
        } else {
            StopReason::DepthLimit
        };
        return out;
    }
    let mut ctx = UnwindContext::new();
    let mut pc = regs.pc;
    out.pcs.push(pc);
    loop {
        let first = out.pcs.len() == 1;
        let step = step(
            pc, first, &file, stack, view, symbolizer, options, &mut ctx, &mut out,
        );
        match step {
            Step::End => break,
            Step::Stop(reason) => {
                out.stop = reason;
                break;
            }
            Step::Next { pc: next, regs } => {
                let old_sp = file.get(sp_reg).unwrap_or(0);
                let new_sp = regs.get(sp_reg).unwrap_or(0);
                if next == 0 {
                    break;
                }
                if new_sp <= old_sp
                    && !(first && new_sp == old_sp && arch.link_register().is_some())
                    || !view.is_executable(next)
                {
                    out.stop = StopReason::InvalidFrame;
                    break;
                }
                if out.pcs.len() >= options.max_depth {
                    out.stop = StopReason::DepthLimit;
                    break;
                }
                out.pcs.push(next);
                pc = next;
                file = regs;
            }
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn step(
    pc: u64,
    first: bool,
    regs: &RegFile,
    stack: &StackSnapshot<'_>,
    view: &ProcessView,
    symbolizer: &Symbolizer,
    options: &UnwindOptions,
    ctx: &mut UnwindContext<usize>,
    out: &mut Unwound,
) -> Step {
    // For return addresses look up the call instruction, which may be the last of its
    // function (calls to noreturn functions).
    let probe = if first { pc } else { pc - 1 };
    // The row of an address is computed once per view (the FDE search and the CFI program
    // run were most of an unwind's cost).
    if options.use_cfi
        && let Some(row) = view.caches().row(probe, || {
            let loc = view.lookup(probe)?;
            let obj = symbolizer.object(loc.module()?).ok()?;
            let vaddr = obj.file_offset_to_vaddr(loc.file_offset)?;
            obj.unwind_row(vaddr, ctx)
        })
    {
        return cfi_step(&row, regs, stack, options.arch, first);
    }
    if options.use_frame_pointers {
        out.frame_pointer_steps += 1;
        return fp_step(regs, stack, options.arch);
    }
    Step::Stop(StopReason::NoUnwindInfo)
}

fn fp_step(regs: &RegFile, stack: &StackSnapshot<'_>, arch: Arch) -> Step {
    let (sp_reg, fp_reg) = arch.sp_fp();
    let (Some(fp), Some(sp)) = (regs.get(fp_reg), regs.get(sp_reg)) else {
        return Step::Stop(StopReason::NoUnwindInfo);
    };
    if fp == 0 || fp < sp || fp % 8 != 0 {
        return Step::Stop(StopReason::NoUnwindInfo);
    }
    let (Some(saved_fp), Some(ra)) = (stack.read_u64(fp), stack.read_u64(fp.wrapping_add(8)))
    else {
        return Step::Stop(StopReason::OutsideSnapshot);
    };
    let mut next = *regs;
    next.set(fp_reg, Some(saved_fp));
    next.set(sp_reg, Some(fp.wrapping_add(16)));
    if let Some(lr) = arch.link_register() {
        next.set(lr, None);
    }
    if ra == 0 {
        return Step::End;
    }
    Step::Next {
        pc: arch.strip_pointer_auth(ra),
        regs: next,
    }
}

enum Eval {
    Value(u64),
    OutsideSnapshot,
    Failed,
}

fn evaluate(
    expr: &[u8],
    row: &UnwindRow,
    regs: &RegFile,
    stack: &StackSnapshot<'_>,
    initial: Option<u64>,
) -> Eval {
    let mut eval: Evaluation<EndianSlice<'_, gimli::RunTimeEndian>> =
        Expression(EndianSlice::new(expr, row.endian)).evaluation(row.encoding);
    eval.set_max_iterations(1000);
    if let Some(v) = initial {
        eval.set_initial_value(v);
    }
    let mut res = eval.evaluate();
    loop {
        res = match res {
            Ok(EvaluationResult::Complete) => break,
            Ok(EvaluationResult::RequiresRegister { register, .. }) => match regs.get(register.0) {
                Some(v) => eval.resume_with_register(Value::Generic(v)),
                None => return Eval::Failed,
            },
            Ok(EvaluationResult::RequiresMemory {
                address, size: 8, ..
            }) => match stack.read_u64(address) {
                Some(v) => eval.resume_with_memory(Value::Generic(v)),
                None => return Eval::OutsideSnapshot,
            },
            _ => return Eval::Failed,
        };
    }
    if let Some(v) = eval.value_result() {
        return match v {
            Value::Generic(v) | Value::U64(v) => Eval::Value(v),
            _ => Eval::Failed,
        };
    }
    match eval.as_result() {
        [piece] => match piece.location {
            Location::Address { address } => Eval::Value(address),
            _ => Eval::Failed,
        },
        _ => Eval::Failed,
    }
}

fn cfi_step(
    row: &UnwindRow,
    regs: &RegFile,
    stack: &StackSnapshot<'_>,
    arch: Arch,
    first: bool,
) -> Step {
    let (sp_reg, _) = arch.sp_fp();
    let cfa = match &row.cfa {
        CfaRule::RegisterOffset(r, off) => match regs.get(*r) {
            Some(v) => v.wrapping_add_signed(*off),
            None => return Step::Stop(StopReason::NoUnwindInfo),
        },
        CfaRule::Expression(e) => match evaluate(e, row, regs, stack, None) {
            Eval::Value(v) => v,
            Eval::OutsideSnapshot => return Step::Stop(StopReason::OutsideSnapshot),
            Eval::Failed => return Step::Stop(StopReason::NoUnwindInfo),
        },
    };
    // Registers without a rule keep their value (callee-saved by convention).
    let mut next = *regs;
    let mut ra_rule_seen = false;
    for (reg, rule) in &row.rules {
        let value = match rule {
            Rule::Undefined => None,
            Rule::SameValue => regs.get(*reg),
            Rule::Offset(o) => match stack.read_u64(cfa.wrapping_add_signed(*o)) {
                Some(v) => Some(v),
                None => return Step::Stop(StopReason::OutsideSnapshot),
            },
            Rule::ValOffset(o) => Some(cfa.wrapping_add_signed(*o)),
            Rule::Register(r) => regs.get(*r),
            Rule::Expression(e) => match evaluate(e, row, regs, stack, Some(cfa)) {
                Eval::Value(addr) => match stack.read_u64(addr) {
                    Some(v) => Some(v),
                    None => return Step::Stop(StopReason::OutsideSnapshot),
                },
                Eval::OutsideSnapshot => return Step::Stop(StopReason::OutsideSnapshot),
                Eval::Failed => None,
            },
            Rule::ValExpression(e) => match evaluate(e, row, regs, stack, Some(cfa)) {
                Eval::Value(v) => Some(v),
                Eval::OutsideSnapshot => return Step::Stop(StopReason::OutsideSnapshot),
                Eval::Failed => None,
            },
            Rule::Constant(c) => Some(*c),
            Rule::Unsupported => None,
        };
        if *reg == row.return_address_register {
            ra_rule_seen = true;
            if matches!(rule, Rule::Undefined) {
                // The outermost frame (e.g. `_start`) marks its return address undefined.
                return Step::End;
            }
        }
        next.set(*reg, value);
    }
    let ra = if ra_rule_seen {
        next.get(row.return_address_register)
    } else if first && arch.link_register() == Some(row.return_address_register) {
        // At the innermost frame the return address may still be in the link register.
        regs.get(row.return_address_register)
    } else {
        // No rule: gimli drops `DW_CFA_undefined`, which marks the outermost frame
        // (`_start`, thread entry points).
        return Step::End;
    };
    let Some(ra) = ra else {
        return Step::Stop(StopReason::NoUnwindInfo);
    };
    next.set(sp_reg, Some(cfa));
    if ra == 0 {
        return Step::End;
    }
    Step::Next {
        pc: arch.strip_pointer_auth(ra),
        regs: next,
    }
}
