"""``train.compile``: the encoder's training forward through ``torch.compile``, every batch padded to one of a few
fixed widths, gives the loss and gradients of the eager step (dropout off, so both sides draw nothing random), for
every method. Run on CPU, where torch's inductor compiles C++; on CUDA it compiles Triton kernels from the same
graph (and, under ``compile: auto``, replays them as CUDA graphs). ``compile: auto`` resolves per device and per
run length (the break-even; raysent.train.device). Not timed: `raysent bench --parts gpu` measures what it buys on
a GPU (docs/performance.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysent.config import parse_config
from raysent.errors import ConfigError
from raysent.train import loop
from raysent.train.device import (
    BREAK_EVEN_STEPS,
    COMPILE_SECONDS,
    COMPILED_STEPS_PER_SECOND,
    EAGER_STEPS_PER_SECOND,
    resolve,
)
from raysent.train.loop import Stepper, TrainHooks, _to_device, compile_widths, forward_backward
from raysent.train.run import build_method, prepare_data

from conftest import RAW_BERT

pytestmark = pytest.mark.shared

ROWS = 16
# every method, each with a pooling whose gradients are not small differences of large terms (see below)
METHODS = [
    ("simcse-unsup", {"pooling": "mean"}, "sts-unlabeled"),
    ("simcse-sup", {"hard_negative_weight": 0.3, "pooling": "mean"}, "nli-triplets"),
    ("sg", {"loss": "opt1"}, "sts-unlabeled"),
    ("sg-opt", {}, "sts-unlabeled"),
    # consert: its views draw inside the compiled encoder (inductor's RNG, and the wider padding draws other
    # numbers), so compared here with rate-0 cutoffs: the augmentation hooks run, the views they draw equal the input
    ("consert", {"augmentations": ["token_cutoff", "feature_cutoff"], "token_cutoff_rate": 0.0,
                 "feature_cutoff_rate": 0.0}, "sts-unlabeled"),
    ("layeratt", {"objective": "eq8"}, "nli-triplets"),  # in float64: see FLOAT64
    ("supcon", {}, "snli:dev+test"),
    ("sbert-nli", {}, "snli:dev+test"),
]
# compared in float64: layeratt's gradients on the tiny random BERT are small differences of large terms (the largest
# is 0.007 for a loss of 3.46), so inductor's reordered float32 sums move every tensor's by 6e-4 of its largest; in
# float64 compiled and eager agree to 1.6e-12 (measured), so the difference is rounding, not the graph
FLOAT64 = {"layeratt"}


def test_compile_widths_are_few_and_end_at_max_length():
    assert compile_widths(32) == (8, 16, 32)
    assert compile_widths(100) == (8, 16, 32, 64, 100)
    assert compile_widths(5) == (5,)


def _step(method_name: str, params: dict, data: str, compile: bool, model: str, tmp_path):
    cfg = parse_config({"name": "compile", "method": method_name, "model": {"name": model, "dropout": 0.0},
                        "params": params, "data": {"train": data, "max_train_samples": 64},
                        "train": {"batch_size": ROWS, "max_length": 32, "compile": compile}})
    m = build_method(cfg)  # seeded: the same heads every time
    if method_name in FLOAT64:
        m.double()
    tok, groups, _ = prepare_data(cfg, m)
    settings = resolve(cfg.train, "cpu")
    stepper = Stepper(cfg, m, TrainHooks(tmp_path), None, None, settings=settings)
    tok.pad_widths = compile_widths(tok.max_length) if compile else None
    m.prepare(tok, torch.device("cpu"))  # sg's cached BERT_F views
    m.train()
    rows = np.arange(ROWS) if groups is None else np.argsort(groups, kind="stable")[:ROWS]  # supcon: whole groups
    batch = tok.collate(rows)
    loss = forward_backward(stepper.model, m, _to_device(batch, torch.device("cpu")))
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads, batch, settings


def _train(**train):
    return parse_config({"name": "x", "method": "simcse-unsup", "model": {"name": RAW_BERT},
                         "train": train}).train


def test_auto_is_off_on_a_cpu_and_compiles_with_cuda_graphs_on_cuda():
    """``compile: auto`` (the default), resolved for a device named, not the one this machine has: off on a CPU
    (where length buckets stay the CPU's 4), on with CUDA graphs on CUDA (length buckets 1: fixed widths)."""
    train = _train()
    assert train.compile == "auto" and train.compile_mode == "auto"
    cpu = resolve(train, "cpu", total_steps=100_000)
    assert (cpu.compile, cpu.compile_mode, cpu.length_buckets, cpu.cuda_graphs) == (False, None, 4, False)
    assert "compile" in cpu.auto and cpu.compile_note.startswith("off on a CPU")
    assert cpu.record()["compile"] is False and cpu.record()["compile_note"] == cpu.compile_note
    for steps in (None, 100_000):  # the bench (steps after the compile are timed), a long run
        cuda = resolve(train, "cuda", total_steps=steps)
        assert (cuda.compile, cuda.compile_mode, cuda.length_buckets, cuda.cuda_graphs) == (
            True, "reduce-overhead", 1, True)
        assert "compile" in cuda.auto and cuda.compile_note.startswith("on, mode reduce-overhead")
        assert "compile True (auto) (mode reduce-overhead, CUDA graphs)" in cuda.describe()
        assert cuda.compile_cache  # recorded: where its graphs are cached
    # compile_mode: default keeps compiling without CUDA graphs; an explicit compile wins on every device
    assert not resolve(_train(compile_mode="default"), "cuda").cuda_graphs
    assert resolve(_train(compile_mode="default"), "cuda").compile_mode == "default"
    assert resolve(_train(compile=True), "cpu").compile_mode == "default"
    explicit = resolve(_train(compile=True), "cuda", total_steps=10)  # even a run shorter than the break-even
    assert explicit.compile and explicit.cuda_graphs and explicit.compile_note is None and "compile" not in explicit.auto
    assert not resolve(_train(compile=False), "cuda", total_steps=100_000).compile


def test_auto_leaves_a_run_shorter_than_the_break_even_eager_and_says_so():
    # the break-even from the measured H200 numbers (docs/performance.md, "On a GPU"): 40 s of compiling ÷ the
    # 16.1 ms a compiled step saves (46.24 vs 26.53 steps/s)
    assert (COMPILE_SECONDS, EAGER_STEPS_PER_SECOND, COMPILED_STEPS_PER_SECOND) == (40.0, 26.53, 46.24)
    assert BREAK_EVEN_STEPS == 2490 == -(-40.0 // (1 / 26.53 - 1 / 46.24))
    short = resolve(_train(), "cuda", total_steps=BREAK_EVEN_STEPS - 1)
    assert not short.compile and short.length_buckets == 1 and short.compile_mode is None
    assert (f"off: a run of {BREAK_EVEN_STEPS - 1} steps is shorter than compiling's break-even, "
            f"{BREAK_EVEN_STEPS} steps") in short.compile_note
    assert "train.compile: true compiles anyway" in short.describe()
    assert resolve(_train(), "cuda", total_steps=BREAK_EVEN_STEPS).compile


def test_auto_gives_way_to_settings_that_change_shapes_on_every_device():
    """Length buckets and gradient caching give each piece its own width: compile: true refuses them (below),
    compile: auto accepts them and stays off, saying why."""
    for train, why in (({"length_buckets": 4}, "train.length_buckets 4"),
                       ({"grad_cache_rows": 8}, "train.grad_cache_rows 8")):
        t = _train(**train)  # accepted
        cuda = resolve(t, "cuda", total_steps=100_000)
        assert not cuda.compile and cuda.compile_note.startswith(f"off: {why}")
        assert not resolve(t, "cpu").compile


class _Logged(TrainHooks):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.lines: list[str] = []

    def log(self, msg: str) -> None:
        self.lines.append(msg)


def test_the_run_weighs_its_own_length_and_logs_the_choice(tiny_bert, tmp_path, monkeypatch):
    """The loop resolves the settings for its run's number of steps (train.max_steps, or epochs × batches) and logs
    what compile: auto chose; here as if on CUDA (the settings are resolved for the device named)."""
    cfg = parse_config({"name": "compile", "method": "simcse-unsup", "model": {"name": tiny_bert},
                        "data": {"train": "sts-unlabeled", "max_train_samples": 64},
                        "train": {"batch_size": ROWS, "max_length": 32, "max_steps": 30}})
    seen = []
    real = loop.resolve_settings

    def as_on_cuda(train, device, total_steps=None):
        seen.append(total_steps)
        return real(train, "cuda", total_steps=total_steps)

    monkeypatch.setattr(loop, "resolve_settings", as_on_cuda)
    m = build_method(cfg)
    tok, groups, _ = prepare_data(cfg, m)
    hooks = _Logged(tmp_path)
    run = loop.setup(cfg, m, tok, [], hooks, groups=groups)
    assert run.total == 4 and seen[0] == 4  # 64 examples in batches of 16: one epoch, under max_steps
    assert not run.settings.compile and m.encoder._compiled is None and tok.pad_widths is None
    assert any("compile False (auto); compile auto: off: a run of 4 steps is shorter" in line
               for line in hooks.lines), hooks.lines


@pytest.mark.slow  # compiles (the tiny random BERT: about 15 s on 2 cores per method)
@pytest.mark.parametrize("method,params,data", METHODS, ids=[m[0] for m in METHODS])
def test_compiled_step_has_the_eager_loss_and_gradients(method, params, data, tiny_bert, tmp_path):
    # mean pooling: on the tiny random BERT every [CLS] vector is nearly the same, so a [CLS] loss's gradients are
    # small differences of large terms (1e-4 at most), and any reordering of float32 sums shows in them
    torch._dynamo.reset()
    loss_e, grads_e, batch_e, _ = _step(method, params, data, False, tiny_bert, tmp_path / "eager")
    loss_c, grads_c, batch_c, settings = _step(method, params, data, True, tiny_bert, tmp_path / "compiled")
    assert settings.compile and settings.length_buckets == 1 and "length_buckets" in settings.auto
    field = next(k for k, v in batch_c.items() if isinstance(v, dict))
    width_e, width_c = batch_e[field]["input_ids"].shape[1], batch_c[field]["input_ids"].shape[1]
    assert width_c in compile_widths(32) and width_c >= width_e  # padded to a fixed width
    assert loss_c == pytest.approx(loss_e, rel=1e-5)
    # the compiled graph returns a gradient for every weight it reads: zeros for those the loss does not use (BERT's
    # pooler, which the HF model computes and the method ignores); eager autograd leaves them None
    extra = set(grads_c) - set(grads_e)
    assert set(grads_e) <= set(grads_c) and len(grads_e) > 20
    assert all(not grads_c[n].any() for n in extra), extra
    # inductor fuses and reorders float32 sums: a few ulps of the largest gradient of each tensor, or of 1 % of the
    # largest of all (a tensor of tiny gradients, e.g. the word embeddings under LayerNorm, rounds as its inputs do)
    largest = max(float(g.abs().max()) for g in grads_e.values())
    for name, ref in grads_e.items():
        scale = max(float(ref.abs().max()), 1e-2 * largest)
        torch.testing.assert_close(grads_c[name], ref, rtol=0, atol=(1e-9 if method in FLOAT64 else 5e-5) * scale,
                                   msg=name)


@pytest.mark.parametrize("train,field", [({"length_buckets": 4}, "length_buckets"),
                                         ({"grad_cache_rows": 8}, "grad_cache_rows")])
def test_compile_refuses_settings_that_change_shapes(train, field):
    with pytest.raises(ConfigError, match=rf"train\.{field}: got .*allowed with (train\.)?compile"):
        parse_config({"name": "x", "method": "simcse-unsup", "model": {"name": RAW_BERT},
                      "train": {"compile": True, **train}})
