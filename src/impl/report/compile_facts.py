"""torch_compile (a) as facts: each compiled attention row paired with the eager row of the same run
(the same stored file), since a ratio is taken within one run only. Eager rows of another run (the
pytorch_attention section) are kept apart: shown beside for reference, never divided."""
from __future__ import annotations

from dataclasses import dataclass

from impl.report.ratio import Ratio, ratio, spread
from impl.report.rows import Bench, of_newest_run
from impl.workloads.problems import Problem as P


def same_run(a: Bench, b: Bench) -> bool:
    return (a.run.device, a.run.section, a.run.datetime) == (b.run.device, b.run.section, b.run.datetime)


@dataclass(frozen=True)
class CompilePair:
    d_model: int
    seq: int
    mode: str
    compiled: Bench
    eager: Bench | None  # the same run's eager row, None where the run has none

    @property
    def ratio(self) -> Ratio | None:
        """Compiled ÷ eager (ours ÷ anchor): below 1 the compiled attention is faster."""
        if self.eager is None or not (self.compiled.measured and self.eager.measured):
            return None
        c, e = self.compiled.stats, self.eager.stats
        return ratio(c.median, e.median, "eager", spread(c.stddev, c.iqr), spread(e.stddev, e.iqr))


@dataclass(frozen=True)
class CompileAttentionFacts:
    pairs: list[CompilePair]
    other_run_eager: list[Bench]  # eager rows of other runs, for reference only

    @property
    def paired(self) -> list[CompilePair]:
        return [p for p in self.pairs if p.ratio is not None]

    @property
    def longest(self) -> list[CompilePair]:
        """The same-run pairs at the longest sequence paired."""
        if not self.paired:
            return []
        seq = max(p.seq for p in self.paired)
        return [p for p in self.paired if p.seq == seq]


def _is_eager(b: Bench) -> bool:
    return b.problem == P.PYTORCH_ATTENTION or b.cfg.impl == "eager"


def newest_paired_run(rows: list[Bench]) -> list[Bench]:
    """The rows of the newest run that timed eager beside compiled (since issue 33), or all `rows`
    where no run did: such a run answers (a) alone, its ratios never mixing runs."""
    eager = [b for b in rows if b.cfg.impl == "eager"]
    return of_newest_run(rows, among=eager) if eager else rows


def compile_attention_facts(compiled: list[Bench], eager_candidates: list[Bench]) -> CompileAttentionFacts:
    pairs = []
    for c in compiled:
        if c.cfg.impl == "eager":
            continue
        e = next((e for e in eager_candidates if _is_eager(e) and same_run(c, e) and e.cfg.seq == c.cfg.seq
                  and e.cfg.mode == c.cfg.mode and e.cfg.d_model == c.cfg.d_model), None)
        pairs.append(CompilePair(c.cfg.d_model, c.cfg.seq, c.cfg.mode, c, e))
    others = [e for e in eager_candidates if _is_eager(e) and not any(same_run(e, p.compiled) for p in pairs)]
    return CompileAttentionFacts(pairs, others)


MODES_B = (("forward", "forward"), ("forward_backward", "forward+backward"), ("optimizer_step", "optimizer step"))


@dataclass(frozen=True)
class ModeRatios:
    """torch_compile (b), one mode: compiled ÷ eager (same run), the median over contexts, per size."""

    mode: str
    label: str
    by_size: dict[str, float]  # smallest and largest size measured

    @property
    def gain_shrinks(self) -> bool:
        """The compiled gain is smaller on the largest size than on the smallest."""
        vals = list(self.by_size.values())
        return len(vals) == 2 and vals[-1] > vals[0]


def compile_model_facts(rows: list[Bench]) -> list[ModeRatios]:
    rows = [b for b in rows if b.measured]
    sizes = list(dict.fromkeys(b.cfg.size for b in rows))  # the rows' order: smallest first
    out = []
    for mode, label in MODES_B:
        per = {}
        for size in dict.fromkeys((sizes[0], sizes[-1])) if sizes else ():
            sel = [b for b in rows if b.cfg.mode == mode and b.cfg.size == size]
            rs = sorted(c.stats.median / e.stats.median for c in sel if c.cfg.impl == "compiled"
                        for e in sel if e.cfg.impl == "eager" and same_run(c, e) and e.cfg.context == c.cfg.context)
            if rs:
                per[size] = rs[len(rs) // 2]
        if per:
            out.append(ModeRatios(mode, label, per))
    return out
