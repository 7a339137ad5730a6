//! The BPF stack each program needs through its deepest chain of calls, read from the built
//! object the way the kernel's verifier adds it up (`check_max_stack_depth`): every
//! subprogram's own stack (the farthest below `r10` it reaches, rounded up to 16 bytes as
//! with the JIT), summed along calls and `bpf_loop` callbacks. A kernel without private BPF
//! stacks (x86-64 before 6.13; the arm64 VM's 6.12) refuses a program whose chain passes 512
//! bytes: "combined stack size of N calls is M. Too large". Newer kernels load it anyway, so
//! a host test has to read the object to catch it.
//!
//! A static reading: every access in the code counts, where the verifier counts those on the
//! paths it walks, so it may say more than the kernel (`emit_python_stack` before the cut: 368
//! bytes here, 272 in 6.12's refusal), not less for the `r10`-based forms LLVM emits.

use std::collections::BTreeSet;

use aya_obj::generated::bpf_insn;

/// The kernel's limit (`MAX_BPF_STACK`).
pub const KERNEL_LIMIT: u32 = 512;

/// What our programs may use: room left under the kernel's limit for a compiler that lays
/// the same code out a little less tightly.
pub const BUDGET: u32 = 384;

/// One program's deepest chain: the subprograms from the program down, with each one's own
/// stack (bytes, rounded as the verifier does), and their sum.
#[derive(Debug)]
pub struct Chain {
    pub program: String,
    pub frames: Vec<(String, u32)>,
    pub total: u32,
}

const CLASS_LDX: u8 = 0x01;
const CLASS_ST: u8 = 0x02;
const CLASS_STX: u8 = 0x03;
const CLASS_ALU: u8 = 0x04;
const CLASS_ALU64: u8 = 0x07;
const CALL: u8 = 0x85;
const LD_IMM64: u8 = 0x18;
const MOV64_REG: u8 = 0xbf;
const ADD64_IMM: u8 = 0x07;
const PSEUDO_CALL: u8 = 1;
const PSEUDO_FUNC: u8 = 4;
const FRAME_POINTER: u8 = 10;

/// The deepest chain of every program in `object`.
pub fn chains(object: &[u8]) -> anyhow::Result<Vec<Chain>> {
    let mut obj = aya_obj::Object::parse(object)?;
    // Names of the functions, by their opcode sequence (calls are rewritten by the linking).
    let names: Vec<(String, Vec<u8>)> = obj
        .functions
        .values()
        .map(|f| {
            (
                f.name.clone(),
                f.instructions.iter().map(|i| i.code).collect(),
            )
        })
        .collect();
    let text_sections = obj.functions.keys().map(|(section, _)| *section).collect();
    obj.relocate_calls(&text_sections)
        .map_err(|e| anyhow::anyhow!("linking calls: {e}"))?;
    let mut out = Vec::new();
    for (name, program) in &obj.programs {
        let Some(func) = obj.functions.get(&program.function_key()) else {
            continue;
        };
        out.push(deepest_chain(name, &func.instructions, &names));
    }
    out.sort_by(|a, b| a.program.cmp(&b.program));
    Ok(out)
}

/// Splits a linked program into subprograms (entry and every call or callback target) and
/// follows its calls to the deepest sum.
fn deepest_chain(program: &str, insns: &[bpf_insn], names: &[(String, Vec<u8>)]) -> Chain {
    let mut starts = BTreeSet::from([0usize]);
    starts.extend((0..insns.len()).filter_map(|i| call_target(insns, i)));
    let starts: Vec<usize> = starts.into_iter().collect();
    let bounds: Vec<(usize, usize)> = starts
        .iter()
        .enumerate()
        .map(|(k, &s)| (s, starts.get(k + 1).copied().unwrap_or(insns.len())))
        .collect();
    let subprog_of = |at: usize| bounds.iter().position(|&(s, e)| s <= at && at < e);
    let depths: Vec<u32> = bounds
        .iter()
        .map(|&(s, e)| round_up(own_stack(&insns[s..e])))
        .collect();
    let callees: Vec<Vec<usize>> = bounds
        .iter()
        .map(|&(s, e)| {
            (s..e)
                .filter_map(|i| call_target(insns, i))
                .filter_map(subprog_of)
                .collect()
        })
        .collect();
    let label = |k: usize| {
        let (s, e) = bounds[k];
        let codes: Vec<u8> = insns[s..e].iter().map(|i| i.code).collect();
        names
            .iter()
            .find(|(_, c)| *c == codes)
            .map(|(n, _)| readable(n))
            .unwrap_or_else(|| format!("subprogram at insn {s}"))
    };
    // The call graph has no cycles (the verifier refuses recursion); the depth guard keeps a
    // malformed object from looping here.
    fn deepest(k: usize, depths: &[u32], callees: &[Vec<usize>], level: usize) -> Vec<usize> {
        let mut best: Vec<usize> = Vec::new();
        let mut best_sum = 0;
        if level < 16 {
            for &c in &callees[k] {
                let path = deepest(c, depths, callees, level + 1);
                let sum: u32 = path.iter().map(|&p| depths[p]).sum();
                if sum > best_sum || best.is_empty() {
                    best_sum = sum;
                    best = path;
                }
            }
        }
        let mut path = vec![k];
        path.extend(best);
        path
    }
    let path = deepest(0, &depths, &callees, 0);
    let frames: Vec<(String, u32)> = path.iter().map(|&k| (label(k), depths[k])).collect();
    Chain {
        program: program.to_string(),
        total: frames.iter().map(|f| f.1).sum(),
        frames,
    }
}

/// `python::emit_python_stack` for a Rust (v0) symbol of the probe crate, else the name.
fn readable(symbol: &str) -> String {
    let Some(at) = symbol.find("_5probe") else {
        return symbol.to_string();
    };
    let mut rest = &symbol[at + "_5probe".len()..];
    let mut parts = Vec::new();
    while let Some(digits) = rest.find(|c: char| !c.is_ascii_digit()).filter(|&d| d > 0) {
        let Ok(len) = rest[..digits].parse::<usize>() else {
            break;
        };
        let Some(part) = rest.get(digits..digits + len) else {
            break;
        };
        parts.push(part);
        rest = &rest[digits + len..];
    }
    if parts.is_empty() {
        symbol.to_string()
    } else {
        parts.join("::")
    }
}

/// The instruction a BPF-to-BPF call or a callback reference at `i` leads to.
fn call_target(insns: &[bpf_insn], i: usize) -> Option<usize> {
    let insn = insns[i];
    let pseudo = (insn.code == CALL && insn.src_reg() == PSEUDO_CALL)
        || (insn.code == LD_IMM64 && insn.src_reg() == PSEUDO_FUNC);
    if !pseudo {
        return None;
    }
    usize::try_from(i as i64 + insn.imm as i64 + 1).ok()
}

/// The farthest below the frame pointer a subprogram reaches: loads and stores through `r10`
/// and through registers set to `r10` plus a constant (the pointers handed to helpers).
fn own_stack(insns: &[bpf_insn]) -> u32 {
    // The constant offset from r10 each register holds, if it holds one.
    let mut at: [Option<i64>; 11] = [None; 11];
    at[FRAME_POINTER as usize] = Some(0);
    let mut deepest = 0i64;
    let mut reach = |offset: i64| deepest = deepest.max(-offset);
    let mut skip = false;
    for insn in insns {
        if skip {
            skip = false;
            continue;
        }
        let (dst, src) = (insn.dst_reg() as usize % 11, insn.src_reg() as usize % 11);
        let class = insn.code & 0x07;
        match class {
            CLASS_LDX => {
                if let Some(base) = at[src] {
                    reach(base + insn.off as i64);
                }
                at[dst] = None;
            }
            CLASS_ST | CLASS_STX => {
                if let Some(base) = at[dst] {
                    reach(base + insn.off as i64);
                }
            }
            CLASS_ALU64 if insn.code == MOV64_REG => at[dst] = at[src],
            CLASS_ALU64 if insn.code == ADD64_IMM => {
                if let Some(base) = at[dst] {
                    at[dst] = Some(base + insn.imm as i64);
                    reach(base + insn.imm as i64);
                }
            }
            CLASS_ALU | CLASS_ALU64 => at[dst] = None,
            _ if insn.code == LD_IMM64 => {
                at[dst] = None;
                skip = true;
            }
            _ if insn.code == CALL => at[..6].fill(None),
            _ => {}
        }
        at[FRAME_POINTER as usize] = Some(0);
    }
    deepest.max(0) as u32
}

/// A subprogram's stack as the verifier counts it with the JIT on.
fn round_up(bytes: u32) -> u32 {
    bytes.div_ceil(16) * 16
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(chain: &Chain) -> String {
        let frames: Vec<String> = chain
            .frames
            .iter()
            .map(|(name, bytes)| format!("{name} {bytes}"))
            .collect();
        format!(
            "{}: {} = {}",
            chain.program,
            frames.join(" + "),
            chain.total
        )
    }

    /// Every program's deepest call chain fits the budget, well under the 512 bytes older
    /// kernels allow (6.12 refused `call_return` at 528: no return-probed call recorded).
    #[test]
    fn every_program_fits_the_stack_budget() {
        let chains = chains(super::super::BPF_OBJECT).expect("the built object parses");
        assert!(
            chains.iter().any(|c| c.program == "call_return"),
            "the object holds the probe programs"
        );
        let report: Vec<String> = chains.iter().map(show).collect();
        println!("{}", report.join("\n"));
        let over: Vec<&String> = chains
            .iter()
            .zip(&report)
            .filter(|(c, _)| c.total > BUDGET)
            .map(|(_, r)| r)
            .collect();
        assert!(
            over.is_empty(),
            "over the {BUDGET}-byte stack budget (kernels before 6.13 refuse over \
             {KERNEL_LIMIT}):\n{over:#?}"
        );
    }

    fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> bpf_insn {
        let mut i = bpf_insn {
            code,
            _bitfield_align_1: [],
            _bitfield_1: Default::default(),
            off,
            imm,
        };
        i.set_dst_reg(dst);
        i.set_src_reg(src);
        i
    }

    /// The reading itself: direct stores, a pointer made from r10 for a helper, and a call's
    /// callee summed in.
    #[test]
    fn stack_reading_follows_pointers_and_calls() {
        let exit = insn(0x95, 0, 0, 0, 0);
        let prog = [
            insn(0x7b, 10, 1, -40, 0),        // *(u64 *)(r10 - 40) = r1
            insn(MOV64_REG, 2, 10, 0, 0),     // r2 = r10
            insn(ADD64_IMM, 2, 0, 0, -72),    // r2 += -72
            insn(CALL, 0, PSEUDO_CALL, 0, 1), // call +1
            exit,
            insn(0x7b, 10, 1, -200, 0), // callee: *(u64 *)(r10 - 200) = r1
            exit,
        ];
        let chain = deepest_chain("p", &prog, &[]);
        assert_eq!(
            chain.frames.iter().map(|f| f.1).collect::<Vec<_>>(),
            [80, 208]
        );
        assert_eq!(chain.total, 288);
    }
}
