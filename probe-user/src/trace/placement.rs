//! Probe placement: where in a probed function the entry (and return) uprobe goes.
//!
//! A uprobe replaces one instruction with a breakpoint. When it fires, the kernel must then
//! run the instruction it replaced: a few instructions it *emulates* in the trap handler, all
//! others it *single-steps out of line* (copy to the XOL page, a second trap after it). On this
//! project's reference machine (kernel 6.18, x86-64; `cargo xtask bench`, section "uprobe cost
//! by first instruction", numbers in `docs/benchmarks.md`) that is the difference between
//! ~0.5-2 µs and ~7-25 µs per hit. glibc `free` and our simulated `halMemFree` start with
//! `test %rdi,%rdi` (a NULL check), which is single-stepped; the `je` right after it is
//! emulated.
//!
//! The rule ([`Arch::place`]): walk the straight-line prologue from the entry; stop at the
//! first instruction the kernel emulates and put the probe there, provided every instruction
//! before it is *skippable*: it touches no memory, does not branch, and writes nothing but the
//! flags or a scratch register that carries no argument (rax, r10, r11). So at the probe point
//! the argument registers and the stack pointer (and so the return address at `[rsp]`, which
//! a uretprobe hijacks at its attach point) are exactly what they were at entry, and nothing
//! observable has happened yet. Because conditional branches are themselves emulated, the
//! walk never moves a probe *past* a branch on x86-64: an early return such as
//! `halMemFree(NULL)` still passes the probe and is recorded exactly as with entry placement.
//! (A rule that moved further, past a `je` to a `push`, would miss calls that take the early
//! return before the probe point; we do not need that, since the branch is as cheap a host.)
//!
//! The move is refused (the probe stays at the entry, and `--log-level=debug` says why) when:
//! the first instruction is already emulated; the prologue has a non-skippable instruction
//! before any emulated one; a direct branch anywhere in the function targets the skipped range
//! or the new probe point (the probe would fire on a path that did not enter the function);
//! the function's size is unknown (that check is impossible); or the bytes do not decode.
//! Indirect jumps (jump tables) into the first few prologue instructions are not checked:
//! compilers do not emit them.
//!
//! `MEMSCOPE_BPF_PLACEMENT=entry` (hidden, for benchmarks and tests) forces entry placement.
//!
//! The module is per architecture: [`Arch`] selects the decoder. x86-64 is implemented;
//! aarch64 (the usual Ascend host) has its hook and keeps entry placement until its emulation
//! table has been measured on an arm64 kernel.

use std::{fs::File, os::unix::fs::FileExt, path::Path};

/// Environment variable: `entry` forces the probe at the function's first instruction.
pub const PLACEMENT_ENV: &str = "MEMSCOPE_BPF_PLACEMENT";

/// How many instructions / bytes of prologue are examined at most.
const MAX_PROLOGUE_INSNS: usize = 16;
const MAX_PROLOGUE_BYTES: usize = 64;

/// The instruction set of the probed object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    /// From an ELF header (`e_machine`); `None` for other machines or a short header.
    pub fn from_elf_header(header: &[u8]) -> Option<Arch> {
        if header.len() < 20 || &header[..4] != b"\x7fELF" {
            return None;
        }
        let machine = match header[5] {
            1 => u16::from_le_bytes([header[18], header[19]]),
            2 => u16::from_be_bytes([header[18], header[19]]),
            _ => return None,
        };
        match machine {
            62 => Some(Arch::X86_64),
            183 => Some(Arch::Aarch64),
            _ => None,
        }
    }

    /// Chooses the probe offset (relative to the function start) for a function whose
    /// machine code is `code` (its whole body when `whole_function`, else a prefix).
    pub fn place(self, code: &[u8], whole_function: bool) -> Placement {
        match self {
            Arch::X86_64 => x86_64::place(code, whole_function),
            Arch::Aarch64 => aarch64::place(code),
        }
    }
}

/// Where the probe goes and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Offset from the function's first byte.
    pub offset: u64,
    /// Names of the instructions skipped (empty at the entry).
    pub skipped: Vec<String>,
    /// The instruction the probe sits on (empty when unknown).
    pub at: String,
    /// Why the probe is where it is.
    pub reason: String,
}

impl Placement {
    fn entry(at: impl Into<String>, reason: impl Into<String>) -> Self {
        Placement {
            offset: 0,
            skipped: Vec::new(),
            at: at.into(),
            reason: reason.into(),
        }
    }

    pub fn moved(&self) -> bool {
        self.offset != 0
    }

    /// For the debug log: `moved past test/... (...)` or `at entry: <reason>`.
    pub fn describe(&self) -> String {
        if self.moved() {
            format!("moved past {}: {}", self.skipped.join("/"), self.reason)
        } else {
            format!("at entry: {}", self.reason)
        }
    }
}

/// Placement for the function at `file_offset` (`size` bytes, 0 when unknown) of the ELF
/// file at `path`. Never fails: any problem keeps the entry, with the problem as reason.
pub fn choose(path: &Path, file_offset: u64, size: u64) -> Placement {
    if std::env::var(PLACEMENT_ENV).is_ok_and(|v| v == "entry") {
        return Placement::entry("", format!("{PLACEMENT_ENV}=entry"));
    }
    let len = if size > 0 {
        size.min(1 << 20) as usize
    } else {
        MAX_PROLOGUE_BYTES
    };
    match read_code(path, file_offset, len) {
        Ok((Some(arch), code)) => arch.place(&code, size > 0 && size <= 1 << 20),
        Ok((None, _)) => Placement::entry("", "not an x86-64 or aarch64 ELF object"),
        Err(e) => Placement::entry("", format!("cannot read the function's code: {e}")),
    }
}

/// The ELF machine of `path` and up to `len` bytes of code at `file_offset`.
fn read_code(
    path: &Path,
    file_offset: u64,
    len: usize,
) -> std::io::Result<(Option<Arch>, Vec<u8>)> {
    let file = File::open(path)?;
    let mut header = [0u8; 20];
    file.read_exact_at(&mut header, 0)?;
    let mut code = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = file.read_at(&mut code[got..], file_offset + got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    code.truncate(got);
    Ok((Arch::from_elf_header(&header), code))
}

/// The file offsets of every return instruction of a function, given as its parts (the
/// function, then any `<name>.cold` part the compiler split off), for return probes that are
/// plain uprobes on those instructions instead of a uretprobe. A uretprobe replaces the
/// return address on the stack with the kernel's trampoline, through which a C++ exception
/// cannot unwind: the program would end in `std::terminate`. A probe on the return
/// instruction changes nothing. `Err` says why the returns cannot all be found (no size, a
/// jump out of the parts such as a tail call, an indirect jump, an arm64 return the kernel
/// cannot probe, another architecture): the caller falls back to a uretprobe.
pub fn return_sites(path: &Path, parts: &[(u64, u64)]) -> Result<Vec<u64>, String> {
    let mut code = Vec::new();
    let mut arch = None;
    for &(file_offset, size) in parts {
        if size == 0 || size > 1 << 20 {
            return Err(format!("function size {size} unusable"));
        }
        match read_code(path, file_offset, size as usize) {
            Ok((Some(a), c)) if c.len() as u64 == size => {
                arch = Some(a);
                code.push((file_offset, c));
            }
            Ok((Some(_), _)) => return Err("the function's code is cut short".into()),
            Ok((None, _)) => return Err("neither x86-64 nor aarch64 code".into()),
            Err(e) => return Err(format!("cannot read the function's code: {e}")),
        }
    }
    let parts: Vec<(u64, &[u8])> = code.iter().map(|(o, c)| (*o, c.as_slice())).collect();
    match arch {
        Some(Arch::Aarch64) => aarch64::return_sites(&parts),
        _ => x86_64::return_sites(&parts),
    }
}

pub mod x86_64 {
    //! x86-64 rules. The emulation table below was measured on kernel 6.18 with
    //! `tests/fixtures/bench/uprobe_insns.S` (one function per instruction form, timed with a
    //! uprobe on its first instruction; `cargo xtask bench`, table "uprobe cost by first
    //! instruction" in docs/benchmarks.md):
    //!
    //! | emulated in the trap (~0.5-2 µs)     | single-stepped out of line (~7-25 µs)        |
    //! |--------------------------------------|----------------------------------------------|
    //! | `nop` (0x90, also `66 90`), `nopl`   | `endbr64`, `test`, `cmp`, `xor`, `mov` (all  |
    //! | (0f 1f /0, 3-5 bytes; the 5-byte one | forms), `lea` (incl. rip-relative), `sub     |
    //! | is further optimized by 6.18),       | $imm,%rsp`, `push $imm`, `ret`               |
    //! | `push %reg` (50+r, `41 50+r`),       |                                              |
    //! | `jcc` rel8/rel32, `jmp` rel, `call`  |                                              |
    //! | rel32                                |                                              |
    //!
    //! (The spread comes from the VM: an idle run gave ~0.55 µs against ~7-10 µs, a run
    //! beside a compile ~2 µs against ~20-30 µs.)
    //!
    //! Refused outright (the probe is never installed; the kernel says nothing at attach):
    //! `lock` and es/cs/ss/ds segment prefixes, `int3`/`int`, `hlt`, `in`/`out`, `cli`/`sti`,
    //! `iret`, `syscall`/`sysret`/`sysenter`, `ud2` and the other opcodes missing from the
    //! kernel's good-instruction tables (arch/x86/kernel/uprobes.c).
    use iced_x86::{
        Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic,
        OpAccess, Register,
    };

    use super::{MAX_PROLOGUE_BYTES, MAX_PROLOGUE_INSNS, Placement};

    /// Registers the six integer arguments arrive in, and the stack pointer.
    const PROTECTED: [Register; 7] = [
        Register::RDI,
        Register::RSI,
        Register::RDX,
        Register::RCX,
        Register::R8,
        Register::R9,
        Register::RSP,
    ];
    /// Scratch registers an instruction before the probe may write: no argument in them.
    const SCRATCH: [Register; 3] = [Register::RAX, Register::R10, Register::R11];

    pub fn name(insn: &Instruction) -> String {
        format!("{:?}", insn.mnemonic()).to_ascii_lowercase()
    }

    /// The kernel runs this instruction in the trap handler instead of single-stepping it.
    pub fn is_emulated(insn: &Instruction) -> bool {
        let plain = !insn.has_lock_prefix()
            && !insn.has_rep_prefix()
            && !insn.has_repne_prefix()
            && insn.segment_prefix() == Register::None;
        match insn.code() {
            // 0x90 and 0x66 0x90 (the kernel emulates "prefix* + nop" as a jump by 0).
            Code::Nopd | Code::Nopw | Code::Nopq => plain,
            // push %reg: 50+r, and 41 50+r for r8-r15 (a 66 prefix, push %r16, is not).
            Code::Push_r64 => plain,
            // Multi-byte nopl (0f 1f /0): emulated like 0x90 (measured for 3, 4 and 5
            // bytes; the 5-byte USDT nop is further optimized by 6.18).
            Code::Nop_rm16 | Code::Nop_rm32 | Code::Nop_rm64 => plain,
            _ => {
                (insn.is_jcc_short_or_near() || insn.is_jmp_short_or_near() || insn.is_call_near())
                    && plain
            }
        }
    }

    /// The kernel will not put a uprobe on this instruction at all.
    pub fn is_refused(insn: &Instruction) -> bool {
        if insn.is_invalid()
            || insn.has_lock_prefix()
            || matches!(
                insn.segment_prefix(),
                Register::ES | Register::CS | Register::SS | Register::DS
            )
        {
            return true;
        }
        matches!(
            insn.mnemonic(),
            Mnemonic::Int3
                | Mnemonic::Int
                | Mnemonic::Int1
                | Mnemonic::Into
                | Mnemonic::Hlt
                | Mnemonic::In
                | Mnemonic::Out
                | Mnemonic::Insb
                | Mnemonic::Insw
                | Mnemonic::Insd
                | Mnemonic::Outsb
                | Mnemonic::Outsw
                | Mnemonic::Outsd
                | Mnemonic::Cli
                | Mnemonic::Sti
                | Mnemonic::Iret
                | Mnemonic::Iretd
                | Mnemonic::Iretq
                | Mnemonic::Syscall
                | Mnemonic::Sysret
                | Mnemonic::Sysretq
                | Mnemonic::Sysenter
                | Mnemonic::Sysexit
                | Mnemonic::Sysexitq
                | Mnemonic::Ud0
                | Mnemonic::Ud1
                | Mnemonic::Ud2
                | Mnemonic::Lar
                | Mnemonic::Lsl
                | Mnemonic::Clts
                | Mnemonic::Invd
                | Mnemonic::Wbinvd
        )
    }

    /// `None` when `insn` may run before the probe point without changing what the probe
    /// sees or does; otherwise why not.
    fn not_skippable(insn: &Instruction, info: &mut InstructionInfoFactory) -> Option<String> {
        if is_refused(insn) {
            return Some("the kernel cannot probe or step it".into());
        }
        if insn.flow_control() != FlowControl::Next {
            return Some("it transfers control".into());
        }
        let info = info.info(insn);
        if !info.used_memory().is_empty() {
            return Some("it accesses memory".into());
        }
        for used in info.used_registers() {
            let written = matches!(
                used.access(),
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            );
            if !written {
                continue;
            }
            let full = used.register().full_register();
            if PROTECTED.contains(&full) {
                return Some(format!("it writes {:?}", used.register()));
            }
            if !SCRATCH.contains(&full) {
                return Some(format!("it writes {:?}", used.register()));
            }
        }
        None
    }

    /// See `super::return_sites`: every `ret` in `parts` (start, code), addressed as `start`
    /// is, provided no jump leaves the parts.
    pub fn return_sites(parts: &[(u64, &[u8])]) -> Result<Vec<u64>, String> {
        let inside = |t: u64| {
            parts
                .iter()
                .any(|(start, code)| t >= *start && t < start + code.len() as u64)
        };
        let mut sites = Vec::new();
        for (start, code) in parts {
            let mut decoder = Decoder::with_ip(64, code, *start, DecoderOptions::NONE);
            let mut insn = Instruction::default();
            while decoder.can_decode() {
                decoder.decode_out(&mut insn);
                let at = insn.ip();
                if insn.is_invalid() {
                    return Err(format!("cannot decode the instruction at {at:#x}"));
                }
                match insn.flow_control() {
                    FlowControl::Return => sites.push(at),
                    FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
                        if !inside(insn.near_branch_target()) =>
                    {
                        return Err(format!(
                            "{} at {at:#x} leaves the function (a tail call?)",
                            name(&insn)
                        ));
                    }
                    FlowControl::IndirectBranch => {
                        return Err(format!("indirect jump at {at:#x}"));
                    }
                    _ => {}
                }
            }
        }
        if sites.is_empty() {
            return Err("no return instruction".into());
        }
        Ok(sites)
    }

    pub fn place(code: &[u8], whole_function: bool) -> Placement {
        let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
        let mut info = InstructionInfoFactory::new();
        let mut insn = Instruction::default();
        let mut skipped = Vec::new();
        let mut point = None;
        while decoder.can_decode() && skipped.len() < MAX_PROLOGUE_INSNS {
            decoder.decode_out(&mut insn);
            let off = insn.ip();
            if insn.is_invalid() {
                return Placement::entry("", format!("cannot decode the instruction at +{off:#x}"));
            }
            if is_emulated(&insn) {
                if off == 0 {
                    return Placement::entry(
                        name(&insn),
                        format!("the first instruction, {}, is emulated", name(&insn)),
                    );
                }
                point = Some((off, name(&insn)));
                break;
            }
            if off == 0 && is_refused(&insn) {
                return Placement::entry(
                    name(&insn),
                    format!(
                        "the first instruction, {}, cannot be probed by the kernel and cannot \
                         be skipped: calls will not be seen",
                        name(&insn)
                    ),
                );
            }
            if let Some(why) = not_skippable(&insn, &mut info) {
                let first = if off == 0 {
                    format!("the first instruction, {}, is single-stepped", name(&insn))
                } else {
                    format!(
                        "{} at +{off:#x} comes before any emulated instruction",
                        name(&insn)
                    )
                };
                return Placement::entry(
                    skipped.first().cloned().unwrap_or_else(|| name(&insn)),
                    format!("{first} and cannot be skipped ({why})"),
                );
            }
            skipped.push(name(&insn));
            if insn.next_ip() as usize >= MAX_PROLOGUE_BYTES {
                break;
            }
        }
        let first = skipped.first().cloned().unwrap_or_default();
        let Some((offset, at)) = point else {
            return Placement::entry(
                first,
                "no emulated instruction early in the function (the first one is single-stepped)",
            );
        };
        if !whole_function {
            return Placement::entry(
                first,
                "the symbol has no size, so branches into the prologue cannot be ruled out",
            );
        }
        // Nothing may jump into the skipped range or onto the probe point itself: the probe
        // would then fire on a path that did not enter the function.
        let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
        while decoder.can_decode() {
            decoder.decode_out(&mut insn);
            if insn.is_invalid() {
                return Placement::entry(
                    first,
                    format!(
                        "the function body does not decode at +{:#x}, so branches into the \
                         prologue cannot be ruled out",
                        insn.ip()
                    ),
                );
            }
            let target = match insn.flow_control() {
                FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch => {
                    insn.near_branch_target()
                }
                _ => continue,
            };
            if target > 0 && target <= offset {
                return Placement::entry(
                    first,
                    format!(
                        "+{target:#x} is the target of a branch at +{:#x}",
                        insn.ip()
                    ),
                );
            }
        }
        let (verb, pronoun) = if skipped.len() == 1 {
            ("is", "it")
        } else {
            ("are", "them")
        };
        Placement {
            offset,
            reason: format!(
                "{at} at +{offset:#x} is emulated; {} {verb} single-stepped, and skipping \
                 {pronoun} changes no argument register, the stack pointer or memory",
                skipped.join("/")
            ),
            skipped,
            at,
        }
    }
}

pub mod aarch64;

#[cfg(test)]
mod tests {
    use super::*;

    fn x86(code: &[u8]) -> Placement {
        Arch::X86_64.place(code, true)
    }

    #[test]
    fn null_check_prologue_moves_to_the_branch() {
        // halMemFree: test %rdi,%rdi; je +0xe7; push %r12; ...; ret
        let code = [
            0x48, 0x85, 0xff, // test %rdi,%rdi
            0x0f, 0x84, 0x10, 0x00, 0x00, 0x00, // je +0x19
            0x41, 0x54, // push %r12
            0x55, // push %rbp
            0x48, 0x89, 0xfd, // mov %rdi,%rbp
            0x5d, 0x41, 0x5c, 0x31, 0xc0, 0xc3, // pop; pop; xor; ret
            0x90, 0x90, 0x90, 0x90, // pad
            0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3, // mov $1,%eax; ret
        ];
        let p = x86(&code);
        assert_eq!(p.offset, 3, "{p:?}");
        assert_eq!(p.skipped, ["test"]);
        assert_eq!(p.at, "je");
        assert!(p.describe().starts_with("moved past test: je at +0x3"));
    }

    #[test]
    fn glibc_style_endbr_then_null_check() {
        // endbr64; test %rdi,%rdi; je; ...
        let code = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x85, 0xff, 0x74, 0x02, 0x55, 0x5d, 0xc3, 0xc3,
        ];
        let p = x86(&code);
        assert_eq!(p.offset, 7);
        assert_eq!(p.skipped, ["endbr64", "test"]);
        // endbr64 then push: moves to the push.
        let p = x86(&[0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x57, 0x41, 0x5f, 0xc3]);
        assert_eq!((p.offset, p.at.as_str()), (4, "push"));
        // xor %eax,%eax (scratch) may be skipped too.
        let p = x86(&[0x31, 0xc0, 0x48, 0x85, 0xff, 0x74, 0x00, 0xc3]);
        assert_eq!(p.offset, 5);
    }

    #[test]
    fn stays_at_entry_when_the_first_instruction_is_emulated() {
        for code in [
            &[0x41, 0x57, 0x41, 0x5f, 0xc3][..], // push %r15
            &[0x55, 0x5d, 0xc3],                 // push %rbp
            &[0x90, 0xc3],                       // nop
            &[0x0f, 0x1f, 0x40, 0x00, 0xc3],     // nopl 0(%rax)
            &[0xe9, 0x00, 0x00, 0x00, 0x00],     // jmp
        ] {
            let p = x86(code);
            assert_eq!(p.offset, 0, "{p:?}");
            assert!(p.reason.contains("is emulated"), "{}", p.reason);
        }
    }

    #[test]
    fn stays_at_entry_when_the_prologue_is_not_skippable() {
        // mov %rdi,%rbp writes a non-scratch register.
        let p = x86(&[0x48, 0x89, 0xfd, 0x55, 0xc3]);
        assert_eq!(p.offset, 0);
        assert!(p.reason.contains("writes"), "{}", p.reason);
        // sub $8,%rsp changes the stack pointer.
        let p = x86(&[0x48, 0x83, 0xec, 0x08, 0x55, 0xc3]);
        assert_eq!(p.offset, 0);
        assert!(p.reason.contains("RSP"), "{}", p.reason);
        // mov %rsi,%rdi overwrites an argument.
        let p = x86(&[0x48, 0x89, 0xf7, 0x55, 0xc3]);
        assert_eq!(p.offset, 0);
        // cmpq $0,(%rdi): touches memory.
        let p = x86(&[0x48, 0x83, 0x3f, 0x00, 0x74, 0x00, 0xc3]);
        assert_eq!(p.offset, 0);
        assert!(p.reason.contains("memory"), "{}", p.reason);
        // ret first: control transfer.
        let p = x86(&[0xc3, 0x90]);
        assert_eq!(p.offset, 0);
        // lock-prefixed first instruction: the kernel refuses it.
        let p = x86(&[0xf0, 0x83, 0x07, 0x01, 0xc3]);
        assert!(p.reason.contains("cannot be probed"), "{}", p.reason);
        // only single-stepped, skippable instructions in the window
        let p = x86(&[0x48, 0x85, 0xff].repeat(30));
        assert_eq!(p.offset, 0);
        assert!(p.reason.contains("no emulated"), "{}", p.reason);
        // undecodable
        let p = x86(&[0x0f, 0xff]);
        assert_eq!(p.offset, 0);
    }

    #[test]
    fn stays_at_entry_when_something_branches_into_the_prologue() {
        // test; je 0 ... ; later a jmp back to +3 (the je).
        let code = [0x48, 0x85, 0xff, 0x74, 0x03, 0x55, 0x5d, 0xc3, 0xeb, 0xf9];
        let p = x86(&code);
        assert_eq!(p.offset, 0, "{p:?}");
        assert!(
            p.reason.contains("target of a branch at +0x8"),
            "{}",
            p.reason
        );
        // A jump back to the entry itself is fine (entry placement fires there too).
        let code = [0x48, 0x85, 0xff, 0x74, 0x03, 0x55, 0x5d, 0xc3, 0xeb, 0xf6];
        assert_eq!(x86(&code).offset, 3);
        // Unknown size: no move.
        let p = Arch::X86_64.place(&[0x48, 0x85, 0xff, 0x74, 0x00, 0xc3], false);
        assert_eq!(p.offset, 0);
        assert!(p.reason.contains("no size"));
    }

    #[test]
    fn elf_machine_and_aarch64_hook() {
        let mut h = [0u8; 20];
        h[..4].copy_from_slice(b"\x7fELF");
        h[5] = 1;
        h[18] = 62;
        assert_eq!(Arch::from_elf_header(&h), Some(Arch::X86_64));
        h[18] = 183;
        assert_eq!(Arch::from_elf_header(&h), Some(Arch::Aarch64));
        h[18] = 3;
        assert_eq!(Arch::from_elf_header(&h), None);
        let p = Arch::Aarch64.place(&[0x1f, 0x20, 0x03, 0xd5], true);
        assert_eq!(p.offset, 0);
        assert_eq!(p.at, "0xd503201f");
    }

    /// The real fixture library (built by `make -C tests/fixtures`; skipped when absent).
    #[test]
    fn fixture_library_placements() {
        let lib = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/build/lib/libascend_hal.so");
        if !lib.is_file() {
            eprintln!(
                "SKIPPED: {} not built (make -C tests/fixtures)",
                lib.display()
            );
            return;
        }
        let obj = memscope_symbols::ElfObject::open(&lib).unwrap();
        let at = |name: &str| {
            let f = obj.function(name).unwrap();
            choose(&lib, f.file_offset, f.size)
        };
        if std::env::var_os(PLACEMENT_ENV).is_some() {
            return;
        }
        let free = at("halMemFree");
        assert!(free.moved(), "{free:?}");
        assert_eq!(free.skipped, ["test"]);
        assert_eq!(free.at, "je");
        let release = at("halMemRelease");
        assert!(release.moved(), "{release:?}");
        let alloc = at("halMemAlloc");
        assert_eq!(alloc.offset, 0);
        assert_eq!(alloc.at, "push");
    }

    #[test]
    fn return_sites_cover_every_ret_and_refuse_jumps_out() {
        use x86_64::return_sites;
        // push rbp; test edi,edi; je +2; pop rbp; ret; pop rbp; ret
        let two = [0x55, 0x85, 0xff, 0x74, 0x02, 0x5d, 0xc3, 0x5d, 0xc3];
        assert_eq!(
            return_sites(&[(0x1000, &two[..])]),
            Ok(vec![0x1006, 0x1008])
        );
        // A tail call (jmp rel32 out of the function) and an indirect jump: not all returns
        // can be known.
        let tail = [0x55, 0x5d, 0xe9, 0x00, 0x10, 0x00, 0x00];
        assert!(
            return_sites(&[(0x1000, &tail[..])])
                .unwrap_err()
                .contains("leaves")
        );
        let indirect = [0xff, 0xe0, 0xc3];
        assert!(
            return_sites(&[(0x1000, &indirect[..])])
                .unwrap_err()
                .contains("indirect")
        );
        // A split-off cold part, reached by je and jumping back to the ret: both parts given.
        // main at 0x1000: je 0x2000 (0f 84 rel32); ret. cold at 0x2000: jmp 0x1006; ret.
        let main = [0x0f, 0x84, 0xfa, 0x0f, 0x00, 0x00, 0xc3];
        let cold = [0xe9, 0x01, 0xf0, 0xff, 0xff, 0xc3];
        assert!(return_sites(&[(0x1000, &main[..])]).is_err());
        assert_eq!(
            return_sites(&[(0x1000, &main[..]), (0x2000, &cold[..])]),
            Ok(vec![0x1006, 0x2005])
        );
        assert!(return_sites(&[(0x1000, &[0x55, 0x5d][..])]).is_err());
    }
}
