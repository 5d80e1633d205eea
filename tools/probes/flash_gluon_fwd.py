"""GPU probe (issue 47, stages 1 and 2): the Gluon forwards for sm_90 against our Triton forward and SDPA.

Shapes: issue 47's table (bf16; causal unless marked): 4x32x4096x128, 1x32x32768x128, 8x32x2048x128,
4x16x8192x128 full, 1x16x16384x64 (the leaderboard's), and 4x16x4096x80 and x96 (the split head dims).
Per shape: SDPA cuDNN and SDPA flash forward, our Triton forward (default options: autotuned, the
shape key's pick), the stage-1 Gluon forward ("gluon") at its default config, the warp-specialized one
("gluon-ws", flash_gluon_ws) at its default config and persistent. Order: the issue's d 128 table first
(the stage-2 target: ws ÷ cuDNN), then the ws candidate configs (flash_gluon_ws.CANDIDATE_CONFIGS) and
the stage-1 ones (flash_gluon.CANDIDATE_CONFIGS) at 4x32x4096x128, the leaderboard and split head dims,
and the stage-1 candidates at 1x16x16384x64 last. Each Gluon row also records its
relative error against the Triton forward's output of the same inputs ("err"; > 2e-2 marks the row
wrong, its time is kept but flagged). do_bench medians (warmup 25, rep 100); TFLOP/s from
impl.attention.attention_flops; "/cudnn" and "/triton": ms over that row's ms on the same shape.

--short (issue 47, stage 4: the kernel table's min_seq) times, instead of that plan, the short shapes
4x32x{512,1024,2048,3000} at each (d, causal) of SHORT_KEYS: cuDNN, the ws configs the table can name there (the
two per-shape ones above: a sweep config, timed at one shape, never qualifies) and our Triton forward, 3000
last. These rows run the Gluon kernel through flash_dispatch.gluon_forward, the path (call plans included) of a
kernels="auto" call the table sent to it, and our Triton forward through flash_launch's, that of a call it did
not; both timed by called_timer.called_ms (back-to-back calls: host cost included where the host is slower, as
users see it; do_bench would hide it) and marked "timer": "called". The Gluon and Triton rows also time the public
call as called (tools/probes/public_call.py): FlashAttentionTriton.apply forward+backward ("public_fwd_bwd") and
its forward alone ("public_fwd"), the kernel table holding just the row's forward entry (Triton: none), so the
backward is Triton's in both; "public_kernels": the kernel each half ran. kernel_table.py judges a length by
public_fwd_bwd where a row has it.

--shapes runs only the given shapes (BxHxNxD, causal; ":full" for full attention), each with the --rows kinds
(ROWS; default the default plan's per-shape rows), in order, and no sweeps: e.g. the lpt grid trial
(flash_gluon_ws.TRIAL_CONFIGS) against cuDNN and the default ws grid:
    --shapes 4x32x4096x128 4x32x2048x128 4x16x16384x128 --rows cudnn ws ws-lpt
or the persistent grid that frees Q after its last Q·Kᵀ and stores O from registers ("ws-early-q"):
    --shapes 4x32x4096x128 4x32x2048x128 4x16x16384x128 4x32x4096x128:full --rows cudnn ws ws-persistent ws-early-q
("ws-o-regs": its store from registers with Q freed where the default frees it, the A/B of its two changes).

--rounds R (default 1: each row timed once, as before): per shape, its rows are measured once as above (compiles,
the error check, the first timing), then timed R-1 more times with the same timer, the row order reversed every
other round (tools/probes/rounds.py), so that no row always runs last (NOTES.md, "Issue 47, the early_q slowdown",
hypothesis 1: order / clock drift). A row's "ms" is then the median of its "ms_rounds" (in the order measured;
"rounds": how many), /cudnn and /triton are ratios of medians, and the JSON's top-level "rounds" says R. An A/B:
    --shapes 4x16x16384x128 4x32x4096x128:full --rows cudnn ws-persistent ws-o-regs ws-early-q --rounds 5

A row starts only while elapsed + its estimate is within --budget-s; the rest are listed as left out. A later round
starts only whole, if its estimate fits (a partial round would time some rows more often, in one order); if it does
not, the run stops there ("rounds_cut": the shape and the rounds done), the shape's rows keeping the medians of the
rounds they have. The dry run's estimate counts the later rounds (RETIME_S a row each).
A failing row (compile, launch) is a row with its error text (one failing in a later round: "round N: ...", its
earlier rounds kept). --only REGEX keeps the rows whose "shape impl config" label matches.

    PYTHONPATH=src python tools/probes/flash_gluon_fwd.py [OUT.json] [--budget-s S] [--short] [--only REGEX]
        [--shapes S [S ...] [--rows R [R ...]]] [--rounds R] [--dry-run]
writes OUT.json (default $OUT/flash_gluon_fwd.json, else ./flash_gluon_fwd.json) after every row and
prints a table. --dry-run prints the plan without touching the GPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import torch
import torch.nn.functional as F

from public_call import PUBLIC, PUBLIC_FWD  # the module beside this one
from rounds import ShapeRounds, check_rounds, close_shape, note, plan_line  # the module beside this one (on sys.path)

# (batch, heads, seq, d, causal)
TABLE = [(4, 32, 4096, 128, True), (1, 32, 32768, 128, True), (8, 32, 2048, 128, True), (4, 16, 8192, 128, False),
         (1, 16, 16384, 64, True)]
SPLIT = [(4, 16, 4096, 80, True), (4, 16, 4096, 96, True)]
MAIN, LEADERBOARD = TABLE[0], TABLE[4]
#: --short: the (d, causal) the kernel table has forward entries at with d 128 and 64, and their short lengths.
SHORT_KEYS = [(128, True), (64, True), (128, False)]
SHORT_SEQS = [512, 1024, 2048, 3000]  # 3000: not a tile multiple, the last rows (the budget cuts them first)
WRONG = 2e-2  # bf16 tolerance of the correctness tests
COMPILE_S = 5.0  # a new compile on the H100's host, roughly
TRITON_FWD_CONFIGS = 9  # the forward's autotune list: compiled once per (d, causal), re-timed per sequence bucket
#: --shapes' row kinds, in the order they run; by default all but the trials (flash_gluon_ws.TRIAL_CONFIGS, ROWS'
#: last eight): the lpt grid ("ws-lpt"), the persistent grid that frees Q early and stores O from registers
#: ("ws-early-q"), its A/B that stores O from registers with Q freed late ("ws-o-regs"), the rotated consumer
#: loop ("ws-rotate": P packed where its P·V is issued, no PRMT), the per-thread row sums ("ws-lazy-sum": no
#: quad shuffle of l per key tile), a later tile's Q prefetched into L2 ("ws-prefetch-q"), and the persistent grid
#: whose tiles come from an atomic counter ("ws-dynamic"; "ws-dynamic-pq": with its next tile's Q prefetched).
ROWS = ("cudnn", "sdpa-flash", "triton", "gluon", "ws", "ws-persistent", "ws-lpt", "ws-early-q", "ws-o-regs",
        "ws-rotate", "ws-lazy-sum", "ws-prefetch-q", "ws-dynamic", "ws-dynamic-pq")
TRIAL_ROWS = {"ws-persistent": {"persistent": True}, "ws-lpt": {"lpt": True},
              "ws-early-q": {"persistent": True, "early_q": True}, "ws-o-regs": {"persistent": True, "o_regs": True},
              "ws-rotate": {"rotate": True}, "ws-lazy-sum": {"lazy_sum": True}, "ws-prefetch-q": {"prefetch_q": True},
              "ws-dynamic": {"persistent": True, "dynamic": True},
              "ws-dynamic-pq": {"persistent": True, "dynamic": True, "prefetch_q": True}}
SHAPE_ROWS = ROWS[:-8]
#: The quantities a row times (the public call's: --short rows; --rounds: each one's per-round list
#: "<quantity>_rounds", its median "<quantity>").
TIMED = ("ms", PUBLIC, PUBLIC_FWD)
RETIME_S = 2.0  # one more do_bench (or called_ms) of a compiled row, roughly: a later round's estimate a row
PUBLIC_S = 1.5  # --short: a row's public_call timings (two called_ms and a recorded call)
#: The public call's backward is our autotuned Triton backward (dQ and dK/dV configs): compiled once per (d, causal)
#: by the first --short row that times the public call there.
TRITON_BWD_CONFIGS = 12
PROBE_DTYPE = "bfloat16"  # inputs()'


def parse_shape(text: str):
    """'BxHxNxD' (causal) or 'BxHxNxD:full' -> (B, H, N, D, causal)."""
    dims, _, mask = text.partition(":")
    try:
        b, h, n, d = (int(x) for x in dims.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must be BxHxNxD[:full], got {text!r}") from None
    if mask not in ("", "full"):
        raise argparse.ArgumentTypeError(f"shape suffix must be ':full' or nothing, got {text!r}")
    return (b, h, n, d, mask != "full")


def shape_name(s) -> str:
    return "x".join(map(str, s[:4])) + ("" if s[4] else " full")


def _kernels():
    """impl name -> the Gluon module whose forward, default_config and CANDIDATE_CONFIGS it times."""
    from impl.attention import flash_gluon, flash_gluon_ws

    return {"gluon": flash_gluon, "gluon-ws": flash_gluon_ws}


def launcher(impl):
    mod = _kernels()[impl]
    return mod.flash_gluon_ws_forward if impl == "gluon-ws" else mod.flash_gluon_forward


def row_label(spec) -> str:
    """A row's name as --only matches it: "shape impl config"."""
    return f"{shape_name(spec['shape'])} {spec['impl']} {cfg_text(spec['config'])}".rstrip()


def plan(short: bool = False, only=(), shapes=None, kinds=SHAPE_ROWS):
    """Rows in the order they run, most informative first: the issue's d 128 table with both Gluon
    kernels (ws also persistent), the ws and stage-1 candidates at 4x32x4096x128, the leaderboard and
    split head dims, the stage-1 candidates at the leaderboard shape. short: the --short plan instead;
    only (regexes): the rows whose row_label matches one (none: all); estimates count a compile at a key's
    first kept row. shapes: only those, each with the row kinds `kinds` (ROWS), no sweeps."""
    import re

    kernels = _kernels()
    rows, compiled = [], set()

    def add(spec, compile_s):
        if only and not any(re.search(rx, row_label(spec)) for rx in only):
            return
        key = (spec["impl"], spec["config"], spec["shape"][3], spec["shape"][4])
        public = times_public(spec)
        bwd_key = ("public backward", spec["shape"][3], spec["shape"][4])
        rows.append(dict(spec, est=spec["est"] + compile_s * (key not in compiled) + public * (
            PUBLIC_S + TRITON_BWD_CONFIGS * COMPILE_S * (bwd_key not in compiled))))
        compiled.add(key)  # Triton's cache keys on the constexprs, not the grid
        if public:
            compiled.add(bwd_key)

    def gluon_row(s, impl, c, **extra):
        add(dict(shape=s, impl=impl, config=c, est=2.0, **extra), COMPILE_S)

    def shape_rows(s, called=False):
        extra = dict(timer="called") if called else {}
        for impl in ("cudnn",) if called else ("cudnn", "sdpa flash"):
            add(dict(shape=s, impl=impl, config=None, est=2.0, **extra), 0.0)
        triton = dict(shape=s, impl="triton", config="autotuned", est=6.0, **extra)
        if not called:
            add(triton, TRITON_FWD_CONFIGS * COMPILE_S)
        for impl, mod in kernels.items():
            if not called or impl == "gluon-ws":  # the stage-1 kernel is no table kernel
                gluon_row(s, impl, mod.default_config(s[3]), **extra)
        ws = kernels["gluon-ws"].default_config(s[3])
        for table_config in (dict(persistent=True), dict(persistent=True, dynamic=True)):
            gluon_row(s, "gluon-ws", dataclasses.replace(ws, **table_config), **extra)
        if called:  # last: a run cut (budget, timeout) inside a shape leaves no Triton row its Gluon rows lack (the
            add(triton, TRITON_FWD_CONFIGS * COMPILE_S)  # table's builder rules out a config missing a Triton shape)

    def kind_rows(s, kinds):
        """--shapes: a shape's rows by kind; a Gluon row's reference output needs the Triton forward's compile."""
        triton = dict(shape=s, impl="triton", config="autotuned", est=6.0)
        for kind in kinds:
            if kind in ("cudnn", "sdpa-flash"):
                add(dict(shape=s, impl=kind.replace("-", " "), config=None, est=2.0), 0.0)
            elif kind == "triton":
                add(triton, TRITON_FWD_CONFIGS * COMPILE_S)
            else:
                key = ("triton", "autotuned", s[3], s[4])
                first_triton = TRITON_FWD_CONFIGS * COMPILE_S * (key not in compiled)
                compiled.add(key)
                ws = kernels["gluon-ws"].default_config(s[3])
                c = (kernels["gluon"].default_config(s[3]) if kind == "gluon" else dataclasses.replace(
                    ws, **TRIAL_ROWS.get(kind, {})))
                add(dict(shape=s, impl="gluon" if kind == "gluon" else "gluon-ws", config=c, est=2.0),
                    COMPILE_S + first_triton)

    if shapes:
        for s in shapes:
            kind_rows(s, kinds)
        return rows

    if short:
        for n in SHORT_SEQS:
            for d, causal in SHORT_KEYS:
                shape_rows((4, 32, n, d, causal), called=True)
        return rows

    def sweep(s, impl):
        mod = kernels[impl]
        for c in mod.CANDIDATE_CONFIGS:
            if not any(r["impl"] == impl and r["config"] == c and r["shape"] == s for r in rows):
                gluon_row(s, impl, c)

    for s in TABLE:
        if s[3] == 128:
            shape_rows(s)
    sweep(MAIN, "gluon-ws")
    sweep(MAIN, "gluon")
    for s in [s for s in TABLE if s[3] != 128] + SPLIT:
        shape_rows(s)
    sweep(LEADERBOARD, "gluon")
    return rows


def cfg_text(c) -> str:
    if c is None or isinstance(c, str):
        return c or ""
    if hasattr(c, "num_warps"):  # stage 1
        return f"{c.block_m}x{c.block_n} w{c.num_warps} s{c.num_stages}"
    return (f"2x{c.block_m}x{c.block_n} s{c.num_stages}" + (" pp" if c.pingpong else "")
            + (" persist" if c.persistent else "") + (" lpt" if getattr(c, "lpt", False) else "")
            + (" early-q" if getattr(c, "early_q", False) else "") + (" o-regs" if getattr(c, "o_regs", False) else "")
            + (" rotate" if getattr(c, "rotate", False) else "")
            + (" lazy-sum" if getattr(c, "lazy_sum", False) else "")
            + (" prefetch-q" if getattr(c, "prefetch_q", False) else "")
            + (" dynamic" if getattr(c, "dynamic", False) else ""))


def bench(fn) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def inputs(s):
    b, h, n, d, _ = s
    g = torch.Generator(device="cuda").manual_seed(0)
    return tuple(torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))


def rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def auto_forward(config):
    """The ws forward at config as a kernels="auto" call the table sent to it runs it (--short rows)."""
    from impl.attention import FlashOptions
    from impl.attention.flash_dispatch import gluon_forward
    from impl.attention.kernel_table import config_pairs

    options, pairs = FlashOptions(kernels="auto"), config_pairs(config)
    return lambda q, k, v, causal, _config: gluon_forward(q, k, v, causal, options, "gluon_ws", pairs)[:2]


PUBLIC_IMPLS = ("gluon-ws", "triton")  # the --short rows that also time the public call


def times_public(spec) -> bool:
    """A --short row of the table's kernel or Triton: it also times the public call (public_call.py)."""
    return spec.get("timer") == "called" and spec["impl"] in PUBLIC_IMPLS


def public_timer(row, qkv, cache):
    """What times a --short Gluon or Triton row's public call (public_call.time_public: forward+backward and the
    forward alone, the table holding just the row's forward entry, min_seq 0; Triton: none), filling
    row["public_kernels"] once; None for other rows."""
    if not times_public(row):
        return None
    from called_timer import called_ms
    from public_call import only_entry_table, time_public

    from impl.attention.kernel_table import arch_name

    q = qkv[0]
    _, _, _, d, causal = row["shape"]
    if "do" not in cache:
        cache["do"] = torch.randn(q.shape, device=q.device, dtype=q.dtype,
                                  generator=torch.Generator(device=q.device).manual_seed(1))
    kernel = "gluon_ws" if row["impl"] == "gluon-ws" else None
    table = only_entry_table("fwd", kernel, row["config"], arch_name(torch.cuda.get_device_capability()), d, causal,
                             PROBE_DTYPE)
    kernels = row.setdefault("public_kernels", {})
    modes = (("fwd_bwd", PUBLIC), ("fwd", PUBLIC_FWD))
    return lambda: time_public(called_ms, table, *qkv, cache["do"], causal, modes,
                               kernels=None if kernels else kernels)


def with_public(again, public):
    """again() and, where the row times the public call, its quantities too."""
    return again if public is None else (lambda: {**again(), **public()})


def measure(row, qkv, cache):
    """(the row's fields, its first timing included; what times it again: {"ms": ...} with the same timer)."""
    from called_timer import called_ms  # the probe beside this one (its folder is on sys.path)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from impl.attention.flash_launch import flash_attention_triton_forward

    q, k, v = qkv
    causal = row["shape"][4]
    timer = called_ms if row.get("timer") == "called" else bench
    if row["impl"] in ("cudnn", "sdpa flash"):
        backend = SDPBackend.CUDNN_ATTENTION if row["impl"] == "cudnn" else SDPBackend.FLASH_ATTENTION

        def again():
            with sdpa_kernel(backend):
                return {"ms": timer(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))}

        return again(), again
    if "triton" not in cache:
        cache["triton"] = flash_attention_triton_forward(q, k, v, causal)
    public = public_timer(row, qkv, cache)
    if row["impl"] == "triton":
        again = with_public(lambda: {"ms": timer(lambda: flash_attention_triton_forward(q, k, v, causal))}, public)
        return again(), again
    fwd = auto_forward(row["config"]) if row.get("timer") == "called" else launcher(row["impl"])
    o, _ = fwd(q, k, v, causal, row["config"])
    err = rel_err(o, cache["triton"][0])
    again = with_public(lambda: {"ms": timer(lambda: fwd(q, k, v, causal, row["config"]))}, public)
    return {**again(), "err": err, "wrong": err > WRONG}, again


def fill_ratios(rows) -> None:
    from impl.attention import attention_flops

    anchor = {}
    for r in rows:
        if r.get("ms") is not None and r["impl"] in ("cudnn", "triton"):
            anchor[(r["shape_name"], r["impl"])] = r["ms"]
    for r in rows:
        ms = r.get("ms")
        b, h, n, d, causal = r["shape"]
        r["tflops"] = attention_flops(b * h, n, n, d, causal, "fwd") / ms * 1e-9 if ms else None
        for impl in ("cudnn", "triton"):
            a = anchor.get((r["shape_name"], impl))
            r[f"/{impl}"] = ms / a if ms and a else None


HEAD = f"{'shape':<22}{'impl':<12}{'config':<26}{'ms':>9}{'TF/s':>7}{'/cudnn':>8}{'/triton':>8}{'err':>9}  note"


def line(r) -> str:
    num = (lambda x, f: f"{x:{f}}" if x is not None else "-")
    note = "WRONG " if r.get("wrong") else ""
    note += f"public f+b {r[PUBLIC]:.3f} ms " if r.get(PUBLIC) is not None else ""
    return (f"{r['shape_name']:<22}{r['impl']:<12}{cfg_text(r['config']):<26}{num(r.get('ms'), '9.3f'):>9}"
            f"{num(r.get('tflops'), '7.0f'):>7}{num(r.get('/cudnn'), '8.3f'):>8}{num(r.get('/triton'), '8.3f'):>8}"
            f"{num(r.get('err'), '9.1e'):>9}  {note}{(r.get('error') or '')[:80]}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default=os.path.join(os.environ.get("OUT", "."), "flash_gluon_fwd.json"))
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no row that would end past this")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, touch no GPU")
    ap.add_argument("--short", action="store_true",
                    help="the short shapes (4x32x512..3000) as called, for the kernel table's min_seq")
    ap.add_argument("--only", action="append", default=[], metavar="REGEX",
                    help="keep only rows whose 'shape impl config' label matches (repeatable: any of them)")
    ap.add_argument("--shapes", nargs="+", type=parse_shape, help="only these shapes (BxHxNxD[:full]), no sweeps")
    ap.add_argument("--rows", nargs="+", choices=ROWS, help=f"with --shapes: the row kinds (default {SHAPE_ROWS})")
    ap.add_argument("--rounds", type=check_rounds, default=1, metavar="R",
                    help="per shape, time every row R times in all, the order reversed every other round; report "
                         "the medians (default 1: one timing each)")
    args = ap.parse_args(argv)
    if args.rows and not args.shapes:
        ap.error("--rows selects the rows of --shapes; give --shapes too")
    if args.shapes and args.short:
        ap.error("--shapes and --short are two plans; give one")
    specs = plan(args.short, tuple(args.only), args.shapes, tuple(args.rows or SHAPE_ROWS))
    if not specs:
        ap.error(f"no row matches --only {args.only}")
    if args.dry_run:
        for s in specs:
            print(f"{shape_name(s['shape']):<22}{s['impl']:<12}{cfg_text(s['config']):<26} est {s['est']:4.0f} s"
                  + ("  + public call" if times_public(s) else ""))
        print(plan_line(len(specs), sum(s["est"] for s in specs), RETIME_S * len(specs), args.rounds, args.budget_s))
        return
    import triton

    start, rows = time.time(), []
    res = {"device": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
           "torch": torch.__version__, "triton": triton.__version__, "budget_s": args.budget_s,
           "stopped_by_budget": False, "left_out": [], "rows": rows}
    if args.rounds > 1:
        res["rounds"] = args.rounds  # each row's "ms": the median of its "ms_rounds"
    shape, qkv, cache = None, None, {}
    later = ShapeRounds(args.rounds, TIMED)

    def dump():
        res["seconds"] = time.time() - start
        json.dump(res, open(args.out, "w"), indent=1, default=cfg_text)

    def end_shape(rest) -> bool:
        return close_shape(later, res, rest, lambda: time.time() - start, args.budget_s, lambda: fill_ratios(rows),
                           line, row_label, dump)

    print(HEAD, flush=True)
    if note(args.rounds):
        print(note(args.rounds), flush=True)
    for i, spec in enumerate(specs):
        if spec["shape"] != shape and not end_shape(specs[i:]):
            break
        if time.time() - start + spec["est"] > args.budget_s:
            res["stopped_by_budget"] = True
            res["left_out"] = [f"{shape_name(s['shape'])} {s['impl']} {cfg_text(s['config'])}" for s in specs[i:]]
            print(f"budget: stopped after {time.time() - start:.0f} s, {len(specs) - i} rows left out", flush=True)
            break
        if spec["shape"] != shape:
            qkv, cache = None, {}  # free the last shape's tensors first
            torch.cuda.empty_cache()
            shape, qkv = spec["shape"], inputs(spec["shape"])
        row = dict(shape=spec["shape"], shape_name=shape_name(spec["shape"]), impl=spec["impl"],
                   config=spec["config"], ms=None, err=None, wrong=None, error=None)
        if "timer" in spec:  # --short: timed as called (called_timer), the Gluon kernel through the dispatch
            row["timer"] = spec["timer"]
        t0 = time.time()
        try:
            out, again = measure(row, qkv, cache)
            row.update(out)
            later.add(row, again, RETIME_S)
        except Exception as e:  # noqa: BLE001 - a failed row is a result; the probe goes on
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        row["s"] = round(time.time() - t0, 1)
        rows.append(row)
        fill_ratios(rows)
        print(line(row), flush=True)
        dump()
    end_shape([])  # the last shape's (or, after a budget stop, the cut shape's) rounds
    dump()
    print(HEAD)
    if note(args.rounds):
        print(note(args.rounds))
    print("\n".join(line(r) for r in rows))
    print(f"{res['seconds']:.0f} s; {res['device']}, torch {res['torch']}, triton {res['triton']}"
          + (f"; budget stop, {len(res['left_out'])} rows left out" if res["stopped_by_budget"] else ""))


if __name__ == "__main__":
    main()
