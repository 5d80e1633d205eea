"""communication_accounting: the XXL model's memory, its FSDP sharding, the TPU v5p compute-bound batch,
the bucket overhead model and the per-rank communication volumes. Closed forms (impl.accounting, the
same on every device), read from the rows of perf/test_communication_accounting.py, which carry each
case's computed tables in details["results"] as stored. templates/communication_accounting.md.j2
holds every word."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from impl.report.pages import NOT_MEASURED, Context, Kind, Scored
from impl.report.rows import View
from impl.report.runs import files_of
from impl.workloads.problems import Problem as P

PROBLEMS = (P.COMMUNICATION_ACCOUNTING,)
PROBLEM = P.COMMUNICATION_ACCOUNTING


@dataclass(frozen=True)
class CaseConfig(View):
    case: str = ""  # "xxl", "bucket_model" or "comm_volumes"


@dataclass(frozen=True)
class AccountingPage:
    """Each case's stored results (impl.accounting's closed forms, as the perf rows carry them); None
    where the case has no row. Without the xxl case the page says it is not computed."""

    xxl: Mapping[str, Any] | None
    bucket_model: Mapping[str, Any] | None
    comm_volumes: Mapping[str, Any] | None
    sources: list[str]  # the run files read

    @property
    def no_activations(self) -> Mapping[str, Any]:
        """The FSDP row of weights and state alone (T = 0 tokens)."""
        fsdp = self.xxl["fsdp"]
        return next((x for x in fsdp if x["tokens"] == 0), fsdp[0])

    @property
    def scores(self) -> dict[str, Scored]:
        return {PROBLEM: Scored(Kind.CLOSED_FORM, "closed form") if self.xxl else NOT_MEASURED}


def facts(ctx: Context) -> AccountingPage:
    rows = ctx.rows.of(PROBLEM)
    rows = [b for b in rows if b.run.device == rows[0].run.device]  # the same closed forms wherever they ran
    by = {CaseConfig.of(b).case: b.details["results"] for b in rows}
    return AccountingPage(by.get("xxl"), by.get("bucket_model"), by.get("comm_volumes"), list(files_of(rows)))
