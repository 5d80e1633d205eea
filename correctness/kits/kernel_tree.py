"""A checkout's kernel files and kernel table in a temporary folder, for the tests of the kernels'
digest (impl.bench.kernel_digest) and of the records judged by it."""
from pathlib import Path

from impl.attention.kernel_table import KernelChoice, KernelTable, Measured, dumps
from impl.bench.kernel_digest import KERNEL_TABLE


def choice(d: int = 64, num_warps: int = 4, probes: int = 1, min_seq: int = 0, losses: int = 0) -> KernelChoice:
    """A forward entry of the table: `probes` measurements of the one config (num_warps), holding from min_seq,
    with `losses` measured losses at 512 (min_seq must then be above 512)."""
    measured = tuple(Measured(f"reports/data/h100-80gb-x1/probes/p{i}.json", "NVIDIA H100", (1, 8, 4096, d), 1.0, 2.0,
                              1e-3) for i in range(probes))
    lost = tuple(Measured(f"reports/data/h100-80gb-x1/probes/s{i}.json", "NVIDIA H100", (4, 32, 512, d), 2.0, 1.0,
                          1e-3) for i in range(losses))
    return KernelChoice("fwd", "sm_90", d, True, "bfloat16", "gluon_ws", (("num_warps", num_warps),), measured,
                        min_seq, lost)


def tree(root: Path, *choices: KernelChoice, kernel: str = "x = 1\n") -> Path:
    """A checkout with one kernel file, adamw_master.py and (given choices) a kernel table."""
    (root / "src/impl/attention").mkdir(parents=True, exist_ok=True)
    (root / "src/impl/model").mkdir(parents=True, exist_ok=True)
    (root / "src/impl/attention/k.py").write_text(kernel)
    (root / "src/impl/model/adamw_master.py").write_text("y = 2\n")
    if choices:
        (root / KERNEL_TABLE).write_text(dumps(KernelTable(choices, "rule")))
    return root
