"""One test at a time on most of the GPUs' memory, across pytest-xdist workers.

`make test` runs the suite on 12 workers at once; a test whose ranks fill most of each GPU (the reduced
8B step: 55-75 GB a rank on an H200) runs out of memory when a second such test lands on the same GPUs
at the same time (record 20261126T..._2a57c6a: both grad_sync cases of the two-rank 8B check, one OOM
each). An exclusive lock on a file every worker sees makes such tests take turns; the light tests go on
beside them."""
from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = Path(tempfile.gettempdir()) / f"impl-correctness-whole-gpus-{os.getuid()}.lock"


@contextmanager
def whole_gpus(lock: Path = LOCK) -> Iterator[None]:
    """Hold the lock for the block: any other worker's `whole_gpus` waits until it ends."""
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
