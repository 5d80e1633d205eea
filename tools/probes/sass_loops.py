"""CPU probe: the loop bodies of a kernel's SASS and where their waits and barriers sit.

Reads SASS listings (the .sass files `tools/probes/gluon_ptx_same.py dump` writes, or any `cuobjdump -sass` text)
and prints, per loop body, its length in instructions, the counts of the instructions that matter for the
Gluon kernels' schedules (HGMMA, WARPGROUP.DEPBAR, BAR.SYNC, DEPBAR.LE SB0 — the bulk-group wait, PTX
`cp.async.bulk.wait_group.read N` —, UTMAREDG, MEMBAR, fences, STS/STSM, spill LDL/STL, mbarrier SYNCS, TMA loads,
MUFU.EX2, global reductions REDG and atomics ATOMG, the latter two also by their full opcode, whose suffix gives the
width: `F32x2` = 8 bytes a thread) and, with -v, the position of each sync instruction within the body (runs of
HGMMA folded; REDG / ATOMG folded when no other sync instruction comes between).

A loop body is the range from a backward branch's target to the branch. Not counted as loops: the mbarrier
try-wait retry blocks ptxas places after the kernel's end (`@!P BRA <itself>` then `BRA <back into the body>`),
whose back jumps would otherwise span most of the kernel.

    python tools/probes/sass_loops.py [-v] [--ldg] FILE.sass [FILE.sass ...]

--ldg adds, per file, the first reader of each global load's (LDG's) destination register, by opcode and by whether a
warpgroup MMA wait (WARPGROUP.DEPBAR) lies between. A reader with none between waits out the load's latency with no
MMA's to overlap it, and holds back every instruction after it, MMA issues included (NOTES.md, "Twenty-ninth
session": the ws backward's lse FMUL, 9.5% of its samples).

Used for NOTES.md's "What the codegen shows" and "Stage 3d" (the one-pass backward's hot loop: the causal kernel's
loop instances are the diagonal, key-mask and mask-free ones, in that order).
"""
from __future__ import annotations

import re
import sys
from typing import Dict, List, Tuple

KEYS = {"HGMMA": r"\bHGMMA\b", "WG.DEPBAR": r"\bWARPGROUP\.DEPBAR", "BAR.SYNC": r"\bBAR\.SYNC",
        "DEPBAR SB0": r"\bDEPBAR\.LE SB0", "UTMAREDG": r"\bUTMAREDG", "UTMACMDFLUSH": r"\bUTMACMDFLUSH",
        "MEMBAR": r"\bMEMBAR", "FENCE.VIEW.ASYNC.S": r"\bFENCE\.VIEW\.ASYNC\.S", "STS": r"\bSTS\b", "STSM": r"\bSTSM\b",
        "LDL": r"\bLDL", "STL": r"\bSTL", "SYNCS": r"\bSYNCS", "UTMALDG": r"\bUTMALDG", "MUFU.EX2": r"\bMUFU\.EX2",
        "REDG": r"\bREDG\b", "ATOMG": r"\bATOMG\b"}
#: What -v places: the waits, barriers, fences, the bulk copies and the global reductions / atomics (stage 3e).
SYNC = ("HGMMA", "WG.DEPBAR", "BAR.SYNC", "DEPBAR SB0", "UTMAREDG", "MEMBAR", "SYNCS", "UTMALDG", "REDG", "ATOMG")

Instr = Tuple[int, str]  # (address, text without the encoding comment)


def parse(text: str) -> List[Instr]:
    out = []
    for line in text.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def _branch_target(text: str):
    m = re.search(r"\bBRA(?:\.\w+)*\s+(0x[0-9a-f]+)", text)
    return int(m.group(1), 16) if m else None


def loops(ins: List[Instr]) -> List[Tuple[int, int]]:
    """(first, last) instruction indices of each loop body, in program order."""
    index = {a: i for i, (a, _) in enumerate(ins)}
    out = []
    for i, (a, text) in enumerate(ins):
        target = _branch_target(text)
        if target is None or target >= a or target not in index:
            continue
        if i > 0 and text.startswith("BRA"):  # a retry block's way back: `@!P BRA <near>` just before it
            prev = _branch_target(ins[i - 1][1])
            if prev is not None and ins[i - 1][1].startswith("@") and 0 <= i - 1 - index.get(prev, -99) <= 2:
                continue
        if i - index[target] <= 2 and text.startswith("@"):  # the retry block's own spin
            continue
        out.append((index[target], i))
    return out


def counts(body: List[Instr]) -> Dict[str, int]:
    return {k: sum(bool(re.search(rx, t)) for _, t in body) for k, rx in KEYS.items()}


def atomic_forms(body: List[Instr]) -> Dict[str, int]:
    """{full opcode: count} of the REDG / ATOMG instructions (e.g. REDG.E.ADD.F32x2.FTZ.RN.STRONG.GPU)."""
    out: Dict[str, int] = {}
    for _, t in body:
        m = re.search(r"\b((?:REDG|ATOMG)(?:\.\w+)*)", t)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0) + 1
    return out


def positions(body: List[Instr]) -> List[str]:
    """'pos:what' of each sync instruction (a run of HGMMA as 'pos:HGMMAxN', of REDG with no other sync instruction
    between as 'pos:REDGxN'); DEPBARs with their operands."""
    out: List[List] = []
    for j, (_, t) in enumerate(body):
        for k in SYNC:
            if re.search(KEYS[k], t):
                if out and out[-1][1] == k and (k in ("REDG", "ATOMG") or (k == "HGMMA" and out[-1][3] == j - 1)):
                    out[-1][2] += 1
                    out[-1][3] = j
                else:
                    what = t if k in ("DEPBAR SB0", "WG.DEPBAR") else k
                    out.append([j, what, 1, j])
                break
    return [f"{p}:{w}" + (f"x{n}" if n > 1 else "") for p, w, n, _ in out]


_GUARD = re.compile(r"^@!?U?P\w+\s+")
_STORE_LIKE = ("ST", "RED", "ATOM", "HGMMA")  # instructions whose first register operand is read, not written


def ldg_readers(ins: List[Instr]) -> Dict[Tuple[str, bool], int]:
    """{(opcode, after a WARPGROUP.DEPBAR): count} over the LDGs' destination registers' first readers. A register
    written again before any read is dropped."""
    pending: Dict[str, int] = {}  # register -> index of the LDG that writes it
    out: Dict[Tuple[str, bool], int] = {}
    for i, (_, text) in enumerate(ins):
        body = _GUARD.sub("", text)
        op = body.split()[0] if body else ""
        regs = re.findall(r"\bR(\d+)\b", body)
        if op.startswith("LDG") and regs:
            pending[regs[0]] = i
            continue
        writes = not op.startswith(_STORE_LIKE) and bool(regs)
        for r in set(regs[1:] if writes else regs):
            if r in pending:
                j = pending.pop(r)
                after = any(t.startswith("WARPGROUP.DEPBAR") for _, t in ins[j + 1:i])
                out[(op, after)] = out.get((op, after), 0) + 1
        if writes:
            pending.pop(regs[0], None)
    return out


def report(text: str, verbose: bool = False) -> List[str]:
    ins = parse(text)
    lines = []
    for lo, hi in loops(ins):
        body = ins[lo:hi + 1]
        c = counts(body)
        forms = "".join(f"; {op} {n}" for op, n in atomic_forms(body).items())
        lines.append(f"loop [{lo}..{hi}] {len(body)} instructions: " + ", ".join(f"{k} {v}" for k, v in c.items() if v)
                     + forms)
        if verbose:
            lines.append("    " + " | ".join(positions(body)))
    return lines


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose, ldg = "-v" in argv, "--ldg" in argv
    files = [a for a in argv if a not in ("-v", "--ldg")]
    if not files:
        print(__doc__.split("\n\n")[-2].strip(), file=sys.stderr)
        return 2
    for path in files:
        print(path)
        with open(path) as f:
            text = f.read()
        for line in report(text, verbose):
            print("  " + line)
        if ldg:
            readers = sorted(ldg_readers(parse(text)).items())
            print("  LDG first readers: " + (", ".join(f"{op} {'after' if after else 'before'} a WG.DEPBAR {n}"
                                                       for (op, after), n in readers) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
