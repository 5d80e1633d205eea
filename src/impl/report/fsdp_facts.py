"""fsdp and fsdp_accounting as facts, per device: the predicted and measured saving at the peak (a),
whether each all-gather was ready before its layer needed it (b), and the headline pair by rule
(impl.report.fsdp.headline_pair); templates/fsdp.md.j2 holds the words."""
from __future__ import annotations

from dataclasses import dataclass

from impl import accounting as acc
from impl.report import fsdp as fr
from impl.report.ratio import Ratio, ratio, spread
from impl.report.rows import Bench, RunLabel, SizeRun, benches, size_label


def _peak(b: Bench) -> float | None:
    return b.figure("peak_bytes")


@dataclass(frozen=True)
class Saving:
    """fsdp_accounting (a): DDP's and our fp32 FSDP's measured peaks against the closed form."""

    size: str  # label
    predicted: acc.FSDPPeakSaving
    ddp_peak: float
    fsdp_peak: float

    @property
    def measured(self) -> float:
        return self.ddp_peak - self.fsdp_peak

    @property
    def of_predicted(self) -> float:
        return self.measured / self.predicted.saving

    @property
    def above_prediction(self) -> float:
        return self.fsdp_peak - self.predicted.fsdp_peak


def saving(rows: list[Bench]) -> Saving | None:
    by = {b.cfg.variant: b for b in rows if b.measured}
    ddp, fsdp = by.get("ddp"), by.get("fsdp")
    if ddp is None or fsdp is None or fsdp.cfg.size_ref is None or _peak(ddp) is None or _peak(fsdp) is None:
        return None
    shape = fsdp.cfg.size_ref.config  # by edition: the 2026 xl is the 2025 2.7B
    pred = acc.fsdp_peak_saving(int(fsdp.details["n_params"]), int(fsdp.cfg.world_size),
                                acc.largest_sharded_layer_numel(shape.d_model, shape.d_ff),
                                activations=fsdp.details.get("predicted_activations_bytes") or 0.0)
    return Saving(size_label(fsdp.cfg.size_ref), pred, _peak(ddp), _peak(fsdp))


@dataclass(frozen=True)
class Gathers:
    """fsdp_accounting (b) for one of our configurations: all-gathers ready before their layer needed them."""

    label: str
    forward: tuple[int, int]  # (in time, waited on)
    backward: tuple[int, int]
    stall_ms: float
    span_ms: float

    @property
    def all_in_time(self) -> bool:
        return self.forward[0] == self.forward[1] and self.backward[0] == self.backward[1]


def gathers(rows: list[Bench]) -> list[Gathers]:
    out = []
    for b in rows:
        tl = b.details.get("timeline") if b.measured else None
        if tl:
            s = tl["summary"]
            out.append(Gathers(fr.LABEL.get(b.cfg.variant, b.cfg.variant), fr.phase_counts(tl, "forward"),
                               fr.phase_counts(tl, "backward"), s["gather_stall_ms"], s["span_ms"]))
    return out


@dataclass(frozen=True)
class Headline:
    ours: str  # labels
    anchor: str
    ours_s: float
    ours_std: float | None
    vs_anchor: Ratio
    vs_ddp: Ratio | None


def headline(rows: list[Bench]) -> Headline | None:
    by = {b.cfg.variant: b for b in rows if b.measured}
    pair = fr.headline_pair(by)
    if pair is None:
        return None
    o, a, ddp = by[pair[0]], by[pair[1]], by.get("ddp")

    def vs(x: Bench, name: str) -> Ratio:
        return ratio(o.stats.median, x.stats.median, name, spread(o.stats.stddev, o.stats.iqr),
                     spread(x.stats.stddev, x.stats.iqr))
    return Headline(fr.LABEL[pair[0]], fr.LABEL[pair[1]], o.stats.median, o.stats.stddev, vs(a, fr.LABEL[pair[1]]),
                    vs(ddp, "our DDP") if ddp is not None else None)


@dataclass(frozen=True)
class FsdpFacts:
    device: str
    label: str  # the device, named as section headings name it
    date: str
    saving: Saving | None
    gathers: list[Gathers]
    headline: Headline | None
    run: RunLabel | None = None  # the [edition, size] run the facts come from


def fsdp_facts(device: str, label: str, run: SizeRun) -> FsdpFacts:
    """The facts of one [edition, size] run of the fsdp section (its TP rows aside: impl.report.tp_facts)."""
    rows = [b for b in benches(run.rows) if b.cfg.variant != "tp"]
    return FsdpFacts(device, label, run.date, saving(rows), gathers(rows), headline(rows), run.label(label))
