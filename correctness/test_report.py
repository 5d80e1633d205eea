"""The report's section renderers and pages from synthetic runs: the attention sections' version
history (earlier runs kept under reports/data/<device>/history/ are loaded apart from the current
data), and the page of training_step."""
import json
import pytest

from impl.report import build as pages_build


def page(root, slug: str) -> str:
    """The page `slug` that the report builder writes for the data under root."""
    return pages_build.build(root)[f"{slug}.md"]


# ------------------------------------------------------------------------------------ training_step
BF16 = dict(dtype="bf16", attn_impl="naive", compile="none", optimizer="adamw", fused_ce=False, compile_backend=None)
FAST_OLD = dict(BF16, attn_impl="flash_triton", compile="blocks", compile_backend="inductor", optimizer="adamw_fused",
                fused_ce=True)  # from before the `weights` option: fp32 weights
FAST_NEW = dict(FAST_OLD, weights="bf16", optimizer="adamw_master_fused")


def _profile(step_ms: float, phase_ms: tuple, host_ms: tuple | None = None) -> dict:
    """A step_breakdown-shaped profile; host_ms=None: one from before phase_host_ms and launch_ops."""
    phases = ("forward", "backward", "optimizer step")
    kernel_ms = sum(phase_ms)
    out = dict(timing_source="kernels", steps_profiled=1, warmup_steps=1, step_ms=step_ms, kernel_ms=kernel_ms,
               gap_ms=step_ms - kernel_ms, phase_ms=dict(zip(phases, phase_ms)),
               category_ms=dict(matmul=kernel_ms, attention=0.0), top=[])
    if host_ms is not None:
        out.update(launch_ops=True, phase_host_ms=dict(zip(phases, host_ms)))
    return out


def _train_row(size: str, context: int, config: str, settings: dict, profile: dict | None = None,
               mean: float = 0.1, mfu: float = 0.3, not_run: bool = False) -> dict:
    info = dict(problem="training_step", warmup=1, rounds=3, peak_flops=1e15, peak_dtype="bfloat16",
                env=dict(device="GPU", device_type="cuda"), metrics=dict(tokens_per_s=1e4, mfu=mfu),
                config=dict(size=size, context=context, config=config, batch=4, **settings))
    if profile is not None:
        info["profile"] = profile
    if not_run:
        info.update(not_run="left_out", not_run_reason="budget", metrics={})
    return dict(name=f"test_training_step[{size}-{context}-{config}]", group="training_step", extra_info=info,
                stats=dict(mean=mean, stddev=0.0, median=mean, min=mean, max=mean, rounds=3, data=[mean]))


def _training_step_report(tmp_path, rows: list[dict], runs: dict | None = None, commits: list | None = None) -> str:
    """The report's training_step section from `rows` (one run), or from runs {datetime: rows}
    (commits: each run's pytest-benchmark commit_info)."""
    dev = tmp_path / "reports" / "data" / "gpu-x" / "training_step"  # impl.bench.store's layout
    dev.mkdir(parents=True)
    (tmp_path / "reports" / "figures").mkdir()
    for i, (when, run_rows) in enumerate((runs or {"2026-02-01T00:00": rows}).items()):
        doc = dict(datetime=when, benchmarks=run_rows, **(dict(commit_info=commits[i]) if commits else {}))
        (dev / f"run-{i}.json").write_text(json.dumps(doc))
    return page(tmp_path, "training_step")


def test_training_step_newest_measurement_of_each_row(tmp_path):
    """Runs mix: a row shows its newest run that ran it (OOM counts), falls back to an older run
    where the newest left it out, says which run, and each run's peak is listed; ours against the
    anchor says whether the two came from one run."""
    old = [_train_row("xl", 512, "bf16", BF16, mean=0.30), _train_row("xl", 512, "+flash", BF16, mean=0.37),
           _train_row("xl", 512, "anchor", BF16, mean=0.10, mfu=0.34)]
    new = [_train_row("xl", 512, "bf16", BF16, mean=0.25), _train_row("xl", 512, "+flash", BF16, not_run=True),
           _train_row("xl", 512, "fast", FAST_NEW, mean=0.08, mfu=0.42),
           _train_row("xl", 512, "anchor", BF16, mean=0.095, mfu=0.35)]
    later = [_train_row("xl", 512, "fast+cudagraphs", dict(FAST_NEW, compile="model+cudagraphs"), mean=0.07, mfu=0.5)]
    text = _training_step_report(tmp_path, [], runs={"2026-02-01T07:16:00": old, "2026-02-02T14:11:00": new,
                                                     "2026-02-02T14:30:00": later})
    assert "| bf16 | xl | 512 | 250.0 ± 0.0 |" in text and "300.0" not in text.split("<details>")[0]
    assert "| +flash | xl | 512 | 370.0 ± 0.0 |" in text and text.count("| +flash | xl | 512 |") == 1
    assert next(ln for ln in text.splitlines() if ln.startswith("| +flash | xl | 512 |")).endswith("| 02-01 07:16 | `–` |")
    assert "| 02-02 14:11 | `–` | `training_step` | 1,000.0 | 3 |" in text
    # no datasheet peak for a device named "GPU": its MFU is "–"
    assert "| xl | 512 | fast | 80.0 ± 0.0 | – / 42.0% | 95.0 ± 0.0 | – / 35.0% | 0.84× | yes |" in text
    assert ("| xl | 512 | fast+cudagraphs | 70.0 ± 0.0 | – / 50.0% | 95.0 ± 0.0 | – / 35.0% | 0.74× | "
            "no (02-02 14:30 / 02-02 14:11) |") in text
    # one run: one row in the runs table, its peak in the method
    one = _training_step_report(tmp_path / "one", old)
    assert one.count("| 02-01 00:00 | `–` | `training_step` |") == 1 and "(1,000.00 TFLOP/s, bfloat16)" in one


def test_training_step_every_run_of_a_repeated_row(tmp_path):
    """Ours and the anchor measured in several runs: each run listed with its commit ("+": changes on
    top of it), MFU, peak and ours' speed-up over the anchor of the same run; rows run once and the
    ablation's other configs are not repeated there."""
    fast = dict(FAST_NEW, compile="model+cudagraphs")
    runs = {"2026-02-01T07:16:00": [_train_row("2.7B", 512, "fast+cudagraphs", fast, mean=0.110, mfu=0.51),
                                    _train_row("2.7B", 512, "anchor", BF16, mean=0.132, mfu=0.43),
                                    _train_row("2.7B", 512, "bf16", BF16, mean=0.3)],
            "2026-02-02T14:11:00": [_train_row("2.7B", 512, "fast+cudagraphs", fast, mean=0.120, mfu=0.49),
                                    _train_row("2.7B", 512, "bf16", BF16, mean=0.3),
                                    _train_row("xl", 512, "fast", FAST_NEW, mean=0.08)]}
    commits = [dict(id="a" * 40, dirty=False), dict(id="b" * 40, dirty=True)]
    part = _training_step_report(tmp_path, [], runs=runs, commits=commits).split("Every run of ours")[1]
    part = part.split("![")[0]
    assert ("| 2.7B | 512 | fast+cudagraphs | 02-01 07:16 | `aaaaaaaa` | 110.0 ± 0.0 | 51.0% | 1,000.0 | 0.83× |"
            in part)
    assert "| 2.7B | 512 | fast+cudagraphs | 02-02 14:11 | `bbbbbbbb+` | 120.0 ± 0.0 | 49.0% | 1,000.0 | – |" in part
    assert "anchor" not in part.split("|---|")[-1] and "bf16" not in part and "| xl |" not in part
    # one run each: no such table
    assert "Every run of ours" not in _training_step_report(tmp_path / "one", runs["2026-02-01T07:16:00"])


def test_training_step_config_table_has_a_row_per_settings(tmp_path):
    """A config whose rows ran other settings in another size (or context) gets a row per settings,
    with the sizes (and contexts) that ran them; one whose settings agree stays one row."""
    rows = [_train_row(size, ctx, name, settings) for size, ctx, name, settings in [
        ("xl", 512, "bf16", BF16), ("xl", 1024, "bf16", BF16), ("2.7B", 512, "bf16", BF16),
        ("xl", 512, "fast", FAST_OLD), ("xl", 1024, "fast", FAST_OLD), ("2.7B", 512, "fast", FAST_NEW),
        ("xl", 512, "+flash", dict(BF16, attn_impl="flash_triton")),
        ("xl", 1024, "+flash", dict(BF16, attn_impl="flash_torch"))]]
    text = _training_step_report(tmp_path, rows)
    assert ("| config | sizes | dtype | Linear weights | attention | torch.compile | optimizer | LM head + loss |"
            in text)
    assert "| bf16 | xl, 2.7B | bf16 | fp32 | naive | none | adamw | logits + cross_entropy |" in text
    assert ("| fast | xl | bf16 | fp32 | flash_triton | blocks (inductor) | adamw_fused | fused, chunked |\n"
            "| fast | 2.7B | bf16 | bf16 (fp32 masters) | flash_triton | blocks (inductor) | adamw_master_fused | "
            "fused, chunked |") in text
    assert "| +flash | xl (ctx 512) | bf16 | fp32 | flash_triton |" in text
    assert "| +flash | xl (ctx 1024) | bf16 | fp32 | flash_torch |" in text
    assert "one Triton kernel per tensor" not in text and "adamw_master: our Triton kernel" in text


def test_training_step_profile_host_time_and_unattributed_marker(tmp_path):
    """Host time per phase where the profile has it ("–" where not); a profile without launch_ops
    is marked, and the footnote says what it missed, with an AdamWMaster row's optimizer step."""
    rows = [_train_row("xl", 512, "bf16", BF16, _profile(100.0, (20.0, 40.0, 10.0), host_ms=(30.0, 45.0, 5.0))),
            _train_row("2.7B", 512, "fast", FAST_NEW, _profile(160.0, (25.0, 52.0, 0.34))),
            _train_row("2.7B", 512, "bf16", BF16, _profile(200.0, (50.0, 100.0, 40.0)))]
    part = _training_step_report(tmp_path, rows).split("Where the time goes")[1]
    assert ("| size | context | config | step (ms) | forward (ms) | backward (ms) | optimizer step (ms) | "
            "host fwd / bwd / opt (ms) | matmul |") in part
    assert "| xl | 512 | bf16 | 100.00 | 20.00 | 40.00 | 10.00 | 30.00 / 45.00 / 5.00 | 70.00 (70%) |" in part
    assert "| 2.7B | 512 | fast † | 160.00 | 25.00 | 52.00 | 0.34 | – | 77.34 (48%) |" in part
    note = next(ln for ln in part.splitlines() if ln.startswith("† "))
    assert "AdamWMaster's update, eager FlashAttention" in note and "counted in the gap" in note
    assert "the optimizer step of 2.7B ctx 512 fast: 0.34 ms" in note
    assert "| 2.7B | 512 | bf16 | 200.00 |" in part  # old, but none of our launchers ran
    assert "Host: each phase's range on the host clock" in part


def test_training_step_profile_without_old_or_host_data(tmp_path):
    """All profiles new: no marker, no footnote; none with host time: no host column."""
    new = _training_step_report(tmp_path / "new", [
        _train_row("xl", 512, "fast", FAST_NEW, _profile(100.0, (20.0, 40.0, 10.0), host_ms=(1.0, 2.0, 3.0)))])
    assert "†" not in new and "| xl | 512 | fast | 100.00 |" in new
    old = _training_step_report(tmp_path / "old", [
        _train_row("xl", 512, "fast", FAST_OLD, _profile(100.0, (20.0, 40.0, 10.0))),
        _train_row("xl", 512, "+flash", dict(BF16, attn_impl="flash_triton"), _profile(90.0, (20.0, 40.0, 10.0)))])
    assert "host fwd" not in old and "Host:" not in old
    # old fast ran flash compiled (custom ops) and torch's fused AdamW: nothing was missed
    assert "| xl | 512 | fast | 100.00 | 20.00 | 40.00 | 10.00 | 70.00 (70%) |" in old
    assert "| xl | 512 | +flash † | 90.00 |" in old  # eager flash: launches outside an op
    assert "(e.g. the optimizer step" not in old  # no AdamWMaster row to show


def _bench_doc(rows: list, not_run: list) -> dict:
    """A bench-layer JSON: measured rows as benchmarks (row in extra_info, stats beside it), the others
    in the top-level not_run list."""
    from impl.bench.row import NotRunEntry

    def name(r):
        return f"test_{r.problem}[{'-'.join(str(v) for v in r.config.values())}]"
    benches = [dict(name=name(r), group=r.problem, extra_info=r.to_json(),
                    stats=dict(mean=mean, stddev=0.0, median=median, min=median, max=mean, rounds=5, data=[median]))
               for r, mean, median in rows]
    return dict(datetime="2026-03-01T10:00:00", benchmarks=benches,
                not_run=[NotRunEntry(name=name(r), fullname="x", group=r.problem, row=r).to_json() for r in not_run])


def _section(tmp_path, doc: dict, section: str) -> str:
    """The page `section`.md of the run `doc`."""
    dev = tmp_path / "reports" / "data" / "gpu-x" / "run"  # impl.bench.store's layout
    dev.mkdir(parents=True)
    (tmp_path / "reports" / "figures").mkdir()
    (dev / "run.json").write_text(json.dumps(doc))
    return page(tmp_path, section)


def test_training_step_bench_layer_rows(tmp_path):
    """Rows of the bench layer: the step is the median (not the mean), the first step is the
    first_call_s metric, compile_s comes from details, MFU is the measured-peak one, warm-up and
    rounds come from the rows' timing, and a budget cut is listed with its reason."""
    from impl.bench.row import Env, Metric, Peaks, Row, Status, Timing

    env = Env(device="NVIDIA H100", device_type="cuda", torch="2", triton=None, cuda="12", profile="full")
    peaks = Peaks(measured_flops=1e15, measured_dtype="bfloat16", measured_n=8192, datasheet_flops=2e15)
    timing = Timing(round="one training step", timer="SyncTimer", warmup_rounds=3, rounds=5)

    def row(config, settings, status=Status.MEASURED, **kw):
        return Row(problem="training_step", config=dict(size="xl", context=512, config=config, batch=4, **settings),
                   env=env, status=status, timing=timing if status is Status.MEASURED else None,
                   peaks=peaks if status is Status.MEASURED else None, **kw)

    bf16 = row("bf16", BF16, metrics={Metric.TOKENS_PER_S: 1e4, Metric.MFU_MEASURED_PEAK: 0.3, Metric.MFU: 0.15,
                                      Metric.FIRST_CALL_S: 1.5})
    fast = row("fast", FAST_NEW, metrics={Metric.TOKENS_PER_S: 2e4, Metric.MFU_MEASURED_PEAK: 0.6, Metric.MFU: 0.3,
                                          Metric.FIRST_CALL_S: 12.1},
               details=dict(compiled_now=True, compile_s=12.0, new_graphs=2))
    anchor = row("anchor", BF16, status=Status.LEFT_OUT_BY_BUDGET, reason="time budget of this perf file exhausted")
    text = _section(tmp_path, _bench_doc([(bf16, 0.3, 0.2), (fast, 0.15, 0.1)], [anchor]), "training_step")
    assert "| bf16 | xl | 512 | 200.0 ± 0.0 | 10,000 | 15.0% | 30.0% | 1.00× | – | 1.50 | – | – |  |" in text
    assert "| fast | xl | 512 | 100.0 ± 0.0 | 20,000 | 30.0% | 60.0% | 0.50× | – | 12.10 | 12.00 | 2 |  |" in text
    assert "| anchor | xl | 512 | – | – | – | – | – | – | – | – | – | not run |" in text
    assert "3 warm-up and 5 timed steps (step = their median)" in text
    assert "(1,000.00 TFLOP/s, bfloat16)" in text
    assert "Not run: 1 row(s) (time budget of this perf file exhausted)." in text


def test_a_page_module_that_fails_to_import_fails_the_build_naming_it(monkeypatch, tmp_path):
    from impl.report import build

    monkeypatch.setattr(build, "PAGE_MODULES", [*build.PAGE_MODULES, "impl.report.pages.no_such_page"])
    with pytest.raises(build.PageModuleError, match="impl.report.pages.no_such_page failed to import"):
        build.collect(build.context(tmp_path / "data", tmp_path))
