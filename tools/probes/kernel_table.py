"""CPU tool (issue 47, stage 4): build FlashAttentionTriton's kernel table from the committed probe results.

    PYTHONPATH=src python tools/probes/kernel_table.py build    (writes src/impl/attention/kernel_table.json)
    PYTHONPATH=src python tools/probes/kernel_table.py check    (exit 1 if the committed table differs)
    PYTHONPATH=src python tools/probes/kernel_table.py show     (the entries, one a line)

Sources: every ``reports/data/*/probes/flash_gluon_fwd_*.json`` (forward: "gluon-ws" rows against the
"triton" row, our autotuned Triton forward, by "ms") and ``flash_gluon_bwd_*.json`` (backward: "ws+gluon-bwd"
rows, kernel "gluon", and "ws+gluon-bwd-ws" rows, kernel "gluon_ws" (stage 4d), against the "triton" row, our
Triton backward at its default options, by "bwd"). The probes time bf16
inputs (their rows carry no dtype); the architecture is the file's "capability".

The rule, per direction and (architecture, head dim, causal, dtype):
- Only one run's rows are compared with each other (same file: same machine, commit and inputs).
- A Gluon row counts if it was measured (no "error", a time) and is correct: "wrong" false and "err" (its
  relative error against the probe's reference) at most ERR_BOUND. A failed or wrong row anywhere rules its
  config out for that key.
- A config is judged at every shape where a run that timed it at the key timed Triton: it must have been
  measured and correct there (a sweep config timed at one shape of a run's three does not qualify; a config new
  in a later run is judged by the runs that timed it). It wins a shape where it was faster than that run's
  Triton, else loses it (the short shapes of --short: the host launch path and small grids). Faster by PUBLIC
  where both rows have it (the --short rows since issue 47's public call, tools/probes/public_call.py:
  FlashAttentionTriton.apply forward+backward as called, the table holding just the row's entry for the
  direction, so the other half is Triton's in both; the Gluon row's only where its "public_kernels" says the
  candidate ran), else by the direction's time field (runs before that field keep their meaning). The entry's
  measurements say which (``quantity``), and the score's ratios are the same ones.
- Its entry holds from a sequence length on (``min_seq``): the shortest measured length above every loss (0,
  every length, where it lost nowhere), so that it won every measured shape at least that long; no win above
  its longest loss, no entry. Its losses are kept in the entry (``losses``) so a reader sees what set min_seq.
  A config without a loss that no run timed as short as some run timed Triton at the key holds from its own
  shortest measured length (nothing says it wins shorter: --short runs time the table's candidates only).
- Of several that qualify, the smallest score wins: over the lengths every one of them was measured at (none:
  every length a run timed Triton at for the key), the geometric mean of what the entry would give a call as
  ms / triton ms (each over its own run's Triton time): 1 below its min_seq (Triton runs), its ratio where
  measured, else its geometric mean at or above min_seq.
- A config is read from its row's label (``cfg_text`` of the probe) among the kernel's CANDIDATE_CONFIGS and
  default configs; a backward row without "config_used" (runs before that field: its None config was the
  default of that commit, which moved; the "ws+gluon-bwd-ws" rows before stage 4d) is not read. The backward's
  two kernels compete as any two configs do.
- A key no run measured against Triton has no entry: those calls run Triton.
- Rows in SET_ASIDE (probe file, impl, label) timed a defect of the path since fixed: not read; `show` lists them.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
from collections import defaultdict
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from impl.attention import kernel_table as kt  # noqa: E402
from public_call import PUBLIC  # noqa: E402  (the module beside this one: the public call's quantity)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TABLE_PATH = os.path.join(ROOT, "src", "impl", "attention", kt.TABLE_FILE)
#: Per direction: probe files, the Gluon impl -> the table's kernel name, the time field.
SOURCES = {"fwd": ("reports/data/*/probes/flash_gluon_fwd_*.json", {"gluon-ws": "gluon_ws"}, "ms"),
           "bwd": ("reports/data/*/probes/flash_gluon_bwd_*.json", {"ws+gluon-bwd": "gluon",
                                                                     "ws+gluon-bwd-ws": "gluon_ws"}, "bwd")}
TRITON_IMPL = "triton"
PROBE_DTYPE = "bfloat16"  # both probes' inputs
ERR_BOUND = 2e-2  # the probes' WRONG: the bf16 tolerance of the correctness tests
RULE = ("per (direction, arch, d, causal, dtype): the Gluon config measured correct (err <= 2e-2), in each probe run "
        "that timed it, at every shape where that run timed Triton, and faster than our Triton kernel at every such "
        "shape of sequence length >= its min_seq: the shortest measured length above each measured loss (kept as "
        "the entry's losses; min_seq left out: 0, every length; no loss but unmeasured at the key's shortest: its "
        "shortest), with a win there; of several, the least geometric mean over the lengths all were measured at "
        "of ms / triton ms (1 below min_seq); no such config, no entry (Triton). Calls shorter than min_seq run "
        "Triton. Built by tools/probes/kernel_table.py from reports/data/*/probes/flash_gluon_{fwd,bwd}_*.json.")
#: Probe rows that timed a defect of the path since fixed, not their config: (probe file, impl, config label) -> why.
#: The builder skips them (the files stay as measured); `show` lists them.
_NO_PLAN = ("timed without a call plan: the dynamic tile counter matched no input or buffer, so every call took the "
            "launcher's host path (0.2-0.5 ms a call at 512-2048); plans zero it since f0e257c")
SET_ASIDE = {(f"reports/data/h200-141gb-x1/probes/flash_gluon_fwd_cadffc2-public-short-{d}.json", "gluon-ws",
              "2x64x128 s3 pp persist dynamic"): _NO_PLAN for d in ("d128", "d64")}
#: Added to RULE once some shape was judged by PUBLIC (a table built from runs before it keeps RULE's text).
RULE_PUBLIC = (" Faster means by public_fwd_bwd (FlashAttentionTriton.apply forward+backward as called, the other "
               "half Triton's) where both rows of a shape have it (the measurement's quantity), else by the probe's "
               "time of the half alone.")


def _labels(direction: str) -> Dict[str, Dict[str, object]]:
    """Per table kernel of the direction: probe label -> config object (its CANDIDATE_CONFIGS and defaults;
    the ws backward's default is its first candidate)."""
    if direction == "fwd":
        from flash_gluon_fwd import cfg_text

        from impl.attention import flash_gluon_ws as mod
        configs = {"gluon_ws": list(mod.CANDIDATE_CONFIGS) + [mod.default_config(d) for d in kt.HEAD_DIMS]}
    else:
        from flash_gluon_bwd import cfg_text

        from impl.attention import flash_gluon_bwd as bwd, flash_gluon_bwd_ws as ws
        configs = {"gluon": list(bwd.CANDIDATE_CONFIGS) + [bwd.default_config(d) for d in kt.HEAD_DIMS],
                   "gluon_ws": list(ws.CANDIDATE_CONFIGS)}
    return {kernel: {cfg_text(c): c for c in cs} for kernel, cs in configs.items()}


#: Config fields added after entries were written, left out of an entry at their default so that the entries of
#: configs from before them are unchanged (their launcher takes the default): GluonBwdWsConfig.block_m and
#: .dq_own_keys, .pingpong, .prescaled_lse, .stats_smem, .dq_one_consumer, .lean_sync, GluonWsConfig.lpt, .early_q,
#: .o_regs, .rotate, .lazy_sum, .prefetch_q and .dynamic (issue 47).
_LATER_FIELDS = {"GluonBwdWsConfig": {"block_m": 64, "dq_own_keys": False, "pingpong": False, "prescaled_lse": False,
                                      "stats_smem": False, "dq_one_consumer": False, "lean_sync": False},
                 "GluonWsConfig": {"lpt": False, "early_q": False, "o_regs": False, "rotate": False,
                                   "lazy_sum": False, "prefetch_q": False, "dynamic": False}}


def _config_pairs(config) -> kt.Config:
    later = _LATER_FIELDS.get(type(config).__name__, {})
    return tuple((k, v) for k, v in kt.config_pairs(config) if k not in later or v != later[k])


def _rows(direction: str, root: str):
    """(probe path, device, arch, row) of every row of the direction's probe files, sorted by path."""
    pattern = SOURCES[direction][0]
    for path in sorted(glob.glob(os.path.join(root, pattern))):
        data = json.load(open(path))
        cap = data.get("capability")
        if not cap:
            continue
        rel = os.path.relpath(path, root)
        for row in data["rows"]:
            yield rel, data["device"], kt.arch_name(tuple(cap)), row


def _measured(row: dict, field: str) -> Optional[float]:
    t = row.get(field)
    return None if row.get("error") or t is None or not math.isfinite(t) else float(t)


def _public(row: dict, kernel: Optional[str], direction: str) -> Optional[float]:
    """The row's PUBLIC time where measured (a Gluon row's only where the public call ran `kernel` for the
    direction: a launcher refusing the inputs would have timed Triton), else None."""
    if kernel is not None and row.get("public_kernels", {}).get(direction) != kernel:
        return None
    return _measured(row, PUBLIC)


def _judged(gluon_row: tuple, triton_row: tuple) -> tuple:
    """(ms, triton ms, quantity) a shape is judged by: PUBLIC where both rows have it, else the time field."""
    (ms, _, public), (triton_ms, triton_public) = gluon_row, triton_row
    if public is not None and triton_public is not None:
        return public, triton_public, PUBLIC
    return ms, triton_ms, ""


def min_seq(wins, losses) -> Optional[int]:
    """The shortest of the `wins` sequence lengths above every one of `losses` (0: no loss), None: no win above
    the longest loss (no entry)."""
    if not losses:
        return 0
    above = [n for n in wins if n > max(losses)]
    return min(above) if above else None


def _geomean(xs) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _called_score(lengths, floor: int, ratios: Dict[tuple, float]) -> float:
    """A config's rank (less is better): over the key's measured lengths, the geometric mean of what its entry would
    give a call, as ms / triton ms: 1 below its floor (Triton runs), its ratio where measured (geometric mean of its
    runs), else its geometric mean at or above the floor. Every candidate is scored over the same lengths, also
    where the runs that timed it measured fewer of them."""
    at = defaultdict(list)
    for (_, s), r in ratios.items():
        at[s[2]].append(r)
    where = _geomean(r for n, rs in at.items() if n >= floor for r in rs)
    return _geomean(1.0 if n < floor else _geomean(at[n]) if n in at else where for n in lengths)


def entries(direction: str, root: str = ROOT, judged: Optional[Dict[str, int]] = None) -> List[kt.KernelChoice]:
    """judged (a dict): counts per quantity ("" the time field) of the shapes the entries were judged at."""
    _, impls, field = SOURCES[direction]
    labels = _labels(direction)
    triton: Dict[tuple, Dict[tuple, tuple]] = defaultdict(dict)  # key -> (probe, shape) -> (ms, public ms)
    gluon: Dict[tuple, Dict[tuple, Dict[tuple, Optional[tuple]]]] = defaultdict(lambda: defaultdict(dict))
    devices = {}
    for probe, device, arch, row in _rows(direction, root):
        b, h, n, d, causal = row["shape"]
        key = (arch, d, bool(causal), row.get("dtype", PROBE_DTYPE))
        where = (probe, (b, h, n, d))
        devices[probe] = device
        if row["impl"] == TRITON_IMPL and row.get("config") in (None, "autotuned"):
            ms = _measured(row, field)
            if ms is not None:
                triton[key][where] = (ms, _public(row, None, direction))
            continue
        if row["impl"] not in impls or row.get("carveout") is not None:  # a carve-out twin times a launch
            continue  # setting the launchers do not make (flash_gluon_bwd.py --carveout): not a config's time
        label = row.get("config_used") if direction == "bwd" else row.get("config")
        kernel = impls[row["impl"]]
        if label not in labels[kernel] or (probe, row["impl"], label) in SET_ASIDE:
            continue
        cand = (kernel, label)
        ms = _measured(row, field)
        ok = ms is not None and row.get("wrong") is False and row.get("err") is not None and row["err"] <= ERR_BOUND
        # None marks a failed or wrong measurement: it rules the config out at this key.
        gluon[key][cand][where] = (ms, float(row["err"]), _public(row, kernel, direction)) if ok else None
    out = []
    for key, timed in sorted(triton.items()):
        lengths = sorted({s[2] for _, s in timed})  # every length a run timed Triton at for the key
        qualified = []
        for cand, got in sorted(gluon[key].items()):
            runs = {p for p, _ in got}
            base = {w: ms for w, ms in timed.items() if w[0] in runs}  # the Triton rows of the runs that timed it
            if not base or any(v is None for v in got.values()) or not all(w in got for w in base):
                continue
            times = {w: _judged(got[w], t) for w, t in base.items()}  # (ms, triton ms, quantity)
            wins = {w for w, (ms, triton_ms, _) in times.items() if ms < triton_ms}
            floor = min_seq([s[2] for _, s in wins], [s[2] for _, s in set(base) - wins])
            if floor is None:
                continue
            if floor == 0 and min(s[2] for _, s in base) > lengths[0]:  # measured nowhere as short as others were
                floor = min(s[2] for _, s in base)
            qualified.append((cand, got, times, wins, floor))
        if not qualified:
            continue
        # Scored over the lengths every qualifying config was measured at (else all the key's): a --short run that
        # times one config sets its floor but does not, by its short ratios alone, hand the key to another.
        common = sorted(set.intersection(*({s[2] for _, s in q[2]} for q in qualified))) or lengths
        scores = [_called_score(common, floor, {w: ms / triton_ms for w, (ms, triton_ms, _) in times.items()})
                  for _, got, times, _, floor in qualified]
        (kernel, label), got, times, wins, floor = qualified[scores.index(min(scores))]
        runs_of = {flag: tuple(kt.Measured(p, devices[p], s, ms, triton_ms, got[(p, s)][1], quantity)
                               for (p, s), (ms, triton_ms, quantity) in sorted(times.items())
                               if ((p, s) in wins) == flag)
                   for flag in (True, False)}
        if judged is not None:
            for _, _, quantity in times.values():
                judged[quantity] = judged.get(quantity, 0) + 1
        arch, d, causal, dtype = key
        out.append(kt.KernelChoice(direction, arch, d, causal, dtype, kernel, _config_pairs(labels[kernel][label]),
                                   runs_of[True], floor, runs_of[False]))
    return out


def build(root: str = ROOT, judged: Optional[Dict[str, int]] = None) -> kt.KernelTable:
    """judged: as entries' (both directions)."""
    judged = {} if judged is None else judged
    found = entries("fwd", root, judged) + entries("bwd", root, judged)
    return kt.KernelTable(tuple(found), RULE + (RULE_PUBLIC if judged.get(PUBLIC) else ""))


def judged_text(judged: Dict[str, int]) -> str:
    """build's printed reasons: how many of the entries' shapes each quantity judged."""
    return (f"entries' shapes judged by {PUBLIC} (the public call as called): {judged.get(PUBLIC, 0)}; by the "
            f"probes' own time field (runs before {PUBLIC}, which keep their meaning): {judged.get('', 0)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("build", "check", "show"))
    args = ap.parse_args(argv)
    judged: Dict[str, int] = {}
    table = build(judged=judged)
    text = kt.dumps(table)
    if args.command == "build":
        with open(TABLE_PATH, "w") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(TABLE_PATH, ROOT)}: {len(table.entries)} entries; {judged_text(judged)}")
    elif args.command == "check":
        same = os.path.exists(TABLE_PATH) and open(TABLE_PATH).read() == text
        print("the committed table is up to date" if same else
              f"{os.path.relpath(TABLE_PATH, ROOT)} differs from the probes: run `kernel_table.py build`")
        if not same:
            return 1
    for e in table.entries if args.command == "show" else ():
        runs = "; ".join(f"{'x'.join(map(str, m.shape))} {m.ms:.3f} vs {m.triton_ms:.3f} ms ({m.device}"
                         + (f", {m.quantity})" if m.quantity else ")") for m in e.measured)
        lost = "".join(f"; lost {'x'.join(map(str, m.shape))} {m.ms:.3f} vs {m.triton_ms:.3f} ms"
                       + (f" {m.quantity}" if m.quantity else "") for m in e.losses)
        print(f"{e.direction} {e.arch} d {e.d} {'causal' if e.causal else 'full'} {e.dtype}: {e.kernel} "
              f"{dict(e.config)} from seq {e.min_seq}: {runs}{lost}")
    for (probe, impl, label), why in SET_ASIDE.items() if args.command == "show" else ():
        print(f"set aside: {probe} {impl} {label}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
