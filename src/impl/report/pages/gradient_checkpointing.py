"""gradient_checkpointing (2026): (a) the nested strategy's measured peak, (b) the best single-level k, from
perf/test_gradient_checkpointing.py's rows of the first GPU device. The 2026 study `single_level_2026` (xl
(2026) at batch 4 × 2048) answers (b); the older `policies` and `depth` studies (the 2025 table's xl) follow,
labelled as another model. Measured peaks are the rows' peak allocated; predictions and terms their details.
templates/gradient_checkpointing.md.j2 holds every word."""
from __future__ import annotations

from dataclasses import dataclass

from impl.bench.row import Metric, Status
from impl.model.sizes import SizeRef
from impl.report import figures
from impl.report.output import figure_path
from impl.report.pages import Context, Kind, Scored
from impl.report.rows import Bench, size_label, stat_name
from impl.report.runs import RunsFacts
from impl.workloads.problems import Problem as P

PROBLEMS = (P.GRADIENT_CHECKPOINTING,)
PROBLEM = P.GRADIENT_CHECKPOINTING
SLUG = "gradient_checkpointing"
STUDY_2026 = "single_level_2026"
POLICY_ORDER = {"none": 0, "nested": 1, "every_k": 2}
ASKED = size_label(SizeRef("2026", "xl"))  # the size (b) asks about


def _study(b: Bench) -> str | None:
    return b.cfg.study or b.details.get("study")  # the older format kept it in details


def _label(b: Bench) -> str:
    return size_label(b.cfg.size_ref, b.cfg.size)


@dataclass(frozen=True)
class PolicyRow:
    """One row of a study: its measured peak, the predictions (the hook terms' and the fp32 closed
    form's, each a step peak and the block stack's activations) and its step."""

    policy: str
    k: int | None  # None for none and nested
    layers: int | None
    status: Status
    peak: int | None  # measured peak allocated
    predicted: int | None
    activations: int | None
    closed_form: int | None
    closed_form_activations: int | None
    step_s: float | None
    std_s: float | None
    mean_s: float | None
    tokens_per_s: float | None
    forwards: float | None  # block forwards per step, counted by forward pre-hooks
    forwards_predicted: int | None

    @property
    def label(self) -> str:
        return self.policy + ("" if self.k is None else f" k={self.k}")

    @property
    def not_run(self) -> bool:
        return self.status not in (Status.MEASURED, Status.OOM)

    @property
    def measured(self) -> bool:
        return self.status is Status.MEASURED and self.peak is not None

    @property
    def over_predicted(self) -> float | None:
        return self.peak / self.predicted if self.measured and self.predicted else None


def policy_row(b: Bench) -> PolicyRow:
    pred, d, st = b.details.get("predicted") or {}, b.details, b.stats
    hook, cf = pred.get("hook_terms") or {}, pred.get("closed_form_fp32") or {}
    return PolicyRow(b.cfg.policy, None if b.cfg.k is None or b.cfg.policy == "none" else int(b.cfg.k),
                     None if b.cfg.layers is None else int(b.cfg.layers), b.status, b.row.memory.peak_allocated,
                     hook.get("peak"), hook.get("activations"), cf.get("peak"), cf.get("activations"), b.step_s,
                     st and st.stddev, st and st.mean, b.metric(Metric.TOKENS_PER_S), d.get("measured_block_forwards"),
                     d.get("predicted_block_forwards"))


@dataclass(frozen=True)
class Unit:
    """GiB on a GPU; MiB where the largest prediction is under 1 GiB (a tiny model would print zeros)."""

    name: str
    bytes: int

    @classmethod
    def of(cls, rows: list[PolicyRow]) -> Unit:
        peaks = [r.predicted for r in rows if r.predicted is not None]
        return cls("GiB", 2**30) if peaks and max(peaks) >= 2**30 else cls("MiB", 2**20)


@dataclass(frozen=True)
class Terms:
    """B (one block's saved bytes), R (one residual stream) and the loss head, of one dtype."""

    dtype: str
    block: float
    resid: float
    head: float | None = None


@dataclass(frozen=True)
class Study:
    """The `policies` study (xl (2025), every policy per dtype, the best k reasoned) or the `depth` study
    (nested against none over the number of layers, drawn)."""

    b0: Bench  # its first row (size, batch, context, details)
    by_dtype: list[tuple[str, list[PolicyRow]]]  # depth: one dtype, by layers
    stat: str
    unit: Unit
    closed_form: Terms | None = None
    hooks: tuple[Terms, ...] = ()
    figure: str | None = None


def _policies(rows: list[Bench]) -> Study | None:
    if not rows:
        return None
    by: dict[str, list[Bench]] = {}
    for b in rows:
        by.setdefault(b.cfg.dtype, []).append(b)
    hooks = [Terms(d, h["a_block"], h["a_resid"], h["a_outside"]) for d, bs in by.items()
             for h in [next((b.details["terms"]["hook_terms"] for b in bs if "terms" in b.details), None)] if h]
    cf = next((b.details["terms"].get("closed_form_fp32") for b in rows if "terms" in b.details), None)
    key = lambda b: POLICY_ORDER[b.cfg.policy] * 10_000 + (b.cfg.k or 0)  # noqa: E731
    table = [(d, [policy_row(b) for b in sorted(bs, key=key)]) for d, bs in by.items()]
    return Study(rows[0], table, stat_name(rows), Unit.of([r for _, rs in table for r in rs]),
                 Terms("fp32", cf["a_block"], cf["a_resid"]) if cf else None, tuple(hooks))


def _depth(rows: list[Bench], ctx: Context, device: str) -> Study | None:
    if not rows:
        return None
    table = [policy_row(b) for b in sorted(rows, key=lambda b: (b.cfg.layers, b.cfg.policy))]
    fig, ax = figures.new()  # predicted (dashed) and measured peaks over layers
    drawn = False
    for policy, style in (("none", "o"), ("nested", "s")):
        sel = sorted((r for r in table if r.policy == policy), key=lambda r: r.layers)
        if sel:
            ax.plot([r.layers for r in sel], [float("nan") if r.predicted is None else r.predicted / 2**30
                                              for r in sel], "--" + style, label=f"{policy} predicted")
            meas = [r for r in sel if r.measured]
            if meas:
                ax.plot([r.layers for r in meas], [r.peak / 2**30 for r in meas], "-" + style,
                        label=f"{policy} measured")
            drawn = True
    link = None
    if drawn:
        ax.set(xlabel="layers", ylabel="peak GiB (forward+backward step)",
               title="gradient_checkpointing: nested vs none over depth")
        ax.legend(fontsize=8)
        path, link = figure_path(ctx.fig_dir, ctx.fig_rel, SLUG, f"{device}-depth")
        figures.save(fig, path)
    return Study(rows[0], [(rows[0].cfg.dtype, table)], stat_name(rows), Unit.of(table), figure=link)


@dataclass(frozen=True)
class SingleLevel:
    """(b) of the 2026 edition: the k the fp32 closed form picks, and the measured peaks of it and of its
    neighbours (no checkpointing stands for the next smaller block count's limit: it keeps every block)."""

    size: str
    batch: int
    context: int
    layers: int
    best_k: int  # the closed form's argmin
    rule: str
    block_bytes: int  # B: one block's saved activations (fp32 closed form)
    resid_bytes: int  # R: one residual stream
    cases: list[PolicyRow]  # none first, then by k
    date: str

    def case(self, k: int | None) -> PolicyRow | None:
        return next((c for c in self.cases if c.k == k), None)

    @property
    def best(self) -> PolicyRow | None:
        return self.case(self.best_k)

    @property
    def measured_lowest(self) -> PolicyRow | None:
        return min((c for c in self.cases if c.measured), key=lambda c: c.peak, default=None)

    @property
    def confirmed(self) -> bool:
        return self.best is not None and self.measured_lowest is self.best

    @property
    def neighbours(self) -> tuple[PolicyRow | None, PolicyRow | None]:
        """(the next smaller k measured, else no checkpointing; the next larger k measured)."""
        ks = sorted(c.k for c in self.cases if c.k is not None)
        smaller, larger = [k for k in ks if k < self.best_k], [k for k in ks if k > self.best_k]
        return self.case(smaller[-1] if smaller else None), self.case(larger[0]) if larger else None


def single_level(rows: list[Bench]) -> SingleLevel | None:
    rows = [b for b in rows if b.cfg.study == STUDY_2026]
    if not rows:
        return None
    b0, ref = rows[0], rows[0].cfg.size_ref
    terms = (b0.details.get("terms") or {}).get("closed_form_fp32") or {}
    return SingleLevel(_label(b0), int(b0.cfg.batch), int(b0.cfg.context),
                       ref.config.num_layers if ref else int(b0.cfg.num_layers), int(b0.details["best_k"]),
                       b0.details.get("best_k_rule", ""), terms.get("a_block"), terms.get("a_resid"),
                       sorted(map(policy_row, rows), key=lambda c: -1 if c.k is None else c.k),
                       max(str(b.run.datetime) for b in rows)[:10])


@dataclass(frozen=True)
class Nested:
    """(a) from the `policies` study: nested checkpointing's row, and no checkpointing's at its dtype."""

    row: PolicyRow
    none: PolicyRow | None
    dtype: str
    size: str
    context: int
    layers: int | str


@dataclass(frozen=True)
class BestK:
    """(b) from the `policies` study: the k reasoned and every k's measured peak."""

    best_k: int | None
    rule: str | None
    dtype: str
    peaks: list[tuple[int, int]]  # (k, measured peak)

    @property
    def lowest(self) -> int | None:
        return min(self.peaks, key=lambda x: x[1])[0] if self.peaks else None


@dataclass(frozen=True)
class Section:
    device: str
    single: SingleLevel | None
    policies: Study | None
    depth: Study | None
    not_run: list[Bench]
    runs: RunsFacts


@dataclass(frozen=True)
class CheckpointingPage:
    device: str | None  # None: no GPU rows
    older_sizes: list[str]  # the older studies' measured sizes
    nested: Nested | None
    best_k: BestK | None
    single: SingleLevel | None  # the 2026 study, where its k's row was measured (then it answers (b))
    section: Section | None
    date: str = "–"  # the device's newest run
    asked: str = ASKED
    index_figures: tuple = ()

    @property
    def note(self) -> bool:
        """The older rows answer without the 2026 study, and are not the question's size."""
        return self.single is None and ASKED not in self.older_sizes

    @property
    def scores(self) -> dict[str, Scored]:
        if self.single or self.nested:
            return {PROBLEM: Scored(Kind.MEASURED, self.device, self.single.date if self.single else self.date)}
        return {PROBLEM: Scored(Kind.NOT_MEASURED)}

    @property
    def sources(self) -> list[str]:
        return self.section.runs.files if self.section else []


def facts(ctx: Context) -> CheckpointingPage:
    found = ctx.rows.per_gpu(PROBLEM)
    if not found:
        return CheckpointingPage(None, [], None, None, None, None)
    device, rows = found[0]  # the first (one-GPU) device answers
    pol = [b for b in rows if _study(b) == "policies"]
    dep = [b for b in rows if _study(b) == "depth"]
    ok = [b for b in pol if b.status is Status.MEASURED]
    bf = [b for b in ok if b.cfg.dtype == "bf16"] or ok
    nested, best = next((b for b in bf if b.cfg.policy == "nested"), None), None
    if nested:
        none = next((b for b in pol if b.cfg.policy == "none" and b.cfg.dtype == bf[0].cfg.dtype), None)
        ref = nested.cfg.size_ref
        nested = Nested(policy_row(nested), none and policy_row(none), nested.cfg.dtype, _label(nested),
                        int(nested.cfg.context), ref.config.num_layers if ref else "–")
    if ok and "best_k" in ok[0].details:
        ks = sorted((b for b in bf if b.cfg.policy == "every_k"), key=lambda b: b.cfg.k)
        best = BestK(ok[0].details.get("best_k"), ok[0].details.get("best_k_rule"), bf[0].cfg.dtype,
                     [(int(b.cfg.k), b.row.memory.peak_allocated) for b in ks])
    sl = single_level(rows)
    section = Section(device, sl, _policies(pol), _depth(dep, ctx, device),
                      [b for b in pol + dep if b.status not in (Status.MEASURED, Status.OOM)], RunsFacts.of(device, rows))
    return CheckpointingPage(device, sorted({_label(b) for b in ok}), nested, best,
                             sl if sl and sl.best and sl.best.measured else None, section,
                             max(str(b.run.datetime) for b in rows)[:10])
