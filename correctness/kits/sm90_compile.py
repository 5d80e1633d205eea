"""The sm_90a compile-figure tests' tools (test_flash_gluon, test_flash_gluon_bwd): a fresh Python to
compile in, and a compiled kernel's figures read from the cubin Triton produced, with Triton's own
cuobjdump: registers, stack and local (spill) bytes from its resource usage, instruction counts from its
SASS, dynamic shared memory and warps from the kernel's metadata."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# SASS instruction counts: (figure, pattern)
_COUNTS = (("hgmma", r"\bHGMMA\."), ("hmma", r"\bHMMA\."), ("tma_loads", r"\bUTMALDG\b"), ("tma_stores", r"\bUTMASTG\b"),
           ("tma_reduce", r"\bUTMAREDG\b"), ("ex2", r"\bMUFU\.EX2\b"), ("bar_sync", r"\bBAR\.SYNC\b"),
           ("stl", r"\bSTL\b"), ("ldl", r"\bLDL\b"), ("setmaxnreg", r"\bUSETMAXREG\b"))


def run_without_interpreter(code: str, *args: str) -> str:
    """Run `code` (with args) in a fresh Python without TRITON_INTERPRET (these tests compile, never
    interpret), this checkout's src and correctness/ (for kits) first on its path; its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src"), os.path.join(ROOT, "correctness")]
                                        + [p for p in [env.get("PYTHONPATH")] if p])
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=900,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def partitions(sass: str) -> dict[str, int]:
    """Each stretch of SASS after a setmaxnreg (USETMAXREG): its budget and the registers it touches
    (highest Rn + 1); per budget, the most any stretch under it uses. Empty without warp specialization."""
    out, budget, top = {}, None, 0
    for line in sass.splitlines():
        m = re.search(r"USETMAXREG\.\S+\.CTAPOOL\s+(?:UP\d+,\s*)?(0x[0-9a-f]+|\d+)", line)
        if m:
            if budget is not None:
                out[budget] = max(out.get(budget, 0), top)
            budget, top = int(m.group(1), 0), 0
            continue
        top = max([top] + [int(r) + 1 for r in re.findall(r"\bR(\d+)\b", line)])
    if budget is not None:
        out[budget] = max(out.get(budget, 0), top)
    return {str(b): r for b, r in sorted(out.items())}


def _cuobjdump() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def sass_text(ck) -> str:
    """`cuobjdump -sass` of `ck`'s cubin (Triton's own cuobjdump)."""
    fd, path = tempfile.mkstemp(suffix=".cubin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(ck.asm["cubin"])
        return subprocess.run([_cuobjdump(), "-sass", path], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)


def cubin_figures(ck) -> dict:
    """The figures of `ck`, a kernel triton.compile'd for sm_90a (see the module's docstring)."""
    cuobjdump = _cuobjdump()
    fd, path = tempfile.mkstemp(suffix=".cubin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(ck.asm["cubin"])
        res = subprocess.run([cuobjdump, "-res-usage", path], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)
    usage = dict(re.findall(r"\b(REG|STACK|LOCAL):(\d+)", res))
    return dict(regs=int(usage["REG"]), stack=int(usage["STACK"]), local=int(usage["LOCAL"]), shared=ck.metadata.shared,
                warps=ck.metadata.num_warps, target=re.search(r"\.target\s+(\S+)", ck.asm["ptx"]).group(1),
                partitions=partitions(sass), **{name: len(re.findall(p, sass)) for name, p in _COUNTS})


def compile_for_sm90(fn, args, opts, divisible=()):
    """triton.compile of the Gluon kernel `fn` for sm_90a with a launch's `args` and `opts` (its launcher's
    launch_args, built from CPU tensors: the descriptors, constexprs and warps a GPU launch passes), each
    argument specialized as the runtime would; the pointer arguments named in `divisible` 16-byte aligned."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    sig, const = {}, {}
    for i, (name, a) in enumerate(zip(fn.arg_names, args)):
        if fn.params[i].is_constexpr or a is None:
            sig[name], const[(i,)] = "constexpr", a
        else:
            sig[name] = mangle_type(a)  # what the runtime specializes a tensor / descriptor / scalar to
    for i in range(len(args), len(fn.params)):  # trailing constexprs left out: their defaults, as a launch binds them
        if fn.params[i].is_constexpr and fn.params[i].has_default:
            sig[fn.arg_names[i]], const[(i,)] = "constexpr", fn.params[i].default
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    return triton.compile(GluonASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
