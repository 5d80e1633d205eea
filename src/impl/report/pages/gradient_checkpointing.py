"""gradient_checkpointing (2026): (a) the nested strategy's peak, (b) the best single-level k (study
`single_level_2026`, xl (2026)); the older `policies` and `depth` studies (the 2025 table's xl) follow."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from impl.bench.row import Status
from impl.model.sizes import SizeRef
from impl.report import figures
from impl.report.pages import NOT_MEASURED, Context, Kind, Scored
from impl.report.rows import Bench, RowView, SizedView, group, stat_name
from impl.report.runs import RunsFacts, SourcedFromRuns, newest_date
from impl.workloads.problems import Problem as P

PROBLEMS = (P.GRADIENT_CHECKPOINTING,)
PROBLEM = P.GRADIENT_CHECKPOINTING
SLUG = "gradient_checkpointing"
STUDY_2026 = "single_level_2026"
WORDS = figures.words(SLUG)  # the words drawn into the depth figure
POLICY_ORDER = {"none": 0, "nested": 1, "every_k": 2}
ASKED = SizeRef("2026", "xl").label  # the size (b) asks about


@dataclass(frozen=True)
class PolicyRow(SizedView, RowView):
    """One row: its config, its measured peak and the predictions (the hook terms' and the fp32 closed form's)."""

    policy: str | None = None
    k: int | None = None  # None for none and nested
    layers: int | None = None  # the depth study's
    study: str | None = None
    num_layers: int | None = None
    width: str | None = None  # the depth study's: the size whose width it keeps
    dtype: str | None = None
    batch: int | None = None
    context: int | None = None

    name = property(lambda self: self.b.name)
    peak = property(lambda self: self.b.row.memory.peak_allocated)  # measured peak allocated
    mean_s = property(lambda self: self.b.stats and self.b.stats.mean)
    forwards = property(lambda self: self.details.get("measured_block_forwards"))  # counted by forward pre-hooks
    forwards_predicted = property(lambda self: self.details.get("predicted_block_forwards"))
    _hook = property(lambda self: (self.details.get("predicted") or {}).get("hook_terms") or {})
    _closed = property(lambda self: (self.details.get("predicted") or {}).get("closed_form_fp32") or {})
    predicted = property(lambda self: self._hook.get("peak"))
    activations = property(lambda self: self._hook.get("activations"))
    closed_form = property(lambda self: self._closed.get("peak"))
    closed_form_activations = property(lambda self: self._closed.get("activations"))

    model_layers = property(lambda self: self.size_ref.config.num_layers if self.size_ref else self.num_layers)
    measured = property(lambda self: self.status is Status.MEASURED and self.peak is not None)
    over_predicted = property(lambda self: self.peak / self.predicted if self.measured and self.predicted else None)


def policy_row(b: Bench) -> PolicyRow:
    c = PolicyRow.of(b)
    return replace(c, k=None if c.k is None or c.policy == "none" else int(c.k),
                   layers=None if c.layers is None else int(c.layers), study=c.study or b.details.get("study"))


@dataclass(frozen=True)
class Study:
    """The `policies` study (every policy per dtype, the best k reasoned) or the `depth` study (nested against
    none over the number of layers, drawn)."""

    first: PolicyRow  # its first row (size, batch, context, the best k reasoned)
    by_dtype: list[tuple[str, list[PolicyRow]]]  # depth: one dtype, by layers
    stat: str
    unit: str  # GiB; MiB where the largest prediction is under 1 GiB (a tiny model would print zeros)
    # B (a_block: one block's saved bytes), R (a_resid: one residual stream) and the loss head (a_outside), as the
    # rows stored them: the fp32 closed form's, and per dtype those measured by saved-tensor hooks
    closed_form: dict | None = None
    hooks: dict[str, dict] = field(default_factory=dict)
    figure: str | None = None


def _unit(rows: list[PolicyRow]) -> str:
    return "GiB" if max((r.predicted for r in rows if r.predicted is not None), default=0) >= 2**30 else "MiB"


def _policies(rows: list[PolicyRow]) -> Study | None:
    if not rows:
        return None
    by = group(rows, lambda r: r.dtype)

    def terms(rs):
        return next((r.details["terms"] for r in rs if "terms" in r.details), {})
    table = [(d, sorted(rs, key=lambda r: (POLICY_ORDER[r.policy], r.k or 0))) for d, rs in by.items()]
    return Study(rows[0], table, stat_name(rows), _unit(rows), terms(rows).get("closed_form_fp32"),
                 {d: h for d, rs in by.items() if (h := terms(rs).get("hook_terms"))})


def _depth(rows: list[PolicyRow], ctx: Context, device: str) -> Study | None:
    if not rows:
        return None
    table = sorted(rows, key=lambda r: (r.layers, r.policy))
    fig, ax, link = *figures.new(), None  # predicted (dashed) and measured peaks over layers
    for policy, style in (("none", "o"), ("nested", "s")):
        sel = [r for r in table if r.policy == policy]
        meas = [r for r in sel if r.measured]
        if sel:
            pred = [float("nan") if r.predicted is None else r.predicted / 2**30 for r in sel]
            ax.plot([r.layers for r in sel], pred, "--" + style, label=WORDS.label("predicted", policy=policy))
        if meas:
            ax.plot([r.layers for r in meas], [r.peak / 2**30 for r in meas], "-" + style,
                    label=WORDS.label("measured", policy=policy))
    if ax.lines:
        ax.set(xlabel=WORDS.x, ylabel=WORDS.y, title=WORDS.title)
        ax.legend(fontsize=8)
        link = ctx.figure(fig, f"{SLUG}-{device}-depth.png")
    return Study(rows[0], [(rows[0].dtype, table)], stat_name(rows), _unit(table), figure=link)


@dataclass(frozen=True)
class SingleLevel:
    """(b) of the 2026 edition: the k the fp32 closed form picks, and the measured peaks of it and of its
    neighbours (no checkpointing stands for the next smaller block count's limit: it keeps every block)."""

    first: PolicyRow  # size, batch, context
    layers: int
    best_k: int  # the closed form's argmin
    block_bytes: int  # B: one block's saved activations (fp32 closed form)
    resid_bytes: int  # R: one residual stream
    cases: list[PolicyRow]  # none first, then by k
    date: str

    best = property(lambda self: self.case(self.best_k))
    confirmed = property(lambda self: self.best is not None and self.measured_lowest is self.best)

    def case(self, k: int | None) -> PolicyRow | None:
        return next((c for c in self.cases if c.k == k), None)

    @property
    def measured_lowest(self) -> PolicyRow | None:
        return min((c for c in self.cases if c.measured), key=lambda c: c.peak, default=None)

    @property
    def neighbours(self) -> tuple[PolicyRow | None, PolicyRow | None]:
        """(the next smaller k measured, else no checkpointing; the next larger k measured)."""
        ks = sorted(c.k for c in self.cases if c.k is not None)
        smaller, larger = [k for k in ks if k < self.best_k], [k for k in ks if k > self.best_k]
        return self.case(smaller[-1] if smaller else None), self.case(larger[0]) if larger else None


def single_level(rows: list[PolicyRow]) -> SingleLevel | None:
    rows = [r for r in rows if r.study == STUDY_2026]
    if not rows:
        return None
    r0, terms = rows[0], (rows[0].details.get("terms") or {}).get("closed_form_fp32") or {}
    return SingleLevel(r0, int(r0.model_layers), int(r0.details["best_k"]), terms.get("a_block"), terms.get("a_resid"),
                       sorted(rows, key=lambda c: -1 if c.k is None else c.k), newest_date(rows))


@dataclass(frozen=True)
class BestK:
    """(b) from the `policies` study: the k reasoned and every k's measured peak."""

    best_k: int | None
    rule: str | None
    dtype: str
    peaks: list[tuple[int, int]]  # (k, measured peak)

    lowest = property(lambda self: min(self.peaks, key=lambda x: x[1])[0] if self.peaks else None)


@dataclass(frozen=True)
class CheckpointingPage(SourcedFromRuns):
    older_sizes: list[str]  # the older studies' measured sizes
    nested: PolicyRow | None  # (a) from the `policies` study (bf16 where measured)
    nested_none: PolicyRow | None  # no checkpointing at its dtype
    best_k: BestK | None
    single: SingleLevel | None  # the 2026 study where its k's row was measured (then it answers (b))
    study_2026: SingleLevel | None  # the 2026 study's table
    policies: Study | None
    depth: Study | None
    not_run: list[PolicyRow]
    runs: RunsFacts | None  # its device answers; None: no GPU rows
    asked: str = ASKED

    # the older rows answer without the 2026 study, and are not the question's size
    note = property(lambda self: self.single is None and ASKED not in self.older_sizes)

    @property
    def scores(self) -> dict[str, Scored]:
        if self.single or self.nested:
            return {PROBLEM: Scored(Kind.MEASURED, self.runs.device,
                                    self.single.date if self.single else self.runs.date)}
        return {PROBLEM: NOT_MEASURED}


def facts(ctx: Context) -> CheckpointingPage:
    if not (found := ctx.rows.first_gpu(PROBLEM)):
        return CheckpointingPage([], None, None, None, None, None, None, None, [], None)
    device, benches = found
    rows = [policy_row(b) for b in benches]
    pol, dep = [r for r in rows if r.study == "policies"], [r for r in rows if r.study == "depth"]
    ok = [r for r in pol if r.status is Status.MEASURED]
    bf = [r for r in ok if r.dtype == "bf16"] or ok
    nested = next((r for r in bf if r.policy == "nested"), None)
    best = BestK(ok[0].details.get("best_k"), ok[0].details.get("best_k_rule"), bf[0].dtype,
                 [(r.k, r.peak) for r in sorted((r for r in bf if r.policy == "every_k"), key=lambda r: r.k)]) \
        if ok and "best_k" in ok[0].details else None
    sl = single_level(rows)
    return CheckpointingPage(
        sorted({r.size_label for r in ok}), nested,
        nested and next((r for r in pol if r.policy == "none" and r.dtype == bf[0].dtype), None), best,
        sl if sl and sl.best and sl.best.measured else None, sl, _policies(pol), _depth(dep, ctx, device),
        [r for r in pol + dep if r.not_run], RunsFacts.of(device, benches))
