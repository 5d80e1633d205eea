"""communication_accounting: impl.accounting's closed forms (the XXL model's memory and sharding, the bucket
overhead model, the per-rank communication volumes), read from the rows of perf/test_communication_accounting.py,
which carry each case's tables in details["results"]."""
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
    """Each case's stored results; None where the case has no row (without xxl the page says it is not computed)."""

    xxl: Mapping[str, Any] | None
    bucket_model: Mapping[str, Any] | None
    comm_volumes: Mapping[str, Any] | None
    sources: list[str]  # the run files read

    @property
    def no_activations(self) -> Mapping[str, Any]:  # the FSDP row of weights and state alone (T = 0 tokens)
        return next((x for x in self.xxl["fsdp"] if x["tokens"] == 0), self.xxl["fsdp"][0])

    scores = property(lambda self: {PROBLEM: Scored(Kind.CLOSED_FORM, "closed form") if self.xxl else NOT_MEASURED})


def facts(ctx: Context) -> AccountingPage:
    rows = ctx.rows.of(PROBLEM)
    rows = [b for b in rows if b.run.device == rows[0].run.device]  # the same closed forms wherever they ran
    by = {CaseConfig.of(b).case: b.details["results"] for b in rows}
    return AccountingPage(by.get("xxl"), by.get("bucket_model"), by.get("comm_volumes"), list(files_of(rows)))
