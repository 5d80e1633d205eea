"""The torch_compile page (pytorch_attention is impl.report.pages.pytorch_attention, the FlashAttention-2
pages impl.report.pages.flash). Tables come from impl.report.attention (and torch_compile (b)'s from
impl.report.profiling); every number in the prose is read from the rows."""
from __future__ import annotations

import pandas as pd

from impl.report import profiling
from impl.report.attention import newest_date, not_run_reasons, problem_rows, ran, torch_compile_table
from impl.report.pages import Answer, Context, Page, Score, missing_page
from impl.report.compile_facts import compile_attention_facts, compile_model_facts, newest_paired_run
from impl.report.rows import benches
from impl.report.runs import run_ids, runs_line
from impl.report.templating import macros
from impl.report.pages.problems import problem
from impl.workloads.problems import Problem as P

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
    return [torch_compile_page(ctx)]
