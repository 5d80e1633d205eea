"""impl.workloads.attention's step and options on the CPU: attention_step's modes (the backward alone through
autograd, "bwd", gives fwd_bwd's gradients call after call) and flash_options (ours' FlashOptions as the perf files
and tools/probes/do_bench_vs_events.py run them)."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: ours runs through the interpreter

import pytest  # noqa: E402

from impl.attention import FlashAttentionTriton, FlashOptions, LaunchRecorder  # noqa: E402
from impl.workloads.attention import STEP_MODES, attention_inputs, attention_step, flash_options  # noqa: E402

CPU = torch.device("cpu")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # without a GPU ours runs in the interpreter


@pytest.mark.parametrize("impl", ["flash_triton", "flash_auto"])
def test_bwd_walks_the_saved_graph_again_with_fwd_bwds_gradients(impl):
    """"bwd" runs one forward when built and each call only the backward (retain_graph), the gradients reset
    first: two calls give fwd_bwd's gradients, not twice them."""
    options, forwards = flash_options(impl), []

    def attn(q, k, v):
        forwards.append(1)
        return FlashAttentionTriton.apply(q, k, v, True, options)
    q, k, v, do = attention_inputs((1, 2, 32, 16), "fp32", DEVICE)
    attention_step(attn, "fwd_bwd", q, k, v, do)()
    want = [t.grad.clone() for t in (q, k, v)]
    bwd = attention_step(attn, "bwd", q, k, v, do)
    assert len(forwards) == 2  # fwd_bwd's, then the one bwd keeps the graph of
    for _ in range(2):
        bwd()
    assert len(forwards) == 2
    for got, w in zip((q.grad, k.grad, v.grad), want):
        torch.testing.assert_close(got, w)


def test_attention_step_rejects_an_unknown_mode():
    q, k, v, do = attention_inputs((1, 1, 8, 8), "fp32", CPU)
    with pytest.raises(ValueError, match=r"mode 'fwd\+bwd' is none of"):
        attention_step(lambda *a: None, "fwd+bwd", q, k, v, do)
    assert STEP_MODES == ("fwd", "fwd_bwd", "bwd")


def test_flash_options_are_the_perf_files_and_differ_only_in_kernels():
    recorder = LaunchRecorder()
    triton, auto = flash_options("flash_triton", recorder), flash_options("flash_auto", recorder)
    assert triton == FlashOptions(backward="triton", autotune=True) and triton.recorder is recorder
    assert auto == FlashOptions(backward="triton", autotune=True, kernels="auto") and auto.recorder is recorder
    with pytest.raises(ValueError, match="impl 'sdpa_cudnn' is none of"):
        flash_options("sdpa_cudnn")
