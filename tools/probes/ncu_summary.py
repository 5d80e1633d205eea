"""CPU probe: short tables from an Nsight Compute run's exports (issue 47's d 128 backward reading).

Two inputs, the ones `flash_ncu_bwd.py`'s prepared command writes:
- `raw`: `ncu --import R --page raw --csv` (first line the metric names, second the units, then one row a launch):
  a table a launch of the figures NOTES.md records (duration, SM / L2 / DRAM throughput, tensor pipe, L2 sectors by
  operation, DRAM bytes, the local-load L1 hit rate, registers, shared memory, occupancy) and the stall reasons as
  a share of all warp cycles a issued instruction (`smsp__average_warps_issue_stalled_<r>_per_issue_active` over
  their sum: the WarpStateStats view).
- `source`: `ncu --import R --page source --print-source sass --csv` (plain or .gz; one block a profiled launch,
  each opening with a `"Kernel Name",...` line): a block's PC samples by opcode family, by stall reason, the
  leading (family, reason) pairs, and the long-scoreboard samples split by the producer of the stalled
  instruction's source registers (the last instruction before it, in address order, that writes one of them:
  LDL = a spill reload, LDG = a global load, other), which says how much of that stall is spill reloads.
  The producer search ignores branches (address order, at most `WINDOW` instructions back): a lead, not a proof.

    python tools/probes/ncu_summary.py raw FILE-raw.csv [--names a,b,...]
    python tools/probes/ncu_summary.py source FILE-source.csv[.gz] [--names a,b,...] [--top N]
    python tools/probes/ncu_summary.py mix FILE-source.csv[.gz] [--names a,b,...] [--unit HGMMA:16]

- `mix` (the source page too): each launch's executed warp instructions by opcode family (the "Instructions
  Executed" column), a unit of work (--unit FAMILY:N: N of FAMILY's instructions a unit; HGMMA:16 = one 64x128 key
  tile of a d 128 consumer warp, 8 for Q·Kᵀ and 8 for P·V; or one a launch, comma-separated, as HGMMA:24,HGMMA:20
  for the d 64 backward's (64-query, 64-key) step of a consumer warp, ours and cuDNN's) and each family's share of
  the PC samples: where two kernels' instruction counts a unit of work differ, and where their samples sit.

`--names` labels the launches in order (default: the kernel names).
"""
from __future__ import annotations

import argparse
import csv
import gzip
import io
import re
import sys
from collections import Counter
from typing import Dict, List, Optional, Sequence, Tuple

#: (label, metric, scale, format) of the raw table, in order. A metric in UNIT_SCALES is first brought to the
#: label's unit from the one its units row names (ncu picks us, ms, Mbyte, Gbyte... per run).
RAW_FIELDS = (
    ("ms", "gpu__time_duration.sum", 1.0, "{:.2f}"),
    ("SM %", "sm__throughput.avg.pct_of_peak_sustained_elapsed", 1.0, "{:.1f}"),
    ("L2 %", "lts__throughput.avg.pct_of_peak_sustained_elapsed", 1.0, "{:.1f}"),
    ("DRAM %", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", 1.0, "{:.1f}"),
    ("tensor %", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", 1.0, "{:.1f}"),
    ("red 1e9", "lts__t_sectors_op_red.sum", 1e-9, "{:.3f}"),
    ("read 1e9", "lts__t_sectors_op_read.sum", 1e-9, "{:.2f}"),
    ("write 1e9", "lts__t_sectors_op_write.sum", 1e-9, "{:.2f}"),
    ("DRAM rd GB", "dram__bytes_read.sum", 1.0, "{:.3f}"),
    ("DRAM wr GB", "dram__bytes_write.sum", 1.0, "{:.3f}"),
    ("LDL L1 hit %", "l1tex__t_sector_pipe_lsu_mem_local_op_ld_hit_rate.pct", 1.0, "{:.1f}"),
    ("LDL 1e6", "smsp__sass_inst_executed_op_local_ld.sum", 1e-6, "{:.0f}"),
    ("regs", "launch__registers_per_thread", 1.0, "{:.0f}"),
    ("smem KB", "launch__shared_mem_per_block", 1.0, "{:.1f}"),
    ("carve KB", "launch__shared_mem_config_size", 1.0, "{:.1f}"),
    ("occ %", "sm__warps_active.avg.pct_of_peak_sustained_active", 1.0, "{:.1f}"),
)
_TIME_MS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3,
            "second": 1e3}
_BYTES_GB = {"byte": 1e-9, "Kbyte": 1e-6, "Mbyte": 1e-3, "Gbyte": 1.0, "Tbyte": 1e3}
_BYTES_KB = {"byte/block": 1e-3, "Kbyte/block": 1.0, "Mbyte/block": 1e3, "byte": 1e-3, "Kbyte": 1.0, "Mbyte": 1e3}
#: metric -> {unit in the export's units row: factor to the RAW_FIELDS label's unit}.
UNIT_SCALES = {"gpu__time_duration.sum": _TIME_MS, "dram__bytes_read.sum": _BYTES_GB,
               "dram__bytes_write.sum": _BYTES_GB, "launch__shared_mem_per_block": _BYTES_KB,
               "launch__shared_mem_config_size": _BYTES_KB}
STALL_RE = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
#: The SASS families the stall reading names (others keep their first opcode word).
FAMILIES = (("WARPGROUP.DEPBAR", "WARPGROUP.DEPBAR"), ("WARPGROUP.ARRIVE", "WARPGROUP.ARRIVE"),
            ("DEPBAR", "DEPBAR"), ("BAR.", "BAR"))
WINDOW = 400
#: Opcodes whose first operand is not a destination register.
NO_DEST = re.compile(r"^(ST|STS|STL|STG|STSM|RED|REDG|BAR|BRA|EXIT|MEMBAR|FENCE|DEPBAR|WARPGROUP|UTMA|SYNCS\.ARRIVE|"
                     r"HGMMA|ELECT|VOTEU|UTMACMDFLUSH|NOP|WARPSYNC)")


def _num(text: str) -> float:
    text = text.replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return float("nan")


def read_raw(text: str) -> Tuple[List[str], List[Dict[str, str]], Dict[str, str]]:
    """(kernel names, one {metric: value} a launch, {metric: unit}) from the raw page's csv."""
    rows = list(csv.reader(io.StringIO(text)))
    header, units, data = rows[0], rows[1], [r for r in rows[2:] if r]
    launches = [dict(zip(header, r)) for r in data]
    return [d.get("Kernel Name", "?") for d in launches], launches, dict(zip(header, units))


def unit_factor(metric: str, unit: str) -> float:
    """What multiplies `metric`'s value in `unit` into its RAW_FIELDS label's unit (1 for unconverted metrics);
    ValueError naming both for a unit the table does not know, rather than a figure off by 1000."""
    scales = UNIT_SCALES.get(metric)
    if scales is None:
        return 1.0
    if unit not in scales:
        raise ValueError(f"ncu_summary: {metric} in unit {unit!r}, not one of {sorted(scales)}")
    return scales[unit]


def stall_shares(launch: Dict[str, str]) -> Dict[str, float]:
    """Stall reason -> % of the warp cycles a issued instruction (the reasons' ratios over their sum)."""
    ratios = {m.group(1): _num(v) for k, v in launch.items() if (m := STALL_RE.match(k))}
    ratios = {k: v for k, v in ratios.items() if v == v}
    total = sum(ratios.values())
    return {k: 100.0 * v / total for k, v in ratios.items()} if total else {}


def raw_table(text: str, names: Optional[Sequence[str]] = None, top: int = 5) -> List[str]:
    kernels, launches, units = read_raw(text)
    names = list(names) if names else kernels
    lines = ["| launch | " + " | ".join(f[0] for f in RAW_FIELDS) + " | top stalls (% of cycles) |",
             "|---" * (len(RAW_FIELDS) + 2) + "|"]
    for name, launch in zip(names, launches):
        cells = []
        for _, metric, scale, fmt in RAW_FIELDS:
            v = _num(launch.get(metric, "nan"))
            cells.append(fmt.format(v * scale * unit_factor(metric, units.get(metric, ""))) if v == v else "—")
        shares = sorted(stall_shares(launch).items(), key=lambda kv: -kv[1])[:top]
        stalls = ", ".join(f"{k} {v:.1f}" for k, v in shares)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {stalls} |")
    return lines


def read_source(text: str) -> List[Tuple[str, List[Dict[str, str]]]]:
    """One (kernel name, rows as {column: value}) a block of the source page's csv."""
    rows = list(csv.reader(io.StringIO(text)))
    blocks, i = [], 0
    while i < len(rows):
        if rows[i] and rows[i][0] == "Kernel Name":
            name, header, j = rows[i][1], rows[i + 1], i + 2
            body = []
            while j < len(rows) and not (rows[j] and rows[j][0] == "Kernel Name"):
                if rows[j]:
                    body.append(dict(zip(header, rows[j])))
                j += 1
            blocks.append((name, body))
            i = j
        else:
            i += 1
    return blocks


def opcode(sass: str) -> str:
    """The opcode with its modifiers, predicate dropped: '@!P1 LDL.64 R2, [R1]' -> 'LDL.64'."""
    s = re.sub(r"^@!?U?P[T\d]+\s+", "", sass.strip())
    return s.split()[0] if s else ""


def family(op: str) -> str:
    for prefix, fam in FAMILIES:
        if op.startswith(prefix):
            return fam
    return op.split(".")[0]


def _regs(operands: str) -> List[str]:
    """General registers named in an operand list, R2.64 / 64-bit pairs widened to both halves."""
    out = []
    for m in re.finditer(r"\bR(\d+)(\.64)?\b", operands):
        n = int(m.group(1))
        out += [f"R{n}", f"R{n + 1}"] if m.group(2) else [f"R{n}"]
    return out


def dest_and_sources(sass: str) -> Tuple[List[str], List[str]]:
    """(registers written, registers read) of one SASS line, by the usual operand order."""
    s = re.sub(r"^@!?U?P[T\d]+\s+", "", sass.strip())
    parts = s.split(None, 1)
    op, rest = parts[0], (parts[1] if len(parts) > 1 else "")
    operands = [o.strip() for o in rest.split(",")]
    if NO_DEST.match(op) or not operands or not re.match(r"^R\d+$", operands[0]):
        return [], _regs(rest)
    dest = [operands[0]]
    if re.search(r"\.64\b|\.128\b", op):  # LDL.64 R2 writes R2, R3 (LDL.128: four)
        n, width = int(operands[0][1:]), (4 if ".128" in op else 2)
        dest = [f"R{n + k}" for k in range(width)]
    return dest, _regs(", ".join(operands[1:]))


def producer(body: Sequence[Dict[str, str]], i: int, window: int = WINDOW) -> str:
    """Family of the last instruction before row i (address order) writing a register row i reads; '' if none."""
    _, reads = dest_and_sources(body[i]["Source"])
    if not reads:
        return ""
    wanted = set(reads)
    for j in range(i - 1, max(-1, i - 1 - window), -1):
        dest, _ = dest_and_sources(body[j]["Source"])
        if wanted.intersection(dest):
            return family(opcode(body[j]["Source"]))
    return ""


def source_summary(name: str, body: Sequence[Dict[str, str]], top: int = 10) -> List[str]:
    samples_col = "Warp Stall Sampling (All Samples)"
    reasons = [c for c in (body[0] if body else {}) if c.startswith("stall_") and "Not Issued" not in c]
    total = sum(int(_num(r[samples_col])) for r in body) or 1
    by_fam, by_reason, pairs, long_sb_by_producer = Counter(), Counter(), Counter(), Counter()
    for i, r in enumerate(body):
        fam = family(opcode(r["Source"]))
        by_fam[fam] += int(_num(r[samples_col]))
        for c in reasons:
            v = int(_num(r[c]))
            if v:
                by_reason[c[6:]] += v
                pairs[(fam, c[6:])] += v
                if c == "stall_long_sb":
                    long_sb_by_producer[producer(body, i) or "none found"] += v

    def pct(counter: Counter, n: int) -> str:
        return ", ".join(f"{k if isinstance(k, str) else '/'.join(k)} {100.0 * v / total:.1f}"
                         for k, v in counter.most_common(n))
    return [f"{name}: {total} samples",
            f"  by family (% of samples): {pct(by_fam, top)}",
            f"  by reason: {pct(by_reason, top)}",
            f"  family/reason: {pct(pairs, top)}",
            f"  long_sb by producer of the stalled instruction's sources: {pct(long_sb_by_producer, 5)}"]


#: The families `mix` lists first (the online softmax's and the MMAs'); the others follow by count.
MIX_FAMILIES = ("HGMMA", "WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR", "MUFU", "FMNMX", "FADD", "FMUL", "FFMA", "F2FP",
                "PRMT", "FSEL", "SHFL")


def instruction_mix(body: Sequence[Dict[str, str]]) -> Tuple[Counter, Counter]:
    """(executed warp instructions by family, PC samples by family) of one launch's source rows."""
    executed, samples = Counter(), Counter()
    for r in body:
        fam = family(opcode(r["Source"]))
        executed[fam] += int(_num(r.get("Instructions Executed", "0")))
        # An export of a run without source-level sampling has no such column: counts only, samples 0.
        samples[fam] += int(_num(r.get("Warp Stall Sampling (All Samples)", "0")))
    return executed, samples


def mix_table(blocks: Sequence[Tuple[str, Sequence[Dict[str, str]]]], unit: str = "HGMMA:16",
              top: int = 20) -> List[str]:
    """A row a family: per launch, its executed instructions a unit of work (unit 'FAMILY:N') and its % of the
    samples. One unit for every launch, or a comma-separated unit a launch, in order (kernels whose MMAs differ in
    shape: the d 64 backward's step is 24 HGMMA in ours, 20 in cuDNN's). ValueError naming the unit when it is
    malformed, when their number is not the launches', or a launch ran none of its family."""
    parts = unit.split(",")
    if len(parts) not in (1, len(blocks)):
        raise ValueError(f"ncu_summary: --unit {unit!r} gives {len(parts)} units for {len(blocks)} launches")
    mixes = [(name, *instruction_mix(body)) for name, body in blocks]
    units = []
    for (name, executed, _), one in zip(mixes, parts * len(blocks) if len(parts) == 1 else parts):
        fam, _, n = one.partition(":")
        try:
            per = float(n)
        except ValueError:
            raise ValueError(f"ncu_summary: --unit must be FAMILY:N, got {one!r}") from None
        if not executed[fam]:
            raise ValueError(f"ncu_summary: launch {name} executed no {fam} (--unit {unit})")
        units.append(executed[fam] / per)
    others = Counter()
    for _, executed, _ in mixes:
        others.update({k: v for k, v in executed.items() if k not in MIX_FAMILIES})
    families = list(MIX_FAMILIES) + [k for k, _ in others.most_common(max(0, top - len(MIX_FAMILIES)))]
    lines = ["| family | " + " | ".join(f"{name} a unit | {name} % samples" for name, _, _ in mixes) + " |",
             "|---" * (1 + 2 * len(mixes)) + "|",
             "| units | " + " | ".join(f"{u:.0f} | " for u in units) + " |"]
    for f in families + ["all"]:
        cells = []
        for (_, executed, samples), u in zip(mixes, units):
            ex = sum(executed.values()) if f == "all" else executed[f]
            sm = sum(samples.values()) if f == "all" else samples[f]
            cells.append(f"{ex / u:.1f} | {100.0 * sm / (sum(samples.values()) or 1):.1f}")
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    return lines


def _open_text(path: str) -> str:
    if path.endswith(".gz"):
        with gzip.open(path, "rt") as fh:
            return fh.read()
    with open(path) as fh:
        return fh.read()


def _labelled(blocks, names: Optional[Sequence[str]]) -> List[Tuple[str, Sequence[Dict[str, str]]]]:
    """The source page's (kernel, rows) blocks with each kernel name replaced by its --names label, where given."""
    return [(names[k] if names and k < len(names) else kernel, body) for k, (kernel, body) in enumerate(blocks)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="ncu_summary", description=__doc__.split("\n\n")[0])
    ap.add_argument("page", choices=("raw", "source", "mix"))
    ap.add_argument("path")
    ap.add_argument("--names", default="", help="comma-separated labels of the launches, in order")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--unit", default="HGMMA:16",
                    help="mix: FAMILY:N, N of FAMILY's instructions a unit of work; or one a launch, comma-separated")
    args = ap.parse_args(argv)
    names = [n for n in args.names.split(",") if n] or None
    text = _open_text(args.path)
    try:
        if args.page == "raw":
            lines = raw_table(text, names, top=min(args.top, 6))
        elif args.page == "mix":
            lines = mix_table(_labelled(read_source(text), names), args.unit, args.top)
        else:
            lines = [line for label, body in _labelled(read_source(text), names)
                     for line in source_summary(label, body, args.top)]
    except ValueError as exc:  # an unknown unit, a malformed --unit: each names itself
        print(exc, file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
