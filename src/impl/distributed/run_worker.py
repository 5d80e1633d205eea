"""Run a ``fn(rank, world_size, *args)`` worker under torchrun::

    torchrun --nproc-per-node 2 -m impl.distributed.run_worker pkg.module:fn [args...]

Extra command-line arguments reach the worker as strings; rank 0 prints the
return value. A separate module (not launcher.py) so ``-m`` does not re-run a
module the package ``__init__`` already imported.
"""

import importlib
import sys

import torch.distributed as dist

from impl.distributed.launcher import init_from_env


def main(argv: list[str]) -> None:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return
    if not argv or ":" not in argv[0]:
        raise SystemExit("usage: -m impl.distributed.run_worker module:function [args...]")
    mod_name, fn_name = argv[0].split(":", 1)
    fn = getattr(importlib.import_module(mod_name), fn_name)
    rank, world_size, _ = init_from_env()
    try:
        out = fn(rank, world_size, *argv[1:])
        if rank == 0 and out is not None:
            print(out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
