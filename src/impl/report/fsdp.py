"""Report section: fsdp (our FSDP in fp32 and with bf16 compute, DDP and torch's fully_shard)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from impl.report.markdown import gib, missing, ms, num, table

LABEL = dict(fsdp="FSDP (ours), fp32", fsdp_bf16="FSDP (ours), bf16 compute", ddp="DDPBucketed 100 MB (ours)",
             torch_fsdp="torch fully_shard, fp32", torch_fsdp_bf16="torch fully_shard, bf16")


def _m(r, key):
    return (r["info"].get("metrics") or {}).get(key)


def render(df: pd.DataFrame, device: str, fig_dir: Path, fig_rel: str) -> str | None:
    d = df[df.problem == "fsdp"]
    if d.empty:
        return None
    first = d.iloc[0]
    rows = []
    for _, r in d.iterrows():
        label = LABEL.get(r["cfg.variant"], r["cfg.variant"])
        if r.oom or _m(r, "worker_step_s") is None:
            reason = r["info"].get("reason") or ("OOM" if r.oom else "not run")
            rows.append([label, reason, "", "", "", "", ""])
            continue
        peak = _m(r, "peak_bytes")
        rows.append([label, ms(r["mean"], r["stddev"]), ms(_m(r, "comm_s")),
                     "–" if missing(_m(r, "bytes_per_step")) else num(_m(r, "bytes_per_step") / 1e6, 1),
                     "–" if missing(peak) else gib(peak), gib(_m(r, "predicted_total_bytes")),
                     num(_m(r, "tokens_per_s"), 0)])
    head = (f"## fsdp\n\n{first['cfg.size']}, context {int(first['cfg.context'])}, per-rank batch "
            f"{int(first['cfg.batch_per_rank'])}, {int(first['cfg.world_size'])} ranks over {first['cfg.backend']}; "
            "step = pytest-benchmark mean ± std of one training step on every rank (slowest rank + IPC). "
            "Communication = time finish_gradient_synchronization waited; bytes = payload handed to collectives "
            "per step (counted; not counted for torch's fully_shard). Predicted = impl.accounting.memory_breakdown "
            "(ZeRO-3 for FSDP, stage 0 for DDP) plus the activation estimate.")
    return head + "\n\n" + table(["configuration", "step (ms)", "communication (ms)", "payload per step (MB)",
                                  "peak (GiB)", "predicted (GiB)", "tokens/s"], rows)
