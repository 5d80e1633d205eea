"""Pages of 1.2 attention: pytorch_attention and torch_compile (the FlashAttention-2 pages are two-file
pages: impl.report.pages.flash_attention, flash_benchmarking, leaderboard, flash_shapes). Tables come
from impl.report.attention (and torch_compile (b)'s from impl.report.profiling); every number in the
prose is read from the rows."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from impl.attention.memory import naive_attention_memory
from impl.report import profiling
from impl.report.attention import (accounting_case, detail_of, median_ms, memory_accounting, newest_date,
                                   not_run_reasons, pick, problem_rows, pytorch_attention_table, ran,
                                   torch_compile_table)
from impl.report.markdown import gib
from impl.report.pages import Answer, Context, Page, Score, missing_page
from impl.report.compile_facts import compile_attention_facts, compile_model_facts, newest_paired_run
from impl.report.rows import benches
from impl.report.runs import run_ids, runs_line
from impl.report.templating import macros
from impl.report.pages.problems import problem
from impl.workloads.problems import Problem as P

#: Bytes per element of the naive attention's dtypes.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
#: Memory passes over the (b, s, s) score matrix in naive_attention's forward: QKᵀ writes it, the
#: scaling reads and writes it, softmax reads it and writes P, P·V reads P (at least; softmax may
#: read its row more than once).
NAIVE_FORWARD_PASSES = 6


@dataclass(frozen=True)
class SeedTimes:
    """A course seed's published naive-attention times (not our data: quoted for comparison)."""

    source: str
    gpu: str
    batch: int
    dtype: str
    d: int
    seq: int
    forward_ms: float
    backward_ms: float


# /work/shared/seeds/000 (the course's H100 write-up), its pytorch_attention table, d 64, seq 16384
SEED_NAIVE = SeedTimes("the course seed's H100 write-up", "H100 (model not stated)", 8, "fp32", 64, 16384, 69.9, 144.6)


# --- pytorch_attention -------------------------------------------------------------------------------------

def _naive_bandwidth(r) -> float:
    """Bytes per second the forward row moved over its score matrix, at NAIVE_FORWARD_PASSES passes."""
    b, s = int(r.cfg.batch), int(r.cfg.seq)
    return NAIVE_FORWARD_PASSES * b * s * s * DTYPE_BYTES[r.cfg.dtype] / r["median"]


PA = macros("pytorch_attention.md.j2")


def seed_comparison(pa: pd.DataFrame) -> str | None:
    """Ours against the seed's naive times at its shape, and what bounds ours (bytes moved)."""
    seed = SEED_NAIVE
    f = pick(pa, d_model=seed.d, seq=seed.seq, mode="forward")
    b = pick(pa, d_model=seed.d, seq=seed.seq, mode="backward")
    if f is None or b is None:
        return None
    smallest_d = pick(pa, d_model=pa.cfg.d_model.min(), seq=seed.seq, mode="forward")
    return PA.a_seed(seed, median_ms(f), median_ms(b), f.cfg.batch == seed.batch and f.cfg.dtype == seed.dtype,
                     int(f.cfg.batch), f.cfg.dtype, detail_of(f, "tf32"), int(f["rounds"]),
                     gib(int(f.cfg.batch) * seed.seq ** 2 * DTYPE_BYTES[f.cfg.dtype]), NAIVE_FORWARD_PASSES,
                     _naive_bandwidth(smallest_d), int(smallest_d.cfg.d_model), _naive_bandwidth(f),
                     _naive_bandwidth(f) * median_ms(f) / seed.forward_ms)


def pytorch_attention_page(ctx: Context) -> Page | None:
    name, answers, body, score = P.PYTORCH_ATTENTION, [], [], {}
    for dev in ctx.gpu_devices():
        pa = problem_rows(ctx.device_rows(dev), name)
        if pa.empty:
            continue
        ok = pa[pa.apply(ran, axis=1)]
        ooms = pa[pa.oom]
        case = accounting_case(pa)
        big = ok.sort_values(["cfg.seq", "cfg.d_model"]).iloc[-1]
        fwd, bwd = (median_ms(pick(pa, d_model=big.cfg.d_model, seq=big.cfg.seq, mode=m)) for m in ("forward", "backward"))
        batch, dtype, seq, d = int(big.cfg.batch), big.cfg.dtype, int(big.cfg.seq), int(big.cfg.d_model)
        mem, half = naive_attention_memory(batch, seq, d, dtype), naive_attention_memory(batch, seq // 2, d, dtype)
        if ooms.empty:
            oom_text = PA.a_no_oom(gib(big["row"].env.gpu_memory_bytes), big["row"].env.device, d, seq, fwd, bwd)
        else:
            first = ooms.sort_values(["cfg.seq", "cfg.d_model"]).iloc[0]
            oom_text = PA.a_oom(int(first.cfg.d_model), int(first.cfg.seq), first.cfg.mode)
        answers = [Answer(PA.q_a(), oom_text), Answer(PA.q_accounting(), PA.a_accounting(case[0], case[1], mem, half)),
                   Answer(PA.q_eliminate(), PA.a_eliminate())]
        seed = seed_comparison(pa)
        if seed:
            answers.append(Answer(PA.q_seed(), seed))
        r0 = pa.iloc[0]
        body += [f"### {dev}", PA.method(int(r0.cfg.batch), r0.cfg.dtype, int(pa["rounds"].max())),
                 pytorch_attention_table(pa)]
        if not_run_reasons(pa):
            body.append("Not run:\n" + not_run_reasons(pa))
        body += [memory_accounting(pa) or "", runs_line(dev, pa)]
        score[name] = Score(answer=PA.score_answer(not ooms.empty), headline=PA.score_headline(fwd, bwd, d, seq),
                            vs_anchor="– (no anchor: the naive implementation is the baseline)", device=dev,
                            date=newest_date(pa))
        break  # the first GPU with rows answers; the others have none for this problem
    if not answers:
        return missing_page("pytorch_attention", name, [name], [name], where=P.PYTORCH_ATTENTION)
    return Page("pytorch_attention", "pytorch_attention: naive attention, time and memory", [problem(name)], answers,
                "\n\n".join(x for x in body if x), score)


# --- torch_compile -----------------------------------------------------------------------------------------

def torch_compile_page(ctx: Context) -> Page | None:
    name, answers, body, score = P.TORCH_COMPILE, [], [], {}
    for dev in ctx.gpu_devices():
        df = ctx.device_rows(dev)
        tc, pa = problem_rows(df, name, "attention"), problem_rows(df, P.PYTORCH_ATTENTION)
        # runs since issue 33 time the eager cells beside the compiled ones (impl "eager"); older
        # runs compare with the pytorch_attention rows
        same_run = not tc.empty and (tc.cfg.impl == "eager").any()
        if same_run:
            tc = tc[tc.datetime.isin({b.run.datetime for b in newest_paired_run(benches(tc))})]
            tc, pa = tc[tc.cfg.impl != "eager"], tc[tc.cfg.impl == "eager"]
        model = profiling.compile_section(df, heading=f"### (b) compiled model vs eager ({dev})")
        if tc.empty and model is None:
            continue
        if not tc.empty:
            f = compile_attention_facts(benches(tc), benches(tc) + benches(pa))
            words = macros("torch_compile.md.j2")
            answers.append(Answer(words.q_a(), words.a_a(f, run_ids(tc), run_ids(pa) if not pa.empty else None,
                                                         len(tc[~tc.apply(ran, axis=1)]), len(tc))))
            body += [f"### (a) compiled vs eager attention ({dev})",
                     words.a_method(tc.iloc[0].cfg.backend), torch_compile_table(tc, pa)]
            if not_run_reasons(tc):
                body.append("Not run:\n" + not_run_reasons(tc))
            body.append(runs_line(dev, pd.concat([tc, pa]) if not pa.empty else tc))
            score[name] = Score(answer=words.score_answer(f), headline=words.score_headline(f),
                                vs_anchor=words.score_vs(f), device=dev, date=newest_date(tc))
        if model is not None:
            mrows = df[(df.problem == name) & (df.section != tc.section.iloc[0] if not tc.empty else True)]
            words = macros("torch_compile.md.j2")
            answers.append(Answer(words.q_b(), words.a_b(compile_model_facts(benches(mrows)))))
            body.append(model)
            if not mrows.empty:
                body.append(runs_line(dev, mrows))
        break
    if not answers:
        return missing_page("torch_compile", name, [name], [name], where=P.TORCH_COMPILE)
    return Page("torch_compile", "torch_compile: compiled attention and model", [problem(name)], answers,
                "\n\n".join(body), score)


# --- pages -------------------------------------------------------------------------------------------------

def pages(ctx: Context) -> list[Page]:
    return [pytorch_attention_page(ctx), torch_compile_page(ctx)]
