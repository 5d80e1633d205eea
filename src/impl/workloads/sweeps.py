"""Every sweep grid of the suite, per profile, in one table (the grids' types: impl.workloads.grids).

`smoke` uses tiny shapes that run on a CPU in minutes (what CI runs); `full` is the assignment's
grid, trimmed only where a section must fit one 10-minute command on the GPU machine; what a
trim leaves out is recorded in the benchmark JSON through `left_out`, never dropped silently.
"""
from impl.model import MODEL_SIZES, MODEL_SIZES_2026, SizeRef
from impl.workloads.grids import (
    AttentionGrid, CheckpointCase2026, CheckpointDepth, CheckpointingGrid, CommAccountingGrid, CommunicationGrid,
    CompiledAttentionGrid, CompileModelGrid, DDPGrid, DDPTrace, FFNShape, FlashGrid, FlashShapesGrid, FreshWarmupGrid,
    FSDPGrid, HostCost, Leaderboard2026Grid, LeaderboardGrid, LeaderboardTwoGPUGrid, MemoryAccountingGrid, MemoryProfilingGrid, MixedPrecisionGrid,
    NsysGrid, Nsys2026Grid, ParallelismGrid, PerRankMemoryGrid, Script2026Grid, ScriptGrid, ScriptWarmupGrid,
    ShardingGrid, StepCandidate, Tolerance, TrainingStepGrid)
from impl.workloads.variants import DDPVariant, FSDPVariant, ShardVariant, StepMode

MODES = tuple(StepMode)
F, B, FB, OPT, TRAIN = StepMode  # short names for the grids below


def _sizes(*pairs: tuple[str, str]) -> tuple[SizeRef, ...]:
    return tuple(SizeRef.of(p) for p in pairs)


GRIDS = {
    "benchmarking_script": {
        "full": ScriptGrid(sizes=tuple(MODEL_SIZES), contexts=(128, 256, 512, 1024), modes=MODES,
                           dtypes=("fp32", "bf16"), batch=4, warmup=5, rounds=10),
        "smoke": ScriptGrid(sizes=("tiny",), contexts=(32, 64), modes=MODES, dtypes=("fp32", "bf16"),
                            batch=2, warmup=1, rounds=3),
    },
    # (c): warm-up 0/1/2/5; a subset of sizes, recorded as such in the JSON.
    "benchmarking_script_warmup": {
        "full": ScriptWarmupGrid(sizes=("small", "large"), contexts=(256,), modes=(F, TRAIN), dtypes=("fp32",),
                                 warmups=(0, 1, 2, 5), batch=4, rounds=10,
                                 left_out="sizes medium, xl, 2.7B and contexts other than 256 (time budget)"),
        "smoke": ScriptWarmupGrid(sizes=("tiny",), contexts=(32,), modes=(F, TRAIN), dtypes=("fp32",),
                                  warmups=(0, 1, 2, 5), batch=2, rounds=3, left_out="smoke profile"),
    },
    # benchmarking_script (b) and benchmarking_mixed_precision (c), 2026 edition: every size of the 2026
    # table at the handout's default context (512: the problem names none), 5 warm-up and 10 timed
    # steps, one step a round. fp32 ("Up to this point ... FP32") times the forward, backward and
    # optimizer step apart; bf16 autocast the forward and backward that mixed precision (c) asks.
    # An OOM is a row with its closed-form need (impl.workloads.steps.memory_need): on 80 GB the 10B's
    # fp32 weights alone are 51 GB. H100 estimate: ~10 s a size for small..large, ~45 s for xl, ~40 s
    # for the 10B (its build, forwards, and OOMs): ~2.5 min.
    "benchmarking_script_2026": {
        "full": Script2026Grid(edition="2026", sizes=tuple(MODEL_SIZES_2026), context=512, batch=4, warmup=5, rounds=10,
                               modes={"fp32": (F, B, OPT), "bf16": (F, B)}),
        "smoke": Script2026Grid(edition="2026", sizes=("tiny",), context=32, batch=2, warmup=5, rounds=10,
                                modes={"fp32": (F, B, OPT), "bf16": (F, B)}),
    },
    # (c), 2026: no warm-up, then 1 and 2 warm-up steps, and (b)'s 5 as the reference, each config in a
    # fresh process (impl.workloads.fresh_steps): a training step a round with its phases timed apart. The
    # 10B is left out (its fp32 training step does not fit one 80 GB GPU: the main rows record that
    # OOM). H100 estimate: ~8 s to start a process and build, + 10-15 steps (xl ~1 s each): ~4 min for
    # 16 configs.
    "benchmarking_script_2026_warmup": {
        "full": FreshWarmupGrid(edition="2026", sizes=("small", "medium", "large", "xl"), context=512, batch=4,
                                dtype="fp32", warmups=(0, 1, 2, 5), rounds=10, start_timeout_s=180, step_timeout_s=120,
                                left_out="size 10B: its fp32 training step does not fit one 80 GB GPU (see its OOM rows)"),
        "smoke": FreshWarmupGrid(edition="2026", sizes=("tiny",), context=32, batch=2, dtype="fp32", warmups=(0, 1, 2, 5),
                                 rounds=10, start_timeout_s=180, step_timeout_s=120, left_out="smoke profile"),
    },
    # nsys_profile: kernel tables per phase from torch.profiler (issue 4); per config one unrecorded
    # warm-up step and two recorded ones, read from the raw kineto events in one pass. H100 estimate
    # for the full grid: ~10 s start-up, ~1-3 s per small/medium config, ~4-8 s per xl/2.7B config
    # (OOM fallbacks included): ~100-120 s. budget_s is checked before each config (the longest
    # takes ~15 s), so the section ends within ~200 s. The trace (gzipped Chrome JSON of the two
    # recorded steps) is kept only under trace_max_mb.
    "nsys_profile": {
        "full": NsysGrid(sizes=tuple(MODEL_SIZES), contexts=(128, 256, 512, 1024), dtype="fp32", batch=4,
                         timer_warmup=2, timer_rounds=5, prof_warmup=1, prof_steps=2, top=15,
                         trace=("small", 128), trace_max_mb=10, budget_s=170),
        "smoke": NsysGrid(sizes=("tiny",), contexts=(32, 64), dtype="fp32", batch=2,
                          timer_warmup=1, timer_rounds=5, prof_warmup=1, prof_steps=2, top=15,
                          trace=("tiny", 32), trace_max_mb=10, budget_s=50),
    },
    # nsys_profile, 2026 edition: "two model sizes ... three power-of-two context lengths larger than 128,
    # the largest ... the longest you can fit". Chosen at collection from the closed form
    # (impl.workloads.steps.fitting_contexts): the `n_sizes` largest 2026 sizes that have `n_contexts`
    # powers of two in [min_context, max_context] whose fp32 training step fits `headroom` of the
    # device's memory (the rest: transient score gradients, allocator slack), each with its top
    # `n_contexts`. On an H100 80GB: medium 512-2048 and large 256-1024 (xl (2026) fits only 256;
    # on an H200 it would be large and xl). device_bytes None = the device's. A size whose chosen context
    # runs out of memory also runs the power of two below its shortest (steps.fallback_2026_cases: medium
    # 256; large has none above 128), and the OOM row carries the closed form beside its measured peak.
    # The first H100 run's medium@2048 OOM (83 GB peak against 57.6 GB by the closed form) was the
    # timer's: pytest-benchmark kept each round's loss, and its whole graph, alive into the next round
    # (2 x 50.8 GB of activations + parameters); the measured peaks of that run's fitting configs match
    # 2 x activations + parameters within 1% (correctness/test_nsys_2026_grid.py). Fixed: the timer's
    # forward returns the loss detached (kernels.timer_forward_loss). H100 estimate: ~20 s a config
    # (timer, three steps profiled, kineto parse), medium@2048 ~30 s: ~2.5-3 min for the six, ~3.5 min
    # with a fallback row; budget_s 360 (SECTION_TIMEOUT 420 is ample). The first config keeps its trace.
    "nsys_profile_2026": {
        "full": Nsys2026Grid(edition="2026", candidates=tuple(MODEL_SIZES_2026), n_sizes=2, n_contexts=3,
                             min_context=256, max_context=16384, headroom=0.9, device_bytes=None, dtype="fp32", batch=4,
                             timer_warmup=2, timer_rounds=5, prof_warmup=1, prof_steps=2, top=15, trace_max_mb=10,
                             budget_s=360),
        "smoke": Nsys2026Grid(edition="2026", candidates=("tiny",), n_sizes=1, n_contexts=3, min_context=8,
                              max_context=64, headroom=0.9, device_bytes=None, dtype="fp32", batch=2, timer_warmup=1,
                              timer_rounds=5, prof_warmup=1, prof_steps=2, top=15, trace_max_mb=10, budget_s=60),
    },
    # mixed_precision_accumulation / benchmarking_mixed_precision (a): same in both profiles; each row
    # times the computation whose results it carries (a few ms: the harness asks >= 10 rounds).
    "mixed_precision": {
        "full": MixedPrecisionGrid(steps=1000, autocast_dtypes=("fp16", "bf16"), warmup=1, rounds=10),
        "smoke": MixedPrecisionGrid(steps=1000, autocast_dtypes=("fp16", "bf16"), warmup=1, rounds=10),
    },
    # memory_profiling: the 2025 edition's 2.7B × contexts × dtypes × modes, then the 2026 edition's
    # (size of the 2026 table, context) cases; allocator history for `snapshot_dtypes` (min/max
    # downsampled to max_points: each layer's rise and fall survives), raw snapshot pickles for
    # `artifacts` (edition, size, context, dtype, mode). (f): block_probe rows per 2026 case and dtype,
    # a stack of `probe_layers` of the size's blocks through impl.workloads.block_memory (`probe_top`
    # operations kept). H100 estimate for the 2026 rows (-k 2026): ~30 s start-up and model build,
    # ~1 min of steps and snapshots at 128, ~1 min at 2048 (forwards; the fp32 and bf16 training steps
    # need ~54 GB of state + ~140 GB of saved activations, an OOM on an H100 and on an H200, recorded
    # with that closed form), ~30 s of block probes: ~3-4 min.
    # The 2025 rows (-k 2025; issue 45): (d) and (e) are asked "at our reference hyperparameters", batch 4
    # and context 512 (reference_context: those rows carry details.reference_context, the 128 and 256
    # rows stay as extra rows); at 512 the residual stream is 4 x 512 x 2560 x 4 B = 20 MiB and the
    # forward's largest allocations the (4, 32, 512, 512) fp32 scores and probabilities, 128 MiB each.
    # The fp32 forward at 512 also keeps its raw snapshot (for memory_viz, (e)). H100 estimate for
    # -k 2025: ~30 s start-up and the 2.7B build, 12 rows (forwards ~0.1-0.35 s, training steps ~0.5-1.2 s,
    # 1 + 5 timed calls and one recorded step each, with the snapshot's analysis ~5-15 s a row):
    # ~2.5-3.5 min.
    "memory_profiling": {
        "full": MemoryProfilingGrid(sizes=("2.7B",), contexts=(128, 256, 512), dtypes=("fp32", "bf16"), modes=(F, TRAIN),
                                    batch=4, warmup=1, rounds=5, snapshot_dtypes=("fp32", "bf16"), max_points=4000,
                                    artifacts=(("2025", "2.7B", 256, "fp32", TRAIN), ("2025", "2.7B", 512, "fp32", F),
                                               ("2026", "xl", 128, "fp32", F), ("2026", "xl", 128, "fp32", TRAIN)),
                                    cases_2026=(("xl", 128), ("xl", 2048)), probe_layers=3, probe_top=5,
                                    reference_context=512),
        "smoke": MemoryProfilingGrid(sizes=("tiny",), contexts=(32,), dtypes=("fp32", "bf16"), modes=(F, TRAIN),
                                     batch=2, warmup=1, rounds=5, snapshot_dtypes=("fp32", "bf16"), max_points=4000,
                                     artifacts=(("2025", "tiny", 32, "fp32", TRAIN),),
                                     cases_2026=(("tiny", 16), ("tiny", 64)), probe_layers=3, probe_top=5,
                                     reference_context=32),
    },
    # torch_compile (b): eager vs compiled model, forward, forward+backward and the timed training step
    # (forward, backward, AdamW step as one timed call) per size × context, and the AdamW step alone per
    # size (perf/test_torch_compile_model.py). Sizes: the 2025 table, then the 2026 edition's 10B (its
    # other sizes are the 2025 table's; xl (2026) is 2.7B). Regional compilation with a dynamic
    # sequence dimension: one inference and one training graph per size serve every context, and the
    # training step reuses the training graph and CompiledAdamW's graphs (on the CPU, cold: small model
    # 12.7 + 19.4 s regional vs 44.5 + 70.2 s whole-model; impl.workloads.compiled).
    # Each row: one first call (the compile when a graph is new), `warmup` untimed calls and rounds =
    # row_s / that first call's time within [rounds_min, rounds_max] (at least 5, the harness's floor).
    # H100 estimate (issue 45), per row = first call + (warmup + rounds) × the step, from the H100 run
    # reports/data/h100-80gb-x1/torch_compile_model/20261123T063738Z (its medians and compile times;
    # 2.7B@1024 compiled fwd+bwd, cut there, taken as 0.88 × eager like xl@1024): ~10 s start-up;
    # the forward, fwd+bwd and optimizer rows of small..2.7B ~300 s (compilation ~10-25 s a size; 2.7B
    # at 1024 ~35 s); the training-step rows (fwd+bwd + optimizer step, 7 calls each) ~110 s (those
    # that run out of memory, by the closed form xl@1024 and 2.7B@1024 at 90 and 112 GB, cost one
    # forward+backward each); the 10B (12.7B parameters, fp32: 51 GB, so only its forwards fit 80 GB):
    # ~15 s build, ~75 s of forwards (eager ~0.3-2.7 s a step by 3.75 × 2.7B's), its optimizer step
    # and fwd+bwd at 128 out of memory (~15 s with the training graph's compile), every longer or
    # heavier row answered by those OOMs (implied_by_oom: recorded, not run). Total ~510 s, so
    # budget_s 470 (checked before each row; the longest row, 10B@1024 forward, ~20 s) ends the file
    # by ~495 s, inside gpu_run.sh's 540 s section timeout; a cut falls on the 10B's longest
    # forwards, which `-k 2026` (~2 min) completes. On an H200 the 10B's fwd+bwd at 128-512 fits
    # (114-155 GB by the closed form) and costs more: run `-k "not 2026"` and `-k 2026` there.
    # The smoke profile compiles with aot_eager (dynamo + AOTAutograd, no code generation) to stay fast.
    "torch_compile_model": {
        "full": CompileModelGrid(sizes=_sizes(*(("2025", s) for s in MODEL_SIZES), ("2026", "10B")),
                                 contexts=(128, 256, 512, 1024), modes=(F, FB, TRAIN),
                                 dtype="fp32", batch=4, compile="regional", dynamic_seq=True, backend="inductor",
                                 warmup=1, rounds_min=5, rounds_max=10, row_s=0.6, budget_s=470),
        "smoke": CompileModelGrid(sizes=_sizes(("2025", "tiny"), ("2026", "tiny")), contexts=(32, 64), modes=(F, FB, TRAIN),
                                  dtype="fp32", batch=2, compile="regional", dynamic_seq=True, backend="aot_eager",
                                  warmup=1, rounds_min=5, rounds_max=10, row_s=0.05, budget_s=80),
    },
}

# Closed-form models (impl.accounting): cheap, so both profiles compute the same tables; each row
# times the computation of its table (microseconds: the harness asks >= 10 rounds).
# bucket_o_s / bucket_w_Bps are PLACEHOLDER inputs, not measurements, for the bucket-model example;
# the distributed section substitutes the values fitted to its all-reduce timings.
_COMM_ACCOUNTING = CommAccountingGrid(fsdp_tokens=(0, 512, 1024, 2048, 4096, 8192), bucket_model_size="xl",
                                      bucket_sizes_mb=(1, 10, 100, 1000), bucket_o_s=50e-6, bucket_w_Bps=50e9,
                                      world_sizes=(2, 4, 8), warmup=1, rounds=10)
_MEMORY_ACCOUNTING = MemoryAccountingGrid(sizes=tuple(MODEL_SIZES), batch=4, contexts=(128, 256, 512), world_size=2,
                                          warmup=1, rounds=10)
GRIDS["communication_accounting"] = {"full": _COMM_ACCOUNTING, "smoke": _COMM_ACCOUNTING}
GRIDS["memory_accounting"] = {"full": _MEMORY_ACCOUNTING, "smoke": _MEMORY_ACCOUNTING}
# 1.2-1.3 attention (issue 3).
GRIDS.update({
    # pytorch_attention: naive attention, batch 8, no heads, fp32, non-causal; 100 timed forward passes
    # and 100 timed backward passes per (d, seq) (the assignment's count; the smoke profile's 5 become 10,
    # the harness's floor for short rounds).
    "pytorch_attention": {
        "full": AttentionGrid(batch=8, dims=(16, 32, 64, 128), seqs=(256, 1024, 4096, 8192, 16384), dtype="fp32",
                              warmup=5, rounds=100, budget_s=150),
        "smoke": AttentionGrid(batch=2, dims=(16, 32), seqs=(32, 64), dtype="fp32", warmup=1, rounds=5, budget_s=60),
    },
    # torch_compile (a): the pytorch_attention grid, compiled vs eager, both in the same run. The CPU
    # smoke compiles with aot_eager (dynamo + AOTAutograd, no C++ code generation) to stay fast. H100:
    # the first run did 27 compiled rows (d 16, 32 and 7 of d 64) in its 60 s budget; with the eager
    # rows and the long sequences, the whole grid should take ~4-5 min; budget_s leaves cells past it
    # out whole (checked at a cell's first row), within gpu_run.sh's 540 s section timeout.
    "torch_compile_attention": {
        "full": CompiledAttentionGrid(batch=8, dims=(16, 32, 64, 128), seqs=(256, 1024, 4096, 8192, 16384),
                                      dtype="fp32", warmup=5, rounds=100, backend="inductor", budget_s=420),
        "smoke": CompiledAttentionGrid(batch=2, dims=(16,), seqs=(32,), dtype="fp32", warmup=1, rounds=5,
                                       backend="aot_eager", budget_s=60),
    },
    # flash_benchmarking: kernel rows (CUDA-event timer, rounds of >= 1 ms; do_bench_ms as a cross-check),
    # batch 1, causal. Autotuning every kernel for every (seq, d, dtype) is most of the cost; a row then
    # takes `warmup` calls, `rounds` rounds (>= 10 where a round is under 20 ms) and do_bench's warmup_ms +
    # rep_ms. Every cell of the grid runs (issue 45): naive up to the longest sequence (naive_max_seq =
    # the grid's longest: its derived backward peak at 65536 is 36 GiB in bf16, 68 GiB in fp32, so it runs
    # or is an OOM row), the compiled backward (one static-shape torch.compile per shape) at every d;
    # the SDPA anchors reject fp32 (recorded unsupported). budget_s is per pytest process.
    # The whole grid does not fit one 540 s command: H100 estimate from the committed runs
    # (reports/data/h100-80gb-x1/flash_benchmarking: 20261123T230756Z, bf16, current kernels, 471 rows in
    # its 330 s budget: flash_triton's first calls (autotuning) 218 s, ~0.2 s a row besides;
    # 20261123T073042Z, fp32 flash_triton: 177 s of first calls; 20261123T090719Z/093026Z, compiled
    # backward at d 64: ~2.5 s of compilation a shape, its 65536 rows ~1 s) it takes ~1000 s, so the GPU
    # runs it as four `-k` pieces at one commit (the report keeps each cell's newest row, so the four
    # JSONs make the whole grid of one kernel version):
    #   "bf16 and not compiled_bwd"  ~330 s (480 rows: the 20261123T230756Z run did these 468 + 3 compiled rows
    #                                 in its 330 s budget: 218 s autotuning, ~0.2 s a row besides; + start-up)
    #   "fp32 and not compiled_bwd"  ~290 s (480 rows: ~180 s autotuning + ~90 s + start-up)
    #   "bf16 and compiled_bwd"      ~210 s (80 rows: 40 compiles × ~2.5 s, the Triton forward's autotuning
    #                                 ~1 s a shape, ~15 s of rows, start-up)
    #   "fp32 and compiled_bwd"      ~210 s
    # the two compiled_bwd pieces fit one device command together (~430 s). budget_s 480 per piece
    # (checked before each row; the longest row, an autotuned d 128 backward at 65536, ~10 s).
    # impls run in the listed order within a dtype (the assignment's two first).
    "flash_benchmarking": {
        "full": FlashGrid(batch=1, seqs=tuple(2 ** i for i in range(7, 17)), dims=(16, 32, 64, 128),
                          dtypes=("bf16", "fp32"), modes=("fwd", "bwd", "fwd_bwd"),
                          impls=("flash_triton", "naive", "sdpa_flash", "sdpa_cudnn", "flash_triton_compiled_bwd"),
                          naive_max_seq=65536, compiled_bwd_dims=(16, 32, 64, 128), autotune=True,
                          warmup=2, rounds=5, warmup_ms=5, rep_ms=25, budget_s=480),
        "smoke": FlashGrid(batch=1, seqs=(16, 32), dims=(16,), dtypes=("fp32",), modes=("fwd", "bwd", "fwd_bwd"),
                           impls=("flash_triton", "naive", "sdpa_flash", "sdpa_cudnn", "flash_triton_compiled_bwd"),
                           naive_max_seq=16, compiled_bwd_dims=(16,), autotune=True,
                           warmup=1, rounds=5, warmup_ms=10, rep_ms=40, budget_s=90),
    },
    # leaderboard: torch.compile(FlashAttentionTriton.apply), bf16 causal 1 x 16 heads x 16384 x 64, with
    # SDPA anchors; tolerances are relative errors against an fp32 SDPA reference (fp64 on the CPU).
    "leaderboard": {
        "full": LeaderboardGrid(batch=1, heads=16, seq=16384, d=64, dtype="bf16", compile=True, warmup=3, rounds=30,
                                tol=Tolerance(out=1e-2, grad=2e-2)),
        "smoke": LeaderboardGrid(batch=1, heads=2, seq=32, d=16, dtype="fp32", compile=False, warmup=1, rounds=10,
                                 tol=Tolerance(out=1e-4, grad=1e-4)),
    },
    # flash_shapes (issue 24): ours (eager, through the kernel table: flash_auto, and torch.compile'd) beside
    # SDPA cuDNN and SDPA flash on model shapes, kernel rows. batch 4 × 32 heads up to seq 4096 (3000: not a
    # tile multiple), 4 × 16 at 16384 (bf16, d 128: 0.27 GB per tensor, ~3 GB with the fp32 reference). Configs
    # run d-major in the listed order (128 and 80 first, causal before not), impls in the listed order within
    # a config, so a budget cut falls on d 64, non-causal, and within a config on the anchors and the
    # compiled row before flash_auto (second, after flash_triton, whose first call pays the autotuning).
    # H100, measured: the whole 4-impl grid in one process ran past budget_s 330 (187 of 288 rows past it at a
    # cold Triton cache, NOTES.md); split by head dim (`flash_shapes:d128`, 96 rows) it took 360 s of device
    # time warm. flash_auto adds a fifth of the rows (Gluon kernels take a fixed table config, no autotuning;
    # ~5-10 s of Gluon compilation per (d, causal, pass)): ~120 rows and ~7-8 min per head dim, past the
    # budget, so the lead runs pieces by head dim and causal (`flash_shapes:d128 and causal`, 60 rows,
    # ~4 min). tol: relative errors against SDPA in fp32 (fp64 on the CPU).
    "flash_shapes": {
        "full": FlashShapesGrid(dims=(128, 80, 64), causal=(True, False),
                                shapes=((4, 32, 512), (4, 32, 1024), (4, 32, 2048), (4, 32, 3000), (4, 32, 4096),
                                        (4, 16, 16384)),
                                modes=("fwd", "fwd_bwd"), impls=("flash_triton", "flash_auto", "flash_triton_compiled",
                                                                 "sdpa_cudnn", "sdpa_flash"),
                                dtype="bf16", compile=True, warmup=2, rounds=5, warmup_ms=5, rep_ms=25, budget_s=330,
                                tol=Tolerance(out=1e-2, grad=2e-2),
                                # the host-cost row (issue 36): host time per fwd+bwd call at a tiny shape
                                # (impl.bench.timers.HostTimer), ours (eager, flash_auto, compiled) beside both
                                # SDPA backends
                                host=HostCost(shape=(1, 1, 128), d=64, causal=True, dtype="bf16", warmup=20,
                                              rounds=200)),
        "smoke": FlashShapesGrid(dims=(16, 20), causal=(True, False), shapes=((1, 2, 32), (1, 2, 24)),
                                 modes=("fwd", "fwd_bwd"), impls=("flash_triton", "flash_auto", "flash_triton_compiled",
                                                                  "sdpa_cudnn", "sdpa_flash"),
                                 dtype="fp32", compile=False, warmup=1, rounds=5, warmup_ms=10, rep_ms=40, budget_s=100,
                                 tol=Tolerance(out=1e-4, grad=1e-4),
                                 host=HostCost(shape=(1, 1, 32), d=16, causal=True, dtype="fp32", warmup=1, rounds=5)),
    },
})
# 2-3 distributed (issues 5, 6). MB = 2**20 bytes (as DDPBucketed's bucket_size_mb). budget_s is per
# perf file, counted from its first test; the three files together must end within 9 minutes on
# the 2-GPU machine. `runs` lists (backend, processes); NCCL runs beyond the machine's GPU count
# are recorded as not run; NCCL runs first so a budget cut falls on the slow gloo 6-process runs.
# `inner_bytes`: each timed command repeats the all-reduce until about this many bytes went
# through (at least once, at most max_inner times), so the IPC round trip is small against it.
_DDP_TRACED = ((DDPVariant.NAIVE, None), (DDPVariant.INDIVIDUAL, None))  # (variant, bucket MB)
GRIDS.update({
    "distributed_communication_single_node": {
        "full": CommunicationGrid(sizes_mb=(1, 10, 100, 1000),
                                  runs=(("nccl", 2), ("nccl", 4), ("nccl", 6), ("gloo", 2), ("gloo", 4), ("gloo", 6)),
                                  warmup=2, rounds=10, budget_s=120, timeout_s=300),
        "smoke": CommunicationGrid(sizes_mb=(1, 10), runs=(("gloo", 2), ("nccl", 2)), warmup=1, rounds=10,
                                   budget_s=60, timeout_s=120,
                                   left_out="smoke profile: 100 MB and 1 GB, gloo at 4 and 6 processes"),
    },
    # naive / flat / individual / bucketed DDP, torch DDP (default bucket_cap_mb 25) and the
    # single-GPU floor (rank 0, no wrapper) at the same per-rank batch, for each [edition, size] of
    # `sizes` (the 2025 questions ask the 2025 xl, the 2026 ones the 2026 xl = 2.7B (2025); `-k 2026`
    # selects the latter's rows). (context, per-rank batch): batch 2 at 128 leaves compute short
    # against the gradient all-reduce (8 GB for xl (2025), 13.6 GB for xl (2026): communication
    # bound); batch 4 at 512 is 8x the tokens (compute bound). The bucket sweep is a 2025 question
    # only (`bucketed_editions`). The trace of ddp_overlap_individual_parameters_benchmarking (b):
    # naive against per-parameter overlapped. H200 estimate for `-k 2026` (xl (2026): ~1.3 s a step
    # at 512 x 4, ~0.4 s at 128 x 2; ~10 rows of setup + 7 steps, 2 traces): ~3-4 min; per rank at
    # most ~120 GB (flat: a flat gradient copy on top of ~90 GB), so H200s, not H100s.
    "ddp_benchmarking": {
        "full": DDPGrid(sizes=_sizes(("2025", "xl"), ("2026", "xl")), world_size=2, configs=((128, 2), (512, 4)),
                        bucket_mb=(1, 10, 100, 1000), bucketed_editions=("2025",), variants=tuple(DDPVariant),
                        warmup=2, rounds=5, trace=DDPTrace(context=128, variants=_DDP_TRACED, warmup=1, steps=2,
                                                           max_intervals=1500),
                        budget_s=300, timeout_s=300),
        "smoke": DDPGrid(sizes=_sizes(("2025", "tiny"), ("2026", "tiny")), world_size=2, configs=((32, 2), (64, 2)),
                         bucket_mb=(1, 10, 100, 1000), bucketed_editions=("2025",), variants=tuple(DDPVariant),
                         warmup=1, rounds=10, trace=DDPTrace(context=32, variants=_DDP_TRACED, warmup=1, steps=2,
                                                            max_intervals=1500),
                         budget_s=240, timeout_s=120),
    },
    # none = our DDP (per-parameter overlap) + AdamW; sharded = ShardedOptimizer(AdamW);
    # zero1 = ZeRO1Optimizer(AdamW) behind a DDP that does not reduce; torch_zero =
    # ZeroRedundancyOptimizer(torch.optim.AdamW). A fresh model per config, per [edition, size].
    # H200 estimate for `-k 2026` (xl (2026)): 4 configs x (~10 s build + 7 steps of ~1.3 s): ~2 min.
    "optimizer_state_sharding_accounting": {
        "full": ShardingGrid(sizes=_sizes(("2025", "xl"), ("2026", "xl")), world_size=2, context=512, batch=4,
                             variants=tuple(ShardVariant), warmup=1, rounds=5, budget_s=240, timeout_s=300),
        "smoke": ShardingGrid(sizes=_sizes(("2025", "tiny"), ("2026", "tiny")), world_size=2, context=32, batch=2,
                              variants=tuple(ShardVariant), warmup=1, rounds=10, budget_s=120, timeout_s=120),
    },
})
# fsdp (beyond the assignment): our FSDP in fp32 and with bf16 compute (per-weight units, and
# fsdp_block_bf16: one unit per TransformerBlock, fully_shard's layout), next to our DDP
# (DDPBucketed, 100 MB buckets) and torch.distributed.fsdp.fully_shard (fp32 / bf16 params) in the
# same run; a fresh model per variant. Peak memory per rank vs impl.accounting ZeRO-3 / DDP.
# Our FSDP rows add one instrumented step (collective timeline) after the timed ones; timeline_rows
# caps rank 0's rows in the JSON (xl has ~1,000: 338 forward and 337 backward all-gathers, 338
# reduce-scatters, one all-reduce). budget_s is checked before each variant, which takes well under a
# minute at xl, so the file ends inside gpu_run.sh's 540 s section timeout.
# Run order: FSDPVariant's (the target's pair first).
# Per [edition, size] of `sizes` (fsdp and fsdp_accounting are 2026 questions on xl (2026); the 2025
# xl rows are kept as history). H200 estimate for `-k 2026`: 6 variants x (~10 s build + 7 steps of
# ~1-1.5 s + the timeline step): ~2.5-3 min.
# Tensor parallelism (impl.distributed.TensorParallel, fp32) on the same model and global batch, at 2
# and 4 ranks (4 needs the 4-GPU machine: `-k tensor_parallel` there), the 2026 xl only (a 2026-edition
# extension; the 2025 rows are history). H200 estimate: ~1.1 s a step at 2 ranks (each rank does half of
# every block's work on the whole batch: the DDP floor's FLOPs) + ~20 s build and probes: ~40 s a row.
GRIDS["fsdp"] = {
    "full": FSDPGrid(sizes=_sizes(("2025", "xl"), ("2026", "xl")), world_size=2, context=512, batch=4,
                     variants=tuple(FSDPVariant), warmup=2, rounds=5, timeline_rows=1500, budget_s=360, timeout_s=300,
                     tp_world_sizes=(2, 4)),
    "smoke": FSDPGrid(sizes=_sizes(("2025", "tiny"), ("2026", "tiny")), world_size=2, context=32, batch=2,
                      variants=tuple(FSDPVariant), warmup=1, rounds=10, timeline_rows=1500, budget_s=150,
                      timeout_s=120, tp_world_sizes=(2,), tp_probe_reps=3),
}

# per_rank_memory (issue 37, beyond): do the per-rank states of the 2026 distributed questions' xl fit
# one GPU at world size 2? Closed form (impl.accounting.memory_breakdown) per variant's ZeRO stage
# (`stages`), with the per-rank batch's activations; measured on one GPU for the replicated rank
# (DDP: fp32 weights, gradients and AdamW state whole, ~54 GB, plus the step): a full training step
# at the per-rank batch and context. H100 estimate: ~20 s build, ~7 steps of ~1.5 s: under 1 min.
GRIDS["per_rank_memory"] = {
    "full": PerRankMemoryGrid(size=SizeRef("2026", "xl"), world_size=2, context=512, batch=4,
                              stages=dict(ddp=0, sharded_optimizer=1, fsdp=3), warmup=1, rounds=5),
    "smoke": PerRankMemoryGrid(size=SizeRef("2026", "tiny"), world_size=2, context=32, batch=2,
                               stages=dict(ddp=0, sharded_optimizer=1, fsdp=3), warmup=1, rounds=5),
}

# gradient_checkpointing (issue 7, beyond): policies × dtypes on one shape, then nested vs none over
# depths of xl width. The every_k values are not listed: the perf test derives the best k and its
# neighbours from impl.accounting at this shape. One H100, forward+backward steps.
# edition_2026: (b) of the 2026 handout, xl (2026) at batch 4 × 2048 in fp32 (the memory section's
# setting, "as above"), single-level only: the best block size k by the closed form and the next
# smaller and larger (k ± 1 within 1..L) and the textbook round(sqrt(L)), then no checkpointing
# (expected OOM: ~150 GB of activations, recorded with its predicted need). The best k there is 1 (a
# block saves ~4.7 GB, a boundary 84 MB), so there is no smaller one. H100 estimate: ~5 s a step
# (fp32, one recomputed forward), 6 steps a row, 3 rows: ~2 min.
GRIDS["gradient_checkpointing"] = {
    "full": CheckpointingGrid(size="xl", batch=4, context=2048, dtypes=("bf16", "fp32"), warmup=1, rounds=5,
                              depth=CheckpointDepth(width="xl", layers=(8, 16, 32, 48), batch=1, context=2048,
                                                    dtype="bf16", policies=("none", "nested")),
                              edition_2026=CheckpointCase2026(edition="2026", size="xl", batch=4, context=2048,
                                                              dtype="fp32"),
                              budget_s=480),
    "smoke": CheckpointingGrid(size="tiny", batch=2, context=32, dtypes=("bf16", "fp32"), warmup=1, rounds=5,
                               depth=CheckpointDepth(width="tiny", layers=(2, 4, 8), batch=2, context=32, dtype="fp32",
                                                     policies=("none", "nested")),
                               edition_2026=CheckpointCase2026(edition="2026", size="tiny", batch=2, context=32,
                                                               dtype="fp32"),
                               budget_s=120),
}

# training_step (issue 8, beyond): the full training step (forward, backward, AdamW) under each
# speed-up alone on top of bf16 autocast (+bf16_weights: bf16 Linear weights, fp32 masters in the
# optimizer), all of them ("fast"; "fast+cudagraphs" replays its compiled graphs as CUDA graphs),
# and PyTorch's own pieces ("anchor"); named configs in impl.workloads.steps. Compilation happens
# in a row's first step (timed apart: the first_call_s metric), before the warm-up; the compiled graphs of
# one size serve both of its contexts (sequence dimension dynamic), so each whole-model compile
# (fast, fast+cudagraphs, anchor) is paid once per size: 2-4 min each on the H100 (xl's are the
# longest), more than one 10-minute command holds with the rest. Run the file as several `-k`
# commands (README, "Running on a GPU machine"); the report merges their JSONs. One fresh model
# per row. Configs run in this order within each (size, context), so a budget cut falls on the
# single speed-ups (the newest, +bf16_weights, first among them) and fp32, not on the bf16
# baseline or the whole-model configs; the `profiled` ones also get one profiled step after their
# timed ones (`prof_warmup` unrecorded steps first; the `top_kernels` longest kernels kept). The
# CPU smoke swaps FlashAttention's Triton kernels (interpreter: minutes per step) for its PyTorch
# twin flash_torch, and compiles with aot_eager (dynamo + AOTAutograd, no C++ code generation:
# seconds, not a minute per graph; no CUDA graphs); two contexts, so the reuse of the graphs is
# exercised.
_TRAINING_CONFIGS = ("bf16", "fast", "anchor", "fast+cudagraphs", "+bf16_weights", "+flash", "+compile",
                     "+fused_adamw", "+fused_ce", "fp32")
_TRAINING_PROFILED = ("bf16", "fast", "anchor", "fast+cudagraphs")
GRIDS["training_step"] = {
    "full": TrainingStepGrid(sizes=("xl", "2.7B"), contexts=(512, 1024), configs=_TRAINING_CONFIGS, batch=4, warmup=3,
                             rounds=5, flash_impl="flash_triton", compile_backend="inductor", profiled=_TRAINING_PROFILED,
                             prof_warmup=1, top_kernels=8, budget_s=420),
    "smoke": TrainingStepGrid(sizes=("tiny",), contexts=(32, 64), configs=_TRAINING_CONFIGS, batch=2, warmup=1,
                              rounds=5, flash_impl="flash_torch", compile_backend="aot_eager",
                              profiled=_TRAINING_PROFILED, prof_warmup=1, top_kernels=8, budget_s=240),
}

# The 2026 edition's parallelism calculations (perf/test_parallelism_calcs.py): the collectives and
# sharded FFNs each formula prices, run over gloo ranks with impl.distributed.ring's send/recv rings
# (both profiles: the rings are the point, not the GPU). numel: fp16 values of a collective's payload
# S (divisible by 12, so every N in world_sizes splits it); ffn: the FFN of data_parallel_calcs …
# fsdp_tp_calcs (D, D_FF, B tokens); mesh: (N_TP, N_FSDP) of fsdp_tp_calcs.
GRIDS["parallelism_calcs"] = {
    "full": ParallelismGrid(world_sizes=(2, 3, 4), numels=(12 * 2**14, 12 * 2**18),
                            ffn=FFNShape(d_model=512, d_ff=2048, tokens=1024), mesh=(2, 2), warmup=2, rounds=10,
                            budget_s=300, timeout_s=300),
    "smoke": ParallelismGrid(world_sizes=(2, 4), numels=(12 * 2**12,), ffn=FFNShape(d_model=64, d_ff=256, tokens=64),
                             mesh=(2, 2), warmup=1, rounds=10, budget_s=60, timeout_s=120),
}


def grid(problem: str, profile: str):
    """The typed grid (impl.workloads.grids) of `problem` in `profile`."""
    try:
        return GRIDS[problem][profile]
    except KeyError:
        raise ValueError(f"no sweep grid for problem {problem!r} in profile {profile!r}") from None

# leaderboard (2026) (issue 27): the 8B training step (impl.workloads.leaderboard_2026) with fewer layers on
# one GPU at one rank's share of the two-GPU batch (1 × 32,768 tokens), from which
# impl.leaderboard_prediction predicts the 34-layer step on two GPUs (time and peak memory linear in
# the layers). Checkpointed rows first (each block keeps its input; the prediction reads them: 34
# plain layers would not fit), then plain ones while they fit (an OOM is a row). H100 estimate: ~0.2 s
# per layer + ~0.3 s for the LM head and optimizer per step, 8 steps a row (first, warm-up, rounds):
# ~60 s of steps, ~1 min of FlashAttention autotuning at (32 heads, 32,768, d 128) and start-up: ~2-3
# min; budget_s cuts the rest. The CPU smoke runs the tiny config with flash_torch (the interpreter's
# Triton kernels take minutes a step) at a short context.
# The two-GPU step itself (`-k two_gpus`; issue 43): the whole 8B model, batch 2 x 32,768 over 2 ranks
# (DDP with sharded optimizer states, impl.workloads.leaderboard_2026), one row per checkpointing
# candidate: every block recomputed (every_k 1), then every block keeping its attention's o and lse
# (keep_attention, the last k blocks plain: each plain block ~8.4 GB more of the 141 GB, ~25 ms less
# recompute; k 0 peaked at 114.5 GB; k 3 is predicted at ~140 GB, so k 2 follows it as the
# fallback). 2xH200: ~10 s to build, ~55 s first call in a fresh process
# (FlashAttention autotuning at 32 heads x 32,768 x d 128), ~16 steps of ~7 s (do_bench, rounds, one
# profiled step): ~2.5 min a candidate.
_LB26_POLICIES = (("every_k", 1), ("none", None))
# keep_attention 3 with compile "pointwise" (its RMSNorms, RoPE and SwiGLUs compiled, attention and the
# checkpointing eager): the 1.24 s of elementwise kernels in keep_attention 3's profiled step, fused;
# + ~30-60 s of first call (Inductor compiles three small graphs, forward and backward).
# and the same with issue 47 stage 2's warp-specialized Gluon forward (attn_impl flash_gluon_ws: the Triton
# backward fed its o and lse): 18.5 -> ~14.8 ms a layer forward on an H200 (the probe), ~0.13 s a step;
# and with stage 3's Gluon backward too (flash_gluon: dK/dV in Gluon, dQ from the Triton dQ kernel at d 128):
# ~64.8 -> ~51 ms a layer backward by the H100 probe's ratio, ~0.47 s a step more. It runs first of the
# pointwise candidates (`-k "two_gpus and pointwise"`), the best predicted, so a budget stop cuts the others.
# Measured (2xH200, 2026-11-26, leaderboard_2026/20261126T120418Z_8876506.json.gz): 6.136 s do_bench, peak
# 115.6 GiB a rank: room for more plain blocks (~8.4 GB each, ~25 ms of recompute saved each): k 5 (~131
# GiB predicted) and k 4 after it (`-k "two_gpus and flash_gluon and not ws"`; an OOM is a row). Its forward's
# host range (1.50 s) outlasts its kernels (1.18 s): k 5 with expandable segments, second, tests whether
# the allocator's cudaMalloc/cudaFree is what the host waits for (the breakdown's blocking_runtime_ms says).
# k 5 with expandable segments measured 6.12 s (leaderboard_2026/20261126T143432Z_a4ea09d.json.gz), its 171 bf16
# all-reduces' kernels resident 6.7 ms each where the transfer needs ~0.3 ms, attention backward ~20% slower
# beside them: the same step with NCCL on a high-priority stream, then with NCCL capped at 8 CTAs (SMs; 24 by
# default here) a collective (`-k "two_gpus and expandable_segments"` runs the three; NOTES "eighteenth session").
# ZeRO-2 (`-k reduce_to_owner`; NOTES.md "The 8B step: gradients reduced to their owner"): the best measured
# candidate with each gradient reduced to its owner only (half the bytes; no bucket kept across steps:
# ~16 GiB a rank less), then two more plain blocks in that room, on the default allocator.
_LB26_ZERO2 = (StepCandidate("keep_attention", 5, "pointwise", "flash_gluon", "expandable_segments", "reduce_to_owner"),
               StepCandidate("keep_attention", 7, "pointwise", "flash_gluon", grad_sync="reduce_to_owner"),
               # the two that helped (99ae8fa): NCCL's stream at high priority (6.06 against 6.16 s) and ZeRO-2's
               # 16 GiB spent on more plain blocks (k 7: 6.08 s at 117 GiB), together (`-k "reduce_to_owner and nccl_high_priority"`)
               *(StepCandidate("keep_attention", k, "pointwise", "flash_gluon", "expandable_segments",
                               "reduce_to_owner", nccl_high_priority=True) for k in (8, 10)),
               # the winner (k 10: 5.85 s) with a bf16 residual stream (the embedding bf16 through its master):
               # its 242 fp32 adds a step (220 ms) at half the bytes, no autocast casts of fp32 norm outputs,
               # checkpointed blocks' saved inputs halved (room for two more plain blocks) (`-k residual_bf16`)
               # measured (a2220d2): k 10 5.607 s at 112.7 GiB, k 12 5.561 s at 120.3 GiB: each two plain blocks
               # ~7.5 GiB more and ~46 ms less; k 14 (~128 GiB) and k 16 (~135 GiB, an OOM is a row) follow
               *(StepCandidate("keep_attention", k, "pointwise", "flash_gluon", "expandable_segments",
                               "reduce_to_owner", nccl_high_priority=True, residual="bf16") for k in (10, 12, 14, 16)),
               # the fused LM head took 414 ms of k 12's step (its floor ~190): at the default 256 MiB of fp32 logits a
               # chunk it runs 75 chunks, each adding its bf16 weight-gradient product into the fp32 sum (~7.4 GB of
               # traffic a chunk, ~120 ms a step); 1 and 2 GiB chunks do that 19 and 10 times (`-k lm_head_chunk`)
               *(StepCandidate("keep_attention", 12, "pointwise", "flash_gluon", "expandable_segments",
                               "reduce_to_owner", nccl_high_priority=True, residual="bf16", lm_head_chunk_mib=mib)
                 for mib in (1024, 2048)),
               # and its softmax step in one Triton kernel (impl.model.ce_softmax): the chunk's ~2.3 GB of fp32 passes
               # become ~0.4 GB of bf16 reads and writes (~30 ms a step), and no fp32 chunk is allocated
               StepCandidate("keep_attention", 12, "pointwise", "flash_gluon", "expandable_segments", "reduce_to_owner",
                             nccl_high_priority=True, residual="bf16", lm_head_chunk_mib=1024, lm_head_softmax="triton"),
               # the same with the attention backward's dQ added by atomics (issue 47 stage 3e, one pass: 5 products
               # against the default's dK/dV + Triton dQ split, 7): attention backward was 2,056 ms of the step
               StepCandidate("keep_attention", 12, "pointwise", "flash_gluon_atomic", "expandable_segments",
                             "reduce_to_owner", nccl_high_priority=True, residual="bf16", lm_head_chunk_mib=1024,
                             lm_head_softmax="triton"),
               # measured (2785450): 1 GiB 5.476 s, 2 GiB 5.455, 1 GiB + Triton softmax 5.412 at 120.4 GiB (k 12's
               # peak): the LM-head gain and the plain blocks' gain together (`-k "lm_head_triton and not
               # keep_attention-12"`): k 14 and k 16 at 1 GiB, then k 14 at 2 GiB (no fp32 chunk with the kernel)
               *(StepCandidate("keep_attention", k, "pointwise", "flash_gluon", "expandable_segments", "reduce_to_owner",
                               nccl_high_priority=True, residual="bf16", lm_head_chunk_mib=mib, lm_head_softmax="triton")
                 for k, mib in ((14, 1024), (16, 1024), (14, 2048))),
               # measured (67a1e16): k 14 at 2 GiB 5.40 s, attention backward 2,081 ms of it (the split, flash_gluon's
               # fixed default). The same with flash_auto: each attention half the kernel table's choice, at d 128
               # bf16 since 776033e the ws backward (0.80-0.85x the split at 1x32x32768x128 on an H100; NOTES
               # "Twenty-fourth session, continued": 5.05 s (4.95-5.20) predicted) (`-k flash_auto`)
               StepCandidate("keep_attention", 14, "pointwise", "flash_auto", "expandable_segments", "reduce_to_owner",
                             nccl_high_priority=True, residual="bf16", lm_head_chunk_mib=2048,
                             lm_head_softmax="triton"))
_LB26_CANDIDATES = (StepCandidate("every_k", 1), StepCandidate("keep_attention", 0), StepCandidate("keep_attention", 3),
                    StepCandidate("keep_attention", 2), StepCandidate("keep_attention", 5, "pointwise", "flash_gluon"),
                    StepCandidate("keep_attention", 5, "pointwise", "flash_gluon", "expandable_segments"),
                    StepCandidate("keep_attention", 5, "pointwise", "flash_gluon", "expandable_segments",
                                  nccl_high_priority=True),
                    StepCandidate("keep_attention", 5, "pointwise", "flash_gluon", "expandable_segments",
                                  nccl_max_ctas=8),
                    StepCandidate("keep_attention", 4, "pointwise", "flash_gluon"),
                    StepCandidate("keep_attention", 3, "pointwise", "flash_gluon"),
                    StepCandidate("keep_attention", 3, "pointwise"),
                    StepCandidate("keep_attention", 3, "pointwise", "flash_gluon_ws"),
                    *_LB26_ZERO2)
GRIDS["leaderboard_2026"] = {
    "full": Leaderboard2026Grid(config="8B", layers=(1, 2, 4, 8), batch=1, context=32_768, policies=_LB26_POLICIES,
                                attn_impl="flash_triton", warmup=2, rounds=5, budget_s=240,
                                two_gpus=LeaderboardTwoGPUGrid(config="8B", num_layers=None, batch=2, context=32_768,
                                                               world_size=2, candidates=_LB26_CANDIDATES,
                                                               attn_impl="flash_triton", warmup=1, rounds=5,
                                                               budget_s=540, timeout_s=600)),
    "smoke": Leaderboard2026Grid(config="tiny", layers=(1, 2), batch=1, context=32, policies=_LB26_POLICIES,
                                 attn_impl="flash_torch", warmup=1, rounds=5, budget_s=60,
                                 two_gpus=LeaderboardTwoGPUGrid(config="tiny", num_layers=None, batch=2, context=32,
                                                                world_size=2, candidates=(StepCandidate("every_k", 1),
                                                                                          StepCandidate("keep_attention", 0),
                                                                                          StepCandidate("keep_attention", 1),
                                                                                          StepCandidate("keep_attention", 1,
                                                                                                        "pointwise"),
                                                                                          StepCandidate("keep_attention", 1,
                                                                                                        "pointwise",
                                                                                                        grad_sync="reduce_to_owner"),
                                                                                          # NCCL's options: an unsupported row on gloo
                                                                                          StepCandidate("keep_attention", 1,
                                                                                                        nccl_high_priority=True,
                                                                                                        nccl_max_ctas=8)),
                                                                attn_impl="flash_torch", warmup=1, rounds=5,
                                                                budget_s=120, timeout_s=120)),
}


# flash_benchmarking's full grid as the `-k` pieces the GPU runs (one 540 s section each; the estimates
# beside the grid above). Together they select every case exactly once (correctness/test_flash_benchmarking_grid.py).
FLASH_BENCHMARKING_PIECES = ("bf16 and not compiled_bwd", "fp32 and not compiled_bwd", "bf16 and compiled_bwd",
                             "fp32 and compiled_bwd")
