"""CPU probe: are the Gluon kernels' sm_90a PTX (and compile figures) unchanged by a refactor?

Compiles every kernel variant the sm_90a compile-figure tests cover (correctness/test_flash_gluon.py,
correctness/test_flash_gluon_bwd.py: the stage-1 and ws forwards, the one-pass / dK-dV backward, the dQ
kernel, the ws backward), each from its launcher's own launch_args over CPU tensors, with
kits.sm90_compile.compile_for_sm90 (triton.compile for sm_90a; no GPU). Per variant it saves the PTX and
the figures: registers, stack and local (spill) bytes, dynamic shared memory, num_warps, the setmaxnreg
budgets and a hash of the SASS (cuobjdump of Triton's cubin). A variant the launcher refuses (a config
over shared memory) is saved as its refusal.

    PYTHONPATH=src python tools/probes/gluon_ptx_same.py dump DIR [--only SUBSTR] [--jobs N]
    PYTHONPATH=src python tools/probes/gluon_ptx_same.py compare BASE [NEW] [--only SUBSTR] [--jobs N]
    PYTHONPATH=src python tools/probes/gluon_ptx_same.py diff BASE NEW      (two dumps; compiles nothing)
    PYTHONPATH=src python tools/probes/gluon_ptx_same.py list

Each run compiles into a fresh, empty Triton cache (--cache: reuse Triton's), so nothing is read back
from a compile of another tree.

`dump` writes DIR/<variant>.ptx and DIR/<variant>.json. `compare` compiles the working tree into NEW (a
temporary folder when omitted) and compares it with BASE, a `dump` taken before the change: every
variant's normalised PTX must be identical and its figures equal (registers, stack, local bytes, shared
memory, warps, setmaxnreg budgets, SASS instruction counts); exit status 0 when all are, 1 otherwise,
with the first differing lines of each differing PTX. A variant of BASE missing from NEW is a difference;
one only NEW has (a kernel variant added by the change, e.g. stage 3d's dq_stages 2) is listed as new and
not compared. Config fields added later are left out of the names at their default (_LATER_FIELDS), so
older dumps keep comparing. `dump` also writes DIR/<variant>.sass.

The SASS is compared too but only reported: for the kernels that spill (the d 128 one-pass backward,
the ws backward) ptxas's SASS is not a function of the normalised PTX. The same source compiled from
two checkouts in other folders (PTX differing only in `.file` names) gave other SASS for 4 of the 61
variants; the stage-3b PTX, one file compiled twice with Triton's flags, gave two SASS differing in
spill-slot offsets (masked by _sass_key); the d 128 one-pass backward's PTX compiled three times from one
file gave one SASS, but its PTX from another folder another schedule. No kernel without spills varied.

What normalising removes (nothing that can reach the machine code): `.loc` and `.file` lines (source
positions and file names), the `.section .debug_*` blocks and the `$L__tmp` / `$L__func_*` labels that
only they refer to (both depend on where a helper's source lives and how calls nest), trailing blanks,
and the kernel's own symbol (its `.entry` name and the `<name>_param_N` names), so that a renamed kernel
compares too. Everything else (instructions, registers, labels of basic blocks, shared-memory symbols,
the `.maxnreg` / `.reqntid` directives) must match to the letter.
"""
from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
import multiprocessing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ----------------------------------------------------------------------------- the variants

def _fwd_variants():
    from impl.attention import flash_gluon, flash_gluon_ws

    out = []
    for tag, mod in (("fwd1", flash_gluon), ("fwdws", flash_gluon_ws)):
        for d in (64, 80, 96, 128):
            for causal in (False, True):
                out.append((tag, d, causal, "bf16", mod.default_config(d)))
        for d in (80, 128):
            out.append((tag, d, True, "fp16", mod.default_config(d)))
        for config in mod.CANDIDATE_CONFIGS + getattr(mod, "TRIAL_CONFIGS", ()):  # ws: the lpt grid (issue 47)
            out.append((tag, 128, True, "bf16", config))
    return out


def _bwd_variants():
    from impl.attention import flash_gluon_bwd as bwd

    out = []
    for d in (64, 80, 96, 128):
        for causal in (False, True):
            out.append(("bwd", d, causal, "bf16", bwd.default_config(d)))
    for d in (80, 128):
        out.append(("bwd", d, True, "fp16", bwd.default_config(d)))
    for config in bwd.CANDIDATE_CONFIGS:
        if config != bwd.default_config(128) and config.dq != "gluon":
            out.append(("bwd", 128, True, "bf16", config))
    for d in (64, 80, 96):
        out.append(("bwd", d, True, "bf16", bwd.GluonBwdConfig(dq="triton")))
    for d in (64, 80, 96, 128):  # stage 3d: two dQ staging tiles (the candidate covers d 128 causal)
        for causal in (False, True):
            out.append(("bwd", d, causal, "bf16", bwd.GluonBwdConfig(dq_stages=2)))
    out.append(("bwd", 128, True, "bf16", bwd.GluonBwdConfig(num_stages=3, dq_stages=2)))  # refused: dq_stages
    for d in (64, 80, 96, 128):  # stage 3e: dQ by atomics from registers
        for causal in (False, True):
            out.append(("bwd", d, causal, "bf16", bwd.GluonBwdConfig(dq="atomic")))
    for dq in ("reduce", "atomic"):  # stage 4b: descriptors rebuilt each query tile (no spills at d 128)
        for d in (64, 80, 96, 128):
            for causal in (False, True):
                out.append(("bwd", d, causal, "bf16", bwd.GluonBwdConfig(dq=dq, rebuild=True)))
    out.append(("bwd", 128, True, "fp16", bwd.GluonBwdConfig(rebuild=True)))
    for config in bwd.CANDIDATE_CONFIGS:  # stage 4c: the prefetching candidates also without the causal mask, and at
        if config.prefetch:  # a split head dim (80: lo and hi halves)
            out += [("bwd", 128, False, "bf16", config), ("bwd", 80, True, "bf16", config)]
    default = bwd.GluonBwdConfig(dq="gluon").dq_tiles
    for d in (64, 80, 96, 128):
        for causal in (False, True):
            out.append(("dq", d, causal, "bf16", default))
    out.append(("dq", 128, True, "fp16", default))
    for config in bwd.CANDIDATE_CONFIGS:
        if config.dq == "gluon" and config.dq_tiles != default:
            out.append(("dq", 128, True, "bf16", config.dq_tiles))
    out.append(("dq", 128, True, "bf16", (64, 64, 4)))
    out.append(("dq", 128, True, "bf16", (128, 128, 3)))  # refused (shared memory)
    from impl.attention import flash_gluon_bwd_ws as ws

    for causal in (False, True):  # stage 3b's kernel ("fixed") and stage 4d's rebuild
        for config in ws.CANDIDATE_CONFIGS:
            out.append(("bwdws", 128, causal, "bf16", config))
    out.append(("bwdws", 128, True, "fp16", ws.GluonBwdWsConfig()))
    for causal in (False, True):  # issue 47, ws d 64: K in a 64-byte swizzle (flash_gluon_bwd_ws.K_SWIZZLE)
        for config in ws.CANDIDATE_CONFIGS:
            out.append(("bwdws", 64, causal, "bf16", config))
    out.append(("bwdws", 64, True, "fp16", ws.GluonBwdWsConfig()))
    for causal in (False, True):  # issue 47, ws 128-row query tiles (d 64 only)
        out.append(("bwdws", 64, causal, "bf16", ws.GluonBwdWsConfig(block_m=128)))
    for causal in (False, True):  # issue 47, ws dQ over a consumer's own keys (d 64 only), and with a third slot
        out.append(("bwdws", 64, causal, "bf16", ws.GluonBwdWsConfig(dq_own_keys=True)))
    out.append(("bwdws", 64, True, "bf16", ws.GluonBwdWsConfig(dq_own_keys=True, num_stages=3)))
    out.append(("bwdws", 64, True, "bf16", ws.GluonBwdWsConfig(dq_own_keys=True, release_before_dq=True)))
    for causal in (False, True):  # issue 47, ws ping-pong of the own-keys consumers (d 64 only)
        out.append(("bwdws", 64, causal, "bf16", ws.GluonBwdWsConfig(dq_own_keys=True, pingpong=True)))
    for d in (128, 64):  # issue 47, ws prescaled lse (64-row tiles), and with own-keys dQ (d 64)
        for causal in (False, True):
            out.append(("bwdws", d, causal, "bf16", ws.GluonBwdWsConfig(prescaled_lse=True)))
    out.append(("bwdws", 64, True, "fp16", ws.GluonBwdWsConfig(prescaled_lse=True)))
    for causal in (False, True):
        out.append(("bwdws", 64, causal, "bf16", ws.GluonBwdWsConfig(dq_own_keys=True, prescaled_lse=True)))
    for d in (128, 64):  # issue 47, ws stats in shared memory (with the prescaled lse)
        for causal in (False, True):
            out.append(("bwdws", d, causal, "bf16", ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True)))
    out.append(("bwdws", 64, True, "fp16", ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True)))
    out.append(("bwdws", 128, True, "bf16", ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True, num_stages=3)))
    out.append(("bwdws", 64, True, "bf16", ws.GluonBwdWsConfig(dq_own_keys=True, pingpong=True, prescaled_lse=True,
                                                                 stats_smem=True)))
    for causal in (False, True):  # issue 47, ws dQ by one consumer (d 64 only), with the statistics through the ring
        out.append(("bwdws", 64, causal, "bf16", ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True,
                                                                     dq_one_consumer=True)))
    lean = dict(prescaled_lse=True, stats_smem=True, lean_sync=True)  # issue 47, the d 64 backward's handshakes:
    for causal in (False, True):  # lean_sync on the table's d 64 config, and with a third slot, and at d 128
        out.append(("bwdws", 64, causal, "bf16", ws.GluonBwdWsConfig(**lean)))
    out.append(("bwdws", 64, True, "bf16", ws.GluonBwdWsConfig(num_stages=3, **lean)))
    out.append(("bwdws", 128, True, "bf16", ws.GluonBwdWsConfig(**lean)))
    return out


#: Config fields added after dumps were taken, left out of a variant's name at their default value, so that
#: every variant compiled before the field existed keeps its name (and compares against an older dump).
#: GluonBwdConfig: stages 3d, 4b, 4c.
_LATER_FIELDS = {"dq_stages": 1, "rebuild": False, "prefetch": False, "refill_first": False, "lpt": False,
                 "early_q": False, "o_regs": False, "rotate": False, "lazy_sum": False, "prefetch_q": False,
                 "dynamic": False}


def _config_tag(config) -> str:
    if config is None:
        return "fixed"
    if type(config).__name__ == "GluonBwdWsConfig":  # fixed tiles; "fixed" alone: stage 3b's kernel, as named before
        tag = "fixed-rebuild" if config.rebuild else "fixed"
        tag += f"-s{config.num_stages}" if config.num_stages != 2 else ""  # issue 47, ws refill: named only when set
        tag += "-release" if config.release_before_dq else ""
        tag += f"-m{config.block_m}" if config.block_m != 64 else ""  # ws 128-row query tiles: when set
        tag += "-ownkeys" if config.dq_own_keys else ""  # ws dQ over a consumer's own keys: when set
        tag += "-pingpong" if config.pingpong else ""  # and the consumers' ping-pong
        tag += "-prescaled-lse" if config.prescaled_lse else ""  # ws prescaled lse: when set
        tag += "-stats-smem" if config.stats_smem else ""  # ws stats in shared memory: when set
        tag += "-dq-one" if config.dq_one_consumer else ""  # ws dQ by one consumer: when set
        return tag + ("-lean-sync" if config.lean_sync else "")  # the d 64 backward's handshakes: when set
    if isinstance(config, tuple):
        return "tiles" + "x".join(map(str, config))
    fields = []
    for k, v in vars(config).items():
        if k in _LATER_FIELDS and v == _LATER_FIELDS[k]:
            continue
        if isinstance(v, bool):
            v = int(v)
        elif isinstance(v, tuple):
            v = "x".join(map(str, v))
        fields.append(f"{k}{v}")
    return "-".join(fields)


def variant_name(v) -> str:
    kind, d, causal, dtype, config = v
    name = f"{kind}_d{d}_{'causal' if causal else 'full'}_{dtype}_{_config_tag(config)}"
    return re.sub(r"[^A-Za-z0-9_.-]", "", name)


def variants() -> list:
    """Every (kind, d, causal, dtype, config) the compile-figure tests compile, deduplicated."""
    seen, out = set(), []
    for v in _fwd_variants() + _bwd_variants():
        n = variant_name(v)
        if n not in seen:
            seen.add(n)
            out.append(v)
    return out


def _compile(v):
    """triton.compile of variant v for sm_90a: (kernel, compiled) or raises the launcher's ValueError."""
    import torch
    from kits.sm90_compile import compile_for_sm90

    kind, d, causal, dtype, config = v
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    if kind in ("fwd1", "fwdws"):
        from impl.attention import flash_gluon, flash_gluon_ws

        mod, fn = ((flash_gluon, flash_gluon._attn_fwd_sm90) if kind == "fwd1"
                   else (flash_gluon_ws, flash_gluon_ws._attn_fwd_ws_sm90))
        q, k, v_ = (torch.randn(2, 3, 1000, d, dtype=dt) for _ in range(3))
        o, lse = torch.empty_like(q), torch.empty(q.shape[:-1])
        grid, args, opts = mod.launch_args(q, k, v_, o, lse, causal, config)
        # early_q's / o_regs' output pointer (stored from registers) is 16-byte aligned at a launch, as L
        from_regs = getattr(config, "early_q", False) or getattr(config, "o_regs", False)
        aligned = ("L",) + (("O",) if from_regs else ())
        return fn, compile_for_sm90(fn, args, opts, divisible=aligned)
    if kind == "bwd":
        from impl.attention import flash_gluon_bwd as mod

        q, k, v_, do = (torch.randn(2, 3, 1000, d, dtype=dt) for _ in range(4))
        lse, delta = torch.empty(q.shape[:-1]), torch.empty(q.shape[:-1])
        dq32 = torch.empty(q.shape) if config.dq in ("reduce", "atomic") else None
        dk, dv = torch.empty_like(k), torch.empty_like(v_)
        grid, args, opts = mod.launch_args(q, k, v_, do, lse, delta, dq32, dk, dv, causal, config)
        divisible = ("L", "Delta") + (("dq_ptr",) if config.dq == "atomic" else ())  # the fp32 buffer of stage 3e
        return mod._attn_bwd_sm90, compile_for_sm90(mod._attn_bwd_sm90, args, opts, divisible=divisible)
    if kind == "dq":
        from impl.attention import flash_gluon_dq as mod

        q, k, v_, o, do = (torch.randn(2, 3, 1000, d, dtype=dt) for _ in range(5))
        lse, delta = torch.empty(q.shape[:-1]), torch.empty(q.shape[:-1])
        grid, args, opts = mod.dq_launch_args(q, k, v_, o, do, lse, delta, torch.empty_like(q), causal, config)
        return mod._attn_bwd_dq_sm90, compile_for_sm90(mod._attn_bwd_dq_sm90, args, opts,
                                                       divisible=("O", "L", "Delta"))
    if kind == "bwdws":
        from impl.attention import flash_gluon_bwd_ws as mod

        q, k, v_, do = (torch.randn(2, 3, 1000, d, dtype=dt) for _ in range(4))
        lse, delta = torch.empty(q.shape[:-1]), torch.empty(q.shape[:-1])
        grid, args, opts = mod.launch_args(q, k, v_, do, lse, delta, torch.empty(q.shape), torch.empty_like(k),
                                           torch.empty_like(v_), causal, config)
        return mod._attn_bwd_ws_sm90, compile_for_sm90(mod._attn_bwd_ws_sm90, args, opts,
                                                       divisible=("L", "Delta"))
    raise ValueError(kind)


def _sass(cubin: bytes) -> str:
    import subprocess

    import triton

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    fd, path = tempfile.mkstemp(suffix=".cubin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        return subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)


def _sass_body(sass: str) -> str:
    """The SASS instructions only (cuobjdump's header names the temporary file)."""
    return "\n".join(line for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line))


def _sass_key(sass: str) -> str:
    """The SASS with the local-memory offsets of spill stores and loads masked: ptxas (12.x, Triton 3.6's)
    places spilled values in stack slots nondeterministically. The stage-3b backward's PTX, one file
    compiled twice by the same ptxas with Triton's flags (three times without -lineinfo), gave SASS that
    differ only in the [R1+0x..] offsets of their STL/LDL (and so in those instructions' encodings,
    dropped here too); a kernel without spills compiles to the same SASS every time."""
    out = []
    for line in sass.splitlines():
        if re.search(r"\b(STL|LDL)\b", line):
            line = re.sub(r"/\*\s*0x[0-9a-f]+\s*\*/", "", re.sub(r"\[R1(\+0x[0-9a-f]+)?\]", "[R1+X]", line))
        out.append(line.rstrip())
    return "\n".join(out)


def _sass_hash(folder: str, name: str, meta: dict):
    """The SASS key's hash of a dumped variant: from its saved .sass (so a later _sass_key applies to an
    older dump), else the one its .json recorded."""
    path = os.path.join(folder, name + ".sass")
    if os.path.exists(path):
        with open(path) as f:
            return hashlib.sha256(_sass_key(f.read().rstrip("\n")).encode()).hexdigest()
    return meta.get("sass_sha256")


def dump_one(args):
    """Compile variant v and write DIR/<name>.ptx and .json; returns (name, ok, message)."""
    v, out_dir = args
    os.environ.pop("TRITON_INTERPRET", None)
    for p in (os.path.join(ROOT, "src"), os.path.join(ROOT, "correctness")):
        if p not in sys.path:
            sys.path.insert(0, p)
    name = variant_name(v)
    meta = dict(variant=name, kind=v[0], d=v[1], causal=v[2], dtype=v[3], config=repr(v[4]))
    try:
        fn, ck = _compile(v)
    except ValueError as e:  # the launcher's refusal: part of what must not change
        meta["refused"] = str(e)
        with open(os.path.join(out_dir, name + ".json"), "w") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
        return name, True, "refused"
    from kits.sm90_compile import cubin_figures

    figs = cubin_figures(ck)
    sass = _sass_body(_sass(ck.asm["cubin"]))
    ptx = ck.asm["ptx"]
    meta.update(kernel=ck.metadata.name, num_warps=ck.metadata.num_warps, shared=ck.metadata.shared,
                regs=figs["regs"], stack=figs["stack"], local=figs["local"], partitions=figs["partitions"],
                counts={k: figs[k] for k in ("hgmma", "tma_loads", "tma_stores", "tma_reduce", "ex2", "bar_sync",
                                             "stl", "ldl", "setmaxnreg")},
                ptx_sha256=hashlib.sha256(normalise(ptx).encode()).hexdigest(),
                sass_sha256=hashlib.sha256(_sass_key(sass).encode()).hexdigest(),
                sass_raw_sha256=hashlib.sha256(sass.encode()).hexdigest())
    with open(os.path.join(out_dir, name + ".ptx"), "w") as f:
        f.write(ptx)
    with open(os.path.join(out_dir, name + ".sass"), "w") as f:
        f.write(sass + "\n")
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    return name, True, f"regs {figs['regs']} shared {ck.metadata.shared}"


# ----------------------------------------------------------------------------- normalising, comparing

def normalise(ptx: str) -> str:
    """The PTX without what cannot reach the machine code (see the module's docstring)."""
    # The debug sections run from the first `.section .debug_` to the end of the file.
    m = re.search(r"^\s*\.section\s+\.debug_", ptx, flags=re.M)
    if m:
        ptx = ptx[:m.start()]
    entry = re.search(r"\.entry\s+([A-Za-z_$][\w$]*)", ptx)
    lines = []
    for line in ptx.splitlines():
        s = line.strip()
        if re.match(r"\.(loc|file)\b", s) or re.match(r"\$L__(tmp|func_begin|func_end)\d+:$", s):
            continue
        lines.append(line.rstrip())
    out = "\n".join(lines) + "\n"
    if entry:
        out = re.sub(r"\b" + re.escape(entry.group(1)) + r"\b", "KERNEL", out)
        out = re.sub(r"\b" + re.escape(entry.group(1)) + r"(_param_\d+)", r"KERNEL\1", out)
    return out


def _without_later_fields(message: str) -> str:
    """A refusal's text with the config repr's _LATER_FIELDS at their defaults (", rebuild=False") removed, so that a
    refusal dumped before such a field existed compares equal."""
    for k, v in _LATER_FIELDS.items():
        message = message.replace(f", {k}={v!r}", "")
    return message


_FIGURE_KEYS = ("refused", "num_warps", "shared", "regs", "stack", "local", "partitions", "counts")


def compare(base: str, new: str, names, only: str = "") -> int:
    """Every variant of BASE (whose name contains `only`) must be in NEW, identical; a variant only NEW has
    (added since BASE was dumped) is listed as new and not compared."""
    bad = n_sass = 0
    added = []
    in_base = sorted(f[:-5] for f in os.listdir(base) if f.endswith(".json") and only in f)
    for name in [n for n in in_base if n not in names]:
        print(f"DIFF {name}: missing in new")
        bad += 1
    for name in names:
        pb, pn = (os.path.join(x, name + ".json") for x in (base, new))
        if not os.path.exists(pn):
            print(f"DIFF {name}: missing in new")
            bad += 1
            continue
        if not os.path.exists(pb):
            added.append(name)
            print(f"new  {name}: not in base, not compared")
            continue
        with open(pb) as f:
            mb = json.load(f)
        with open(pn) as f:
            mn = json.load(f)
        if "refused" not in mb:
            mb["sass_sha256"] = _sass_hash(base, name, mb)
        if "refused" not in mn:
            mn["sass_sha256"] = _sass_hash(new, name, mn)
        for m in (mb, mn):  # a refusal names the config: its later fields at their default left out, as in names
            if "refused" in m:
                m["refused"] = _without_later_fields(m["refused"])
        diffs = [f"{k}: {mb.get(k)!r} -> {mn.get(k)!r}" for k in _FIGURE_KEYS if mb.get(k) != mn.get(k)]
        sass_note = "" if mb.get("sass_sha256") == mn.get("sass_sha256") else \
            " (SASS differs: ptxas's own variation, see the module's docstring)"
        if "refused" not in mb and "refused" not in mn:
            with open(os.path.join(base, name + ".ptx")) as f:
                xb = normalise(f.read())
            with open(os.path.join(new, name + ".ptx")) as f:
                xn = normalise(f.read())
            if xb != xn:
                d = list(difflib.unified_diff(xb.splitlines(), xn.splitlines(), "base", "new", n=1, lineterm=""))
                diffs.append(f"normalised PTX differs ({len(d)} diff lines):\n    " + "\n    ".join(d[:40]))
        if diffs:
            bad += 1
            print(f"DIFF {name}:\n  " + "\n  ".join(diffs))
        else:
            what = "refused, same message" if "refused" in mb else \
                f"PTX identical, regs {mn['regs']}, shared {mn['shared']}, warps {mn['num_warps']}, stack {mn['stack']}"
            print(f"same {name}: {what}{sass_note}")
            n_sass += bool(sass_note)
    n_cmp = len(set(names) | set(in_base)) - len(added)
    print(f"\n{n_cmp - bad} of {n_cmp} variants identical; {bad} differ"
          + (f"; {n_sass} of the identical ones with other SASS (ptxas, not the PTX)" if n_sass else "")
          + (f"; {len(added)} new, not in base" if added else ""))
    return 1 if bad else 0


def run_dump(out_dir: str, only: str, jobs: int) -> list:
    os.makedirs(out_dir, exist_ok=True)
    vs = [v for v in variants() if only in variant_name(v)]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as ex:
        for name, ok, msg in ex.map(dump_one, [(v, out_dir) for v in vs]):
            print(f"compiled {name}: {msg}", flush=True)
    return [variant_name(v) for v in vs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("dump", "compare", "diff", "list"))
    ap.add_argument("dirs", nargs="*")
    ap.add_argument("--only", default="", help="variants whose name contains this")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--cache", action="store_true",
                    help="use Triton's cache (default: a fresh, empty cache dir, so every kernel is compiled here)")
    a = ap.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)  # these kernels are compiled, never interpreted
    if not a.cache and a.mode != "list":  # the workers inherit it
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="gluon_ptx_cache_")
    sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "correctness")]
    if a.mode == "list":
        for v in variants():
            if a.only in variant_name(v):
                print(variant_name(v))
        return 0
    if a.mode == "dump":
        if len(a.dirs) != 1:
            ap.error("dump DIR")
        names = run_dump(a.dirs[0], a.only, a.jobs)
        print(f"{len(names)} variants in {a.dirs[0]}")
        return 0
    if a.mode == "diff":  # two existing dumps, nothing compiled
        if len(a.dirs) != 2:
            ap.error("diff BASE NEW")
        names = sorted(f[:-5] for f in os.listdir(a.dirs[1]) if f.endswith(".json") and a.only in f)
        return compare(a.dirs[0], a.dirs[1], names, a.only)
    if len(a.dirs) not in (1, 2):
        ap.error("compare BASE [NEW]")
    base = a.dirs[0]
    new = a.dirs[1] if len(a.dirs) == 2 else tempfile.mkdtemp(prefix="gluon_ptx_new_")
    names = run_dump(new, a.only, a.jobs)
    print(f"compiled into {new}")
    return compare(base, new, names, a.only)


if __name__ == "__main__":
    sys.exit(main())
