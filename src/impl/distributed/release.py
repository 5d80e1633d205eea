"""Waiting until gloo's worker threads let go of a collective's tensors (issue 23).

After a collective returns (or its ``wait()`` does), the gloo worker thread that ran it still
holds the work and with it the tensors, and, for one launched inside backward, the context torch
stashes in thread-local state. Dropping those takes the GIL, since the tensors are Python objects.
If the process reaches interpreter shutdown first, Python ends that thread inside a C++ destructor
and the process aborts: "terminate called without an active exception" (SIGABRT), after the rank
finished its work. So code that hands tensors to collectives records each tensor's use count
before, drops its work handles after waiting, then sleeps (the GIL released) until the counts
are back: the worker destroyed the work. torch's DDP avoids it by keeping its works in the C++
reducer, whose buckets have no Python objects.

The count alone is not enough: torch 2.13 lowers a TensorImpl's use count first and only then, on
the 2 -> 1 transition, decrefs its Python object, taking the GIL (c10/util/intrusive_ptr.h, "PyObject
preservation"). So a wait that sees the count back may return while the worker still queues for the
GIL, and a rank that exits then aborts: the likely cause of CI's aborts in the sharded optimizer's
launches (2 in ~60 runs); tools/probes/release_race.py sees such early returns. ``Released`` therefore
also holds each CPU tensor from C++ (a ``torch._C.ScriptList``) until its wait: the worker's drop is
then never the 2 -> 1 one, and the Python object is decref'd by the waiting thread, which has the GIL.

GPU tensors are skipped: NCCL's watchdog frees works on its own schedule; waiting for it would
stall every step.
"""

from __future__ import annotations

import time

import torch

RELEASE_TIMEOUT_S = 5.0


def await_release(sent: list[tuple[torch.Tensor, int]], timeout_s: float = RELEASE_TIMEOUT_S) -> None:
    """Sleep until each CPU tensor's use count is at most its count before its collective. Call
    after dropping the work handles; gives up after ``timeout_s`` (no worse than not waiting)."""
    deadline = time.monotonic() + timeout_s
    for tensor, count_before in sent:
        while not tensor.is_cuda and tensor._use_count() > count_before and time.monotonic() < deadline:
            time.sleep(1e-4)


class Released:
    """``with Released() as keep: dist.all_reduce(keep(t))``: on leaving, waits until the
    collectives' worker threads released every tensor passed through ``keep``. For an async
    collective whose wait comes later, hold the instance instead, and call ``wait()`` once its
    work handle is waited on and dropped. A view holds its base: make the views that outlive the
    wait before passing the base, or they keep its count up (and the wait runs into its timeout)."""

    def __init__(self):
        self.sent: list[tuple[torch.Tensor, int]] = []
        self._holds: list = []  # C++ references to the sent tensors, dropped by wait()

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.is_cuda:
            # Taken before the count, which then includes it: gloo's worker drops to it, not below.
            self._holds.append(torch._C.ScriptList([tensor]))
        self.sent.append((tensor, tensor._use_count()))
        return tensor

    def __enter__(self) -> "Released":
        return self

    def wait(self) -> None:
        """Wait for the release of every tensor passed so far, then let go of them."""
        await_release(self.sent)
        self._holds.clear()  # the last C++ references go here, on this thread, with the GIL
        self.sent.clear()

    def __exit__(self, *exc) -> None:
        self.wait()


def released(collective, *args, **kwargs):
    """``collective(*args, **kwargs)`` (blocking), then wait until gloo let go of the tensors among
    `args`, lists of tensors included: ``released(dist.all_reduce, t)``. For code whose collectives
    have no Released of their own (test kits, benchmarks): the last collective before a rank exits
    is the one that aborts it."""
    with Released() as keep:
        def kept(a):
            if isinstance(a, torch.Tensor):
                return keep(a)
            if isinstance(a, (list, tuple)) and a and all(isinstance(x, torch.Tensor) for x in a):
                return type(a)(keep(x) for x in a)
            return a
        return collective(*(kept(a) for a in args), **kwargs)
