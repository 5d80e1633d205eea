"""The public call of the Gluon probes' --short rows (issue 47, stage 4: the kernel table's min_seq from calls as
users make them).

The --short rows time each half alone through flash_dispatch.gluon_forward / gluon_backward; users call
FlashAttentionTriton.apply (forward and backward through autograd), whose host path (autograd, the dispatch, the
plans) the halves alone do not pay the same way: flash_shapes (NOTES.md) put kernels="auto" at 1.19x Triton at
4x32x1024x128 causal where the backward alone had called Gluon faster. So each --short Gluon row and the Triton
row also time public_step: FlashAttentionTriton.apply forward+backward (impl.workloads.attention's attention_step,
"fwd_bwd": the input gradients reset first; flash_options("flash_auto")) with flash_dispatch's table replaced, for
that row only, by one holding just the row's entry for the direction under test (min_seq 0; the Triton row: no
entry), so the other half runs Triton in both rows and the difference is the half under test with its real host
path. Recorded as PUBLIC ("timer": "called"); tools/probes/kernel_table.py judges a length by it where present.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Dict, Optional

PUBLIC = "public_fwd_bwd"  # FlashAttentionTriton.apply forward+backward, as called
PUBLIC_FWD = "public_fwd"  # the forward alone through the same call (the forward probe's rows)


def only_entry_table(direction: str, kernel: Optional[str], config, arch: str, d: int, causal: bool, dtype: str):
    """A kernel table holding just (direction, kernel, config) at the key, from every length (min_seq 0); kernel
    None: no entry (both halves Triton). config: the launcher's config dataclass."""
    from impl.attention import kernel_table as kt

    if kernel is None:
        return kt.KernelTable(())
    # An entry must carry a measured win (KernelChoice's check); this one is the row's own trial, not a record.
    trial = kt.Measured("this probe row", "", (0, 0, 0, d), 0.0, 1.0, 0.0)
    return kt.KernelTable((kt.KernelChoice(direction, arch, d, bool(causal), dtype, kernel,
                                           kt.config_pairs(config), (trial,)),))


@contextlib.contextmanager
def table_replaced(table):
    """flash_dispatch reads `table` inside the block (the mechanism the tests' table fixtures use), the shipped
    one again after it, also when the block raises."""
    from impl.attention import flash_dispatch

    saved = flash_dispatch.shipped_table
    flash_dispatch.shipped_table = lambda: table
    try:
        yield table
    finally:
        flash_dispatch.shipped_table = saved


def public_step(q, k, v, do, causal: bool, mode: str = "fwd_bwd", recorder=None) -> Callable[[], object]:
    """FlashAttentionTriton.apply as flash_shapes' flash_auto rows call it (kernels="auto"; `mode` one of
    attention_step's), on leaf copies of q, k, v that require grad."""
    from impl.attention import FlashAttentionTriton
    from impl.workloads.attention import attention_step, flash_options

    options = flash_options("flash_auto", recorder)
    qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
    return attention_step(lambda a, b, c: FlashAttentionTriton.apply(a, b, c, causal, options), mode, qg, kg, vg, do)


def time_public(timer: Callable, table, q, k, v, do, causal: bool, modes=(("fwd_bwd", PUBLIC),),
                kernels: Optional[dict] = None) -> Dict[str, float]:
    """{quantity: ms} of the public call per (mode, quantity) under `table` (restored after, also on error).
    kernels (a dict): filled first with the kernel each half ran in one call (a launcher refusing the inputs falls
    back to Triton: the row then says so)."""
    from impl.attention import LaunchRecorder

    with table_replaced(table):
        if kernels is not None:
            recorder = LaunchRecorder()
            public_step(q, k, v, do, causal, "fwd_bwd", recorder)()
            kernels.update({kind: r.kernel for kind, r in sorted(recorder.last.items())})
        return {quantity: timer(public_step(q, k, v, do, causal, mode)) for mode, quantity in modes}
