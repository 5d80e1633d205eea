"""Issue 47: the shared-memory carve-out of loaded Triton / Gluon kernels, set from the host.

Triton 3.6's loader asks for CU_FUNC_CACHE_PREFER_SHARED on every kernel over 48 KB of shared memory, which on
an H100 puts each of our backward kernels in the 228 KB configuration and leaves a 28 KB L1 for their spill
reloads (NOTES.md, "Issue 47: the ncu reading of the d 128 backward"). The function attribute
CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT asks the driver for a smaller shared-memory share, a percent of
the most an SM has; it is a hint, followed where the kernel still fits.

`Loaded` records each kernel's CUfunction as Triton loads it (knobs.runtime.kernel_load_end_hook: install it
before the first launch); `set(pattern, percent)` sets the attribute on the loaded kernels whose name matches,
and `carveout(pattern, percent)` does so for a block of code, then puts the driver's default back.
"""
from __future__ import annotations

import contextlib
import ctypes
import re
from typing import Callable, Dict, Iterator, List, Optional

CARVEOUT_ATTRIBUTE = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT (cuda.h)
DEFAULT = -1  # CU_SHAREDMEM_CARVEOUT_DEFAULT: no preference
#: Our Gluon backward kernels: the one-pass / dK/dV kernel and stage 3c's dQ kernel (not the forward, not Triton's).
GLUON_BWD_KERNELS = r"^_attn_bwd_(sm90|dq_sm90)$"

SetAttribute = Callable[[int, int, int], int]  # cuFuncSetAttribute(CUfunction, attribute, value) -> CUresult


def check_percent(percent: int) -> int:
    if percent != DEFAULT and not 0 <= percent <= 100:
        raise ValueError(f"carve-out {percent}: a percent from 0 to 100, or {DEFAULT} (the driver's default)")
    return percent


def libcuda_set_attribute() -> SetAttribute:
    fn = ctypes.CDLL("libcuda.so.1").cuFuncSetAttribute
    fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_int, ctypes.c_int), ctypes.c_int
    return fn


class Loaded:
    """The CUfunctions Triton has loaded in this process, by kernel name."""

    def __init__(self, set_attribute: Optional[SetAttribute] = None):
        self.functions: Dict[str, List[int]] = {}
        self._set_attribute = set_attribute  # None: libcuda's, looked up at the first set

    def __call__(self, module, function, name, metadata_group, hash) -> None:  # the load hook's signature
        self.functions.setdefault(name, []).append(function)

    def install(self) -> Loaded:
        from triton import knobs

        knobs.runtime.kernel_load_end_hook.add(self)
        return self

    def set(self, pattern: str, percent: int) -> List[str]:
        """Sets the carve-out on every loaded kernel matching `pattern`; returns their names. A pattern that
        matches nothing loaded is an error: a carve-out row must not time the kernel unchanged."""
        check_percent(percent)
        names = sorted(n for n in self.functions if re.search(pattern, n))
        if not names:
            raise LookupError(f"no loaded kernel matches {pattern!r} (loaded: {sorted(self.functions)})")
        if self._set_attribute is None:
            self._set_attribute = libcuda_set_attribute()
        for name in names:
            for function in self.functions[name]:
                rc = self._set_attribute(function, CARVEOUT_ATTRIBUTE, percent)
                if rc != 0:
                    raise RuntimeError(f"cuFuncSetAttribute(PREFERRED_SHARED_MEMORY_CARVEOUT, {percent}) on {name}: "
                                       f"CUresult {rc}")
        return names

    @contextlib.contextmanager
    def carveout(self, pattern: str, percent: int) -> Iterator[List[str]]:
        names = self.set(pattern, percent)
        try:
            yield names
        finally:
            self.set(pattern, DEFAULT)
