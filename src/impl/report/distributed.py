"""Report section: optimizer_state_sharding_accounting (memory breakdown with the closed-form
prediction, ZeRO-1 vs the simple sharded optimizer), and the distributed rows' figure lookup the fsdp
section shares. Every number is read from the rows of perf/test_optimizer_sharding.py."""
from __future__ import annotations

import pandas as pd

from impl.bench.row import Metric, Status
from impl.workloads.variants import ShardVariant
from impl.report.templating import macros
from impl.workloads.problems import Problem as P
from impl.report.markdown import missing, ms, table
from impl.report.rows import size_label  # (also registers the typed .cfg accessors of rows and frames)

SHARD = P.OPTIMIZER_STATE_SHARDING_ACCOUNTING
SHARDING = macros("optimizer_sharding.md.j2")
SHARD_LABEL = {v.value: v.label for v in ShardVariant}
# comm_volume_per_rank keys for each sharding variant's schedule
SHARD_VOLUME = dict(none="ddp", sharded="sharded_simple", zero1="zero1", torch_zero="sharded_simple")


def _info(r, key, default=None):
    return r["details"].get(key, default)


def _not_run(r) -> str | None:
    return None if r["status"] == Status.MEASURED.value else f"not run ({r['status']}: {r['reason']})"


def figure(r, key, metric: Metric | None = None):
    """A figure of a distributed row: its Metric column, the mean of its timed steps
    (details["steps"], impl.workloads.dist_steps.StepSummary), a details key, or where the older
    format kept it (its free-form metrics, impl.report.legacy)."""
    if metric is not None and not missing(r.get(f"m.{metric.value}")):
        return r[f"m.{metric.value}"]
    d = r["details"]
    for source in (d.get("steps") or {}, d, d.get("legacy_metrics") or {}):
        if source.get(key) is not None:
            return source[key]
    return None


def _gb(nbytes, digits=2) -> str:
    return "–" if missing(nbytes) else f"{nbytes / 1e9:,.{digits}f}"


class _Unit:
    """GiB / GB for the real model sizes, MiB / MB for the smoke model (else every cell reads 0.01)."""

    def __init__(self, typical_bytes):
        big = not missing(typical_bytes) and typical_bytes >= 2**30
        self.bin, self.bin_name = (2**30, "GiB") if big else (2**20, "MiB")
        self.dec, self.dec_name = (1e9, "GB") if big else (1e6, "MB")

    def b(self, nbytes) -> str:
        return "–" if missing(nbytes) else f"{nbytes / self.bin:,.2f}"

    def d(self, nbytes) -> str:
        return "–" if missing(nbytes) else f"{nbytes / self.dec:,.2f}"


# ---------------------------------------------------------------------------------------------
# optimizer state sharding


def sharding_section(d: pd.DataFrame) -> str | None:
    if d.empty:
        return None
    first = d.iloc[0]
    u = _Unit(_info(first, "n_params", 0) * 4)
    gib, _gb = u.b, u.d  # noqa: N806 - the unit follows the model size
    mem_rows, cmp_rows = [], []
    for _, r in d.iterrows():
        v = r.cfg.variant
        label = SHARD_LABEL.get(v, v)
        nr = _not_run(r)
        if nr:
            mem_rows.append([label, "", nr] + [""] * 10)
            continue
        pred = _info(r, "predicted")
        for k, m in enumerate(_info(r, "ranks")):
            nb = m["named_before"]
            mem_rows.append([label if k == 0 else "", k, gib(m["init_peak"]), gib(m["before_peak"]),
                             gib(m["after_peak"]), gib(nb["parameters"]), gib(nb["gradients"]),
                             gib(m["named_after"]["optimizer_state"]), gib(nb["buffers"]), gib(m.get("activations")),
                             gib(m.get("other_before")),
                             f"{gib(pred['parameters'])} / {gib(pred['gradients'])} / {gib(pred['optimizer_state'])}",
                             gib(pred["activations"])])
        states = [m["named_after"]["optimizer_state"] for m in _info(r, "ranks")]
        vol = _info(r, "predicted_ring_bytes_per_rank")[SHARD_VOLUME.get(v, "ddp")]
        opt_s = figure(r, "opt_s") or figure(r, "opt_step_s")  # older files: opt_step_s
        cmp_rows.append([label, ms(r["median"], r["stddev"]), ms(opt_s), gib(max(states)),
                         gib(max(m["after_peak"] for m in _info(r, "ranks")) if _info(r, "ranks")[0]["after_peak"] is not None else None),
                         _gb(_info(r, "comm_bytes_per_step")), _info(r, "comm_bytes_source"), _gb(vol)])
    psi = _info(first, "n_params", 0) * 4
    return "\n\n".join([
        SHARDING.method(size_label(first.cfg.size_ref, first.cfg.size), int(first.cfg.batch_per_rank), int(first.cfg.context),
                        int(first.cfg.world_size), first.cfg.backend),
        table(SHARDING.memory_header(u.bin_name).split("|"), mem_rows),
        SHARDING.zero1_intro(_gb(psi), u.dec_name),
        table(SHARDING.compare_header(u.bin_name, u.dec_name).split("|"), cmp_rows)])
