#!/usr/bin/env python3
"""An independent reading of libtorch_npu.so (x86-64 or aarch64): where the allocator's report function
`reportMemoryDataToNpuProfiler(const MemoryUsage&)` is, which MemoryUsage layout it reads and
how many direct calls it has, from capstone's disassembly (pip install capstone pyelftools numpy).

It shares no code with the tracer (probe-user/src/trace/torch_npu.rs) and reads the layout
another way: from the report function's own body (which argument bytes it loads: `+4` is
allocator_type after component_type came in), not from the callers' stores. Its output is the
table in probe-user/tests/data/torch_npu_x86_64.tsv (or torch_npu_aarch64.tsv: the instruction
set is the ELF header's):

    tests/tools/torch_npu_reading.py DIR/*/torch_npu/lib/libtorch_npu.so
"""
import bisect
import re
import struct
import sys

import capstone
import numpy
from capstone import arm64, x86
from elftools.elf.elffile import ELFFile

ANCHORS = (b"PTA CachingAllocator malloc: ", b"PTA CachingAllocator free: ")
REPORT_SYMBOL = "_ZN9torch_npu8profiler29reportMemoryDataToNpuProfilerERKNS0_11MemoryUsageE"


class Lib:
    def __init__(self, path):
        self.data = open(path, "rb").read()
        self.elf = ELFFile(open(path, "rb"))
        self.sections = [
            (s.name, s["sh_addr"], s["sh_offset"], s["sh_size"], s["sh_flags"], s["sh_type"])
            for s in self.elf.iter_sections()
        ]
        self.md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        self.md.detail = True
        self.functions = self.fde_table()
        self.starts = [f[0] for f in self.functions]

    def section(self, name):
        return next(s for s in self.sections if s[0] == name)

    def off(self, addr):
        for name, a, o, size, flags, typ in self.sections:
            if a and a <= addr < a + size and typ != "SHT_NOBITS":
                return o + addr - a
        raise KeyError(hex(addr))

    def fde_table(self):
        _, a, o, size, _, _ = self.section(".eh_frame_hdr")
        h = self.data[o : o + size]
        assert h[0] == 1 and h[3] == 0x3B, "unexpected .eh_frame_hdr encoding"
        count = struct.unpack_from("<I", h, 8)[0]
        out = []
        for i in range(count):
            loc, fde = struct.unpack_from("<ii", h, 12 + 8 * i)
            start, fde = a + loc, a + fde
            fo = self.off(fde)
            # length, CIE pointer, pc_begin (pcrel sdata4), pc_range (udata4)
            begin = fde + 8 + struct.unpack_from("<i", self.data, fo + 8)[0]
            assert begin == start, (hex(begin), hex(start))
            out.append((start, struct.unpack_from("<I", self.data, fo + 12)[0]))
        return out

    def function_at(self, pc):
        i = bisect.bisect_right(self.starts, pc) - 1
        if i < 0:
            return None
        start, length = self.functions[i]
        return (start, length) if pc < start + length else None

    def disasm(self, start, length):
        o = self.off(start)
        return list(self.md.disasm(self.data[o : o + length], start))

    def strings(self, needle):
        found = set()
        for name, a, o, size, flags, typ in self.sections:
            if not flags & 2 or flags & 4 or typ == "SHT_NOBITS":  # SHF_ALLOC, not SHF_EXECINSTR
                continue
            blob = self.data[o : o + size]
            for m in re.finditer(re.escape(needle), blob):
                found.add(a + blob.rfind(b"\0", 0, m.start()) + 1)
        return found

    def text(self):
        _, a, o, size, _, _ = self.section(".text")
        return a, self.data[o : o + size]

    def functions_referencing(self, targets):
        """Functions with an instruction whose RIP-relative operand is one of `targets`."""
        a, code = self.text()
        funcs = set()
        for m in re.finditer(rb"[\x48\x4c]\x8d[\x05\x0d\x15\x1d\x25\x2d\x35\x3d]", code):
            at = m.start()
            disp = struct.unpack_from("<i", code, at + 3)[0]
            if a + at + 7 + disp in targets:
                f = self.function_at(a + at)
                if f:
                    funcs.add(f)
        confirmed = set()
        for f in funcs:
            for insn in self.disasm(*f):
                for op in insn.operands:
                    if (
                        op.type == x86.X86_OP_MEM
                        and op.mem.base == x86.X86_REG_RIP
                        and insn.address + insn.size + op.mem.disp in targets
                    ):
                        confirmed.add(f)
        return confirmed

    def report_calls(self, func):
        """Direct call targets preceded (since the previous call) by `mov byte [r+d], 0x14`."""
        targets = set()
        seen_store = False
        for insn in self.disasm(*func):
            if insn.mnemonic == "call":
                op = insn.operands[0]
                if seen_store and op.type == x86.X86_OP_IMM:
                    targets.add(op.imm)
                seen_store = False
            elif insn.mnemonic == "mov" and len(insn.operands) == 2:
                dst, src = insn.operands
                if (
                    dst.type == x86.X86_OP_MEM
                    and dst.size == 1
                    and src.type == x86.X86_OP_IMM
                    and src.imm == 0x14
                ):
                    seen_store = True
        return targets

    def callers(self, target):
        a, code = self.text()
        n = 0
        for m in re.finditer(rb"\xe8", code):
            at = m.start()
            if at + 5 > len(code):
                continue
            if a + at + 5 + struct.unpack_from("<i", code, at + 1)[0] != target:
                continue
            f = self.function_at(a + at)
            if f and any(
                i.address == a + at and i.mnemonic == "call" for i in self.disasm(*f)
            ):
                n += 1
        return n

    def layout(self, target):
        """Which low bytes of its argument the report function loads: +4 means component_type
        came in (allocator_type moved from +3 to +4)."""
        f = self.function_at(target)
        arg = {"rdi"}
        low_bytes = set()
        for insn in self.disasm(*f):
            ops = insn.operands
            for op in ops:
                if op.type == x86.X86_OP_MEM and full(insn, op.mem.base) in arg and op.mem.index == 0:
                    if 0 <= op.mem.disp < 8:
                        low_bytes.update(range(op.mem.disp, op.mem.disp + op.size))
            copies = (
                insn.mnemonic == "mov"
                and len(ops) == 2
                and ops[0].type == ops[1].type == x86.X86_OP_REG
                and full(insn, ops[1].reg) in arg
            )
            if insn.mnemonic == "pop":
                continue  # an epilogue: the code after its `ret` still has the prologue's copies
            if insn.mnemonic == "call":
                arg -= CALLER_SAVED
                continue
            for reg in insn.regs_access()[1]:
                if copies:
                    arg.add(full(insn, reg))
                else:
                    arg.discard(full(insn, reg))
        if 4 in low_bytes:
            return "with_component"
        if 3 in low_bytes:
            return "original"
        return "unknown(%s)" % sorted(low_bytes)

    def symbol(self):
        symtab = self.elf.get_section_by_name(".symtab")
        if not symtab:
            return None
        for s in symtab.iter_symbols():
            if s.name == REPORT_SYMBOL:
                return s["st_value"]
        return None


CALLER_SAVED = {"rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11"}
GPR = {"a": "rax", "b": "rbx", "c": "rcx", "d": "rdx", "si": "rsi", "di": "rdi", "bp": "rbp", "sp": "rsp"}


def full(insn, reg):
    """The 64-bit register a (sub-)register belongs to."""
    if not reg:
        return None
    name = insn.reg_name(reg)
    m = re.fullmatch(r"r(\d+)[dwb]?", name)
    if m:
        return "r" + m.group(1)
    core = name.lstrip("re").rstrip("xlh") if name not in ("rip", "eip") else "rip"
    return GPR.get(core, GPR.get(name[1:], name))


class Arm64Lib(Lib):
    """The same questions about A64 code: strings come from `adrp` + `add`/`ldr` (or `adr`),
    calls are `bl`, the device-type byte is a `strb` of a register set to 0x14."""

    def __init__(self, path):
        super().__init__(path)
        self.md = capstone.Cs(capstone.CS_ARCH_ARM64, capstone.CS_MODE_ARM)
        self.md.detail = True

    def words(self):
        """The code as 32-bit words and their addresses (numpy: the cheap first passes below
        look at every instruction of ~60 MB; capstone confirms what they pick)."""
        if not hasattr(self, "_words"):
            a, code = self.text()
            w = numpy.frombuffer(code, dtype="<u4", count=len(code) // 4).astype(numpy.int64)
            self._words = w, a + 4 * numpy.arange(len(w), dtype=numpy.int64)
        return self._words

    def functions_referencing(self, targets):
        """Functions in which capstone's operands put one of `targets` in a register."""
        pages = {t & ~0xFFF for t in targets}
        w, pc = self.words()
        kind = w & 0x9F000000
        imm = ((w >> 29) & 3) | (((w >> 5) & 0x7FFFF) << 2)
        imm -= (imm & 0x100000) << 1
        adrp = (kind == 0x90000000) & numpy.isin((pc & ~0xFFF) + (imm << 12), list(pages))
        adr = (kind == 0x10000000) & numpy.isin(pc + imm, list(targets))
        funcs = set()
        for at in pc[adrp | adr]:
            f = self.function_at(int(at))
            if f:
                funcs.add(f)
        confirmed = set()
        for f in funcs:
            insns = self.disasm(*f)
            if not any(
                i.mnemonic in ("adrp", "adr") and i.operands[1].imm in pages | targets
                for i in insns
            ):
                continue
            page = {}
            for insn in insns:
                ops = insn.operands
                if insn.mnemonic == "adr" and ops[1].imm in targets:
                    confirmed.add(f)
                elif insn.mnemonic == "adrp":
                    page[ops[0].reg] = ops[1].imm
                elif insn.mnemonic == "add" and len(ops) == 3 and ops[2].type == arm64.ARM64_OP_IMM:
                    if ops[1].reg in page and page[ops[1].reg] + ops[2].imm in targets:
                        confirmed.add(f)
                elif insn.mnemonic == "ldr" and ops[1].type == arm64.ARM64_OP_MEM:
                    m = ops[1].mem
                    if m.base in page and page[m.base] + m.disp in targets:
                        confirmed.add(f)
        return confirmed

    def report_calls(self, func):
        """`bl` targets preceded (since the previous call) by `strb wN, [..]` with wN = 0x14."""
        targets = set()
        seen_store = False
        value = {}
        for insn in self.disasm(*func):
            ops = insn.operands
            if insn.mnemonic in ("bl", "blr"):
                if seen_store and insn.mnemonic == "bl":
                    targets.add(ops[0].imm)
                seen_store = False
                value = {}
            elif insn.mnemonic == "mov" and len(ops) == 2 and ops[1].type == arm64.ARM64_OP_IMM:
                value[ops[0].reg] = ops[1].imm
            elif insn.mnemonic == "strb":
                if value.get(ops[0].reg) == 0x14:
                    seen_store = True
            else:
                for reg in insn.regs_access()[1]:
                    value.pop(reg, None)
        return targets

    def callers(self, target):
        w, pc = self.words()
        imm = w & 0x3FFFFFF
        bl = (w & 0xFC000000 == 0x94000000) & (pc + 4 * (imm - ((imm & 0x2000000) << 1)) == target)
        n = 0
        for word, at in zip(w[bl], pc[bl]):  # capstone confirms the ones the arithmetic picks
            insn = next(self.md.disasm(struct.pack("<I", int(word)), int(at)))
            if insn.mnemonic == "bl" and insn.operands[0].imm == target:
                n += 1
        return n

    def layout(self, target):
        """Which low bytes of its argument (x0 and its copies) the report function loads."""
        f = self.function_at(target)
        arg = {"x0"}
        low_bytes = set()
        for insn in self.disasm(*f):
            ops = insn.operands
            name = lambda r: insn.reg_name(r) if r else None  # noqa: E731
            if insn.mnemonic.startswith("ld"):
                mem = [op for op in ops if op.type == arm64.ARM64_OP_MEM]
                if mem and name(mem[0].mem.base) in arg and not mem[0].mem.index:
                    size = {"b": 1, "h": 2}.get(insn.mnemonic[-1], 8 if name(ops[0].reg)[0] == "x" else 4)
                    d = mem[0].mem.disp
                    if 0 <= d < 8:
                        low_bytes.update(range(d, d + size))
                if mem and name(mem[0].mem.base) == "sp":
                    continue  # an epilogue's restores: the code after its `ret` keeps the copies
            if insn.mnemonic == "bl":
                arg -= {"x%d" % r for r in range(19)}
                continue
            copies = (
                insn.mnemonic == "mov"
                and len(ops) == 2
                and ops[1].type == arm64.ARM64_OP_REG
                and name(ops[1].reg) in arg
            )
            for reg in insn.regs_access()[1]:
                if copies:
                    arg.add(name(reg))
                else:
                    arg.discard(name(reg))
        if 4 in low_bytes:
            return "with_component"
        if 3 in low_bytes:
            return "original"
        return "unknown(%s)" % sorted(low_bytes)


def read(path):
    lib = Arm64Lib(path) if ELFFile(open(path, "rb"))["e_machine"] == "EM_AARCH64" else Lib(path)
    per_anchor = []
    for anchor in ANCHORS:
        funcs = lib.functions_referencing(lib.strings(anchor))
        targets = set()
        for f in funcs:
            targets |= lib.report_calls(f)
        per_anchor.append(targets)
    common = per_anchor[0] & per_anchor[1]
    if len(common) != 1:
        return "error: %d common targets %s" % (len(common), [hex(t) for t in common])
    (target,) = common
    sym = lib.symbol()
    if sym is not None and sym != target:
        return "error: .symtab says %#x, the code %#x" % (sym, target)
    return "%#x\t%s\t%d" % (lib.off(target), lib.layout(target), lib.callers(target))


if __name__ == "__main__":
    for path in sys.argv[1:]:
        version = path.split("/torch_npu/lib/")[0].rsplit("/", 1)[-1]
        print("%s\t%s" % (version, read(path)), flush=True)
