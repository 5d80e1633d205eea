"""Tensor parallelism beside DDP and FSDP, as facts (the fsdp page's TP section; templates/fsdp.md.j2
holds the words). A TP row (perf/test_fsdp.py, config variant "tp") trains the whole global batch on
every rank; beside it stand the rows of the same model and global batch that shard the batch: the
fsdp section's (our FSDP, fully_shard, DDPBucketed), and while that section has no DDP row of the
size, the ddp section's. A ratio is taken only between rows of one run; the page says which runs
hold which rows.

Each TP row carries what tp_calcs predicts for it from the run's own measured matmul rate C and
all-reduce bus bandwidth W (details["tp_predicted"]) and the all-reduce traffic it counted
(details["tp_traffic"]); the closed form of that traffic is impl.parallelism_calcs'
tp_step_allreduce_payload.
"""
from __future__ import annotations

from dataclasses import dataclass

from impl import parallelism_calcs as pc
from impl.bench.row import Metric
from impl.report.ratio import Ratio, ratio, spread
from impl.report.rows import Bench, RunLabel, SizeRun, benches, size_runs
from impl.report.runs import device_short

TP = "tp"
BYTES_PER_VALUE = {"fp32": 4, "bf16": 2, "fp16": 2}


def global_batch(b: Bench) -> int:
    """Sequences per step over all ranks: a TP row's ranks all take the whole batch, the others a share."""
    per_rank = int(b.cfg.batch_per_rank)
    return per_rank if b.cfg.variant == TP else per_rank * int(b.cfg.world_size)


@dataclass(frozen=True)
class Shape:
    """What makes two rows the same workload: the model size (edition, name), context and global batch."""

    size: object  # SizeRef
    context: int
    batch: int

    @classmethod
    def of(cls, b: Bench) -> Shape:
        return cls(b.cfg.size_ref, int(b.cfg.context), global_batch(b))


class _Timed:
    """What TP's rows and the rows beside them read alike off their bench row."""

    bench: Bench

    @property
    def world(self) -> int:
        return int(self.bench.cfg.world_size)

    @property
    def step_s(self) -> float:
        return self.bench.stats.median

    @property
    def spread(self) -> float | None:
        return spread(self.bench.stats.stddev, self.bench.stats.iqr)

    @property
    def peak(self) -> float | None:
        return self.bench.row.memory.peak_allocated or self.bench.figure("peak_bytes")

    @property
    def tokens_per_s(self) -> float | None:
        return self.bench.metric(Metric.TOKENS_PER_S)


@dataclass(frozen=True)
class TpRow(_Timed):
    """One TP row: measured, counted, closed form and predicted."""

    bench: Bench
    run: RunLabel
    where: str  # "2×H200 (h200-141gb-x2)"

    @property
    def measured(self) -> bool:
        return self.bench.measured

    @property
    def tokens(self) -> int:
        return global_batch(self.bench) * int(self.bench.cfg.context)

    @property
    def counted(self) -> dict:
        """{"calls", "payload_bytes"} the ranks counted (the same on every rank)."""
        return self.bench.details.get("tp_traffic") or {}

    @property
    def bytes_per_value(self) -> int:
        """p of the closed form: the activations' bytes per value in the row's dtype."""
        return BYTES_PER_VALUE[str(self.bench.cfg.dtype)]

    @property
    def closed_form_bytes(self) -> float:
        shape = self.bench.cfg.size_ref.config
        return pc.tp_step_allreduce_payload(self.tokens, shape.d_model, shape.num_layers, self.bytes_per_value)

    @property
    def closed_form_calls(self) -> int:
        return 4 * self.bench.cfg.size_ref.config.num_layers

    @property
    def ring_bytes_per_rank(self) -> float:
        return pc.ring_all_reduce_bytes(self.counted.get("payload_bytes", self.closed_form_bytes), self.world)

    @property
    def predicted(self) -> dict:
        """tp_calcs' terms from the run's own C and W (details["tp_predicted"])."""
        return self.bench.details.get("tp_predicted") or {}

    @property
    def measured_over_predicted(self) -> float | None:
        pred = self.predicted.get("step_s")
        return self.step_s / pred if pred else None

    @property
    def steps(self) -> dict:
        """The timed steps' mean split (forward + backward, optimizer step), seconds."""
        return self.bench.details.get("steps") or {}


@dataclass(frozen=True)
class Beside(_Timed):
    """A row of the same model and global batch that shards the batch (DDP, FSDP), and TP's ratio
    against it where the two come from one run."""

    label: str
    bench: Bench
    run: RunLabel
    where: str
    section: str  # the section it was read from ("fsdp", "ddp")
    vs_tp: Ratio | None  # the same-run TP row (the same rank count) ÷ this row


@dataclass(frozen=True)
class TpFacts:
    size: str  # described: "xl (2026): d_model 2560, 32 layers, 3.4B params"
    context: int
    batch: int  # global sequences per step
    rows: list[TpRow]  # measured TP rows, fewest ranks first
    not_run: list[TpRow]  # TP rows of a rank count no device measured
    beside: list[Beside]

    @property
    def has_fsdp(self) -> bool:
        """An FSDP row (ours or fully_shard) of this model and batch stands beside TP."""
        return any(b.section == "fsdp" and b.bench.cfg.variant != "ddp" for b in self.beside)

    @property
    def shared_runs(self) -> bool:
        """Some TP row and some row beside it come from one run (so a ratio exists)."""
        return any(b.vs_tp is not None for b in self.beside)

    @property
    def tp_files(self) -> list[str]:
        return sorted({f for r in self.rows for f in r.run.files})

    @property
    def beside_files(self) -> list[str]:
        return sorted({f for b in self.beside for f in b.run.files})


def _where(device: str) -> str:
    return f"{device_short(device)} ({device})"


def _newest_of_shape(frames: list[tuple[str, object]], shape: Shape, keep) -> list[tuple[str, SizeRun, Bench]]:
    """(device, its newest run of `shape`'s size, each measured row of that run with `shape` that `keep` accepts)."""
    out = []
    for device, d in frames:
        runs = [r for r in size_runs(d) if r.size == shape.size]
        if not runs:
            continue
        run = runs[0]
        out += [(device, run, b) for b in benches(run.rows) if b.measured and keep(b) and Shape.of(b) == shape]
    return out


def tp_facts(fsdp: list[tuple[str, object]], ddp: list[tuple[str, object]], labels: dict[str, str],
             ddp_label) -> list[TpFacts]:
    """One TpFacts per TP shape (size, context, global batch), newest edition first.
    fsdp, ddp: (device, its rows) of the fsdp and ddp sections; labels: config variant -> label of the
    fsdp section's rows; ddp_label(bench): the ddp section's row label."""
    tp_rows: dict[Shape, list[TpRow]] = {}
    for device, d in fsdp:
        for run in size_runs(d):
            for b in benches(run.rows):
                if b.cfg.variant == TP and b.cfg.size_ref is not None:
                    tp_rows.setdefault(Shape.of(b), []).append(TpRow(b, run.label(device), _where(device)))
    out = []
    for shape, rows in tp_rows.items():
        measured = sorted((r for r in rows if r.measured), key=lambda r: (r.world, r.run.device))
        done = {r.world for r in measured}
        not_run = [r for r in rows if not r.measured and r.world not in done]
        beside_rows = _newest_of_shape(fsdp, shape, lambda b: b.cfg.variant != TP)
        if not any(b.cfg.variant == "ddp" for _, _, b in beside_rows):  # no DDP row in the fsdp runs: the ddp section's
            beside_rows += _newest_of_shape(ddp, shape, lambda b: b.cfg.variant not in ("single", "bucketed")
                                            and b.cfg.kind != "trace")
        beside = []
        for device, run, b in beside_rows:
            label = labels.get(b.cfg.variant, b.cfg.variant) if b.run.section != "ddp" else ddp_label(b)
            same = [r for r in measured if r.bench.run.datetime == b.run.datetime and r.world == int(b.cfg.world_size)]
            vs = None
            if same:
                t = same[0]
                vs = ratio(t.step_s, b.stats.median, "", t.spread, spread(b.stats.stddev, b.stats.iqr))
            beside.append(Beside(label, b, run.label(device), _where(device), b.run.section, vs))
        if measured or not_run:
            out.append(TpFacts(measured[0].run.size if measured else not_run[0].run.size, shape.context, shape.batch,
                               measured, not_run, beside))
    return sorted(out, key=lambda f: -int(f.rows[0].run.edition if f.rows else f.not_run[0].run.edition))
