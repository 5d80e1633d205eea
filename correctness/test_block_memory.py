"""memory_profiling (f): the block probe (impl.workloads.block_memory) on a small TransformerLM. On the
CPU its meter is the ledger's live bytes, which counts exactly what autograd keeps, so the
closed form (impl.accounting) and 4 bytes x the block's parameters must come out to the byte."""
import pytest
import torch

from impl import accounting as acc
from impl.workloads.block_memory import (INPUT, BlockProbe, ProbeRecord, Saved, block_memory_facts,
                                     probe_block_memory)
from impl.model import TransformerLM
from impl.model.sizes import ModelConfig

CFG = ModelConfig(d_model=128, d_ff=512, num_layers=3, num_heads=4, vocab_size=256)  # every tensor a multiple of 512 B


def _model_and_batch(device="cpu", batch=2, seq=32):
    torch.manual_seed(0)
    model = TransformerLM(**CFG, context_length=seq, device=device)
    g = torch.Generator().manual_seed(1)
    tok = torch.randint(0, CFG.vocab_size, (batch, seq + 1), generator=g).to(device)
    return model, tok[:, :-1], tok[:, 1:]


def _block_params(model):
    return sum(p.numel() for p in model.layers[0].parameters())


def test_probe_matches_closed_form_and_parameter_count():
    model, x, y = _model_and_batch()
    f = probe_block_memory(model, x, y, "fp32", top=5)
    terms = acc.checkpoint_terms(2, 32, CFG.d_model, CFG.d_ff, CFG.num_heads, CFG.vocab_size)
    assert f.saved_bytes == terms["a_block"]
    assert abs(sum(o.share for o in f.ops) - 1) < 1e-12
    assert len(f.top) == 5 and f.top == f.ops[:5]
    assert [o.nbytes for o in f.ops] == sorted((o.nbytes for o in f.ops), reverse=True)
    assert f.top_share == pytest.approx(sum(o.share for o in f.top))
    # every block keeps what it saved; its backward frees that and leaves its fp32 gradients
    assert f.forward_growth_bytes == [f.saved_bytes] * CFG.num_layers
    assert f.grad_bytes_expected == 4 * _block_params(model) == f.grad_bytes_measured
    assert all(c == f.grad_bytes_expected - f.saved_bytes for c in f.backward_change_bytes)
    ops = {(o.op, o.module) for o in f.ops}
    assert (INPUT, "") in ops and ("aten::mm", "ffn.w1") in ops  # the block's input, and named modules
    assert all(p.grad is None for p in model.parameters())  # left as a training step's zero_grad leaves them


def test_probe_under_bf16_autocast_keeps_fp32_gradients():
    model, x, y = _model_and_batch()
    f = probe_block_memory(model, x, y, "bf16")
    assert f.grad_bytes_measured == f.grad_bytes_expected == 4 * _block_params(model)
    assert any(o.op == "aten::_to_copy" for o in f.ops)  # autocast's bf16 weight copies are kept for backward


def test_probe_needs_a_meter_and_complete_boundaries():
    model, _, _ = _model_and_batch()
    with pytest.raises(ValueError, match="meter"):
        BlockProbe(model.layers)
    rec = ProbeRecord(num_blocks=2, saved=[Saved(1, "aten::mm", "ffn.w1", 8)], fwd_start={0: 0, 1: 0},
                      fwd_end={0: 8, 1: 8}, bwd_start={1: 8})
    with pytest.raises(ValueError, match="boundaries missing"):
        block_memory_facts(rec, 1, 4)
    rec.bwd_start[0], rec.bwd_end_block0 = 8, 8
    with pytest.raises(ValueError, match="saved nothing"):
        block_memory_facts(rec, 1, 4, block=0)
    assert block_memory_facts(rec, 1, 4, block=1).top[0].share == 1


def test_forward_only_marks_blocks_without_backward_hooks():
    model, x, _ = _model_and_batch()
    marks = []
    with torch.no_grad(), BlockProbe(model.layers, meter=lambda: 0, mark=marks.append) as p:
        model(x)
    assert marks == [f"block {k} forward" for k in range(CFG.num_layers)] and not p.record.bwd_start
    assert not any(b._forward_hooks or b._forward_pre_hooks for b in model.layers)  # hooks removed


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_probe_cuda_allocator_readings():
    model, x, y = _model_and_batch("cuda")
    f = probe_block_memory(model, x, y, "fp32")
    # the caching allocator rounds each block to 512 B; this config's weights are multiples of it
    assert f.grad_bytes_measured == f.grad_bytes_expected
    assert all(g >= f.saved_bytes for g in f.forward_growth_bytes)


def test_block_facts_do_not_depend_on_depth():
    # the perf rows probe a short stack of a size's blocks: its facts must be the whole model's
    def facts(layers):
        torch.manual_seed(0)
        model = TransformerLM(**CFG.replace(num_layers=layers), context_length=32)
        _, x, y = _model_and_batch()
        f = probe_block_memory(model, x, y, "fp32")
        return f.saved_bytes, f.ops, f.grad_bytes_measured, f.forward_growth_bytes[f.block]
    assert facts(3) == facts(5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_block_markers_reach_the_allocator_trace_in_forward_and_backward():
    # memory_profiling's timelines mark block boundaries with allocations made from the probe's
    # hooks; the backward ones run on autograd's device thread: their frames must still be recorded
    from impl.workloads.memory import MemoryRecorder, phased_step, timeline_data
    from impl.model import AdamW

    model, x, y = _model_and_batch("cuda")
    opt = AdamW(model.parameters(), lr=1e-4)
    dev = x.device
    with MemoryRecorder(dev) as rec, BlockProbe(model.layers, meter=lambda: torch.cuda.memory_allocated(dev),
                                                mark=rec.mark_block):
        phased_step(model, x, y, "fp32", "train_step", opt, rec.mark)
    t = timeline_data(rec.snapshot, rec.marks, block_marks=rec.block_marks)
    assert t["blocks_expected"] == 2 * CFG.num_layers + 1 == t["blocks_found"]
    assert t["markers_found"] == t["markers_expected"]
    xs = [b["x"] for b in t["blocks"]]
    assert xs == sorted(xs)
