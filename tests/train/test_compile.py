"""``train.compile``: the encoder's training forward through ``torch.compile``, every batch padded to one of a few
fixed widths, gives the loss and gradients of the eager step (dropout off, so both sides draw nothing random).
Run on CPU, where torch's inductor compiles C++; on CUDA it compiles Triton kernels from the same graph. Not
timed: `raysent bench --parts gpu` measures what it buys on a GPU (docs/performance.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysent.config import parse_config
from raysent.errors import ConfigError
from raysent.train.device import resolve
from raysent.train.loop import Stepper, TrainHooks, _to_device, compile_widths, forward_backward
from raysent.train.run import build_method, prepare_data

from conftest import RAW_BERT

pytestmark = pytest.mark.shared

ROWS = 16


def test_compile_widths_are_few_and_end_at_max_length():
    assert compile_widths(32) == (8, 16, 32)
    assert compile_widths(100) == (8, 16, 32, 64, 100)
    assert compile_widths(5) == (5,)


def _step(method_name: str, params: dict, data: str, compile: bool, model: str, tmp_path):
    cfg = parse_config({"name": "compile", "method": method_name, "model": {"name": model, "dropout": 0.0},
                        "params": params, "data": {"train": data, "max_train_samples": 64},
                        "train": {"batch_size": ROWS, "max_length": 32, "compile": compile}})
    m = build_method(cfg)  # seeded: the same heads every time
    tok, _, _ = prepare_data(cfg, m)
    settings = resolve(cfg.train, "cpu")
    stepper = Stepper(cfg, m, TrainHooks(tmp_path), None, None, settings=settings)
    tok.pad_widths = compile_widths(tok.max_length) if compile else None
    m.train()
    batch = tok.collate(np.arange(ROWS))
    loss = forward_backward(stepper.model, m, _to_device(batch, torch.device("cpu")))
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads, batch, settings


@pytest.mark.slow  # compiles (the tiny random BERT: about 15 s on 2 cores)
@pytest.mark.parametrize("method,params,data", [("simcse-unsup", {"pooling": "mean"}, "sts-unlabeled"),
                                                ("simcse-sup", {"hard_negative_weight": 0.3, "pooling": "mean"},
                                                 "nli-triplets")])
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
        torch.testing.assert_close(grads_c[name], ref, rtol=0, atol=5e-5 * scale, msg=name)


@pytest.mark.parametrize("train,field", [({"length_buckets": 4}, "length_buckets"),
                                         ({"grad_cache_rows": 8}, "grad_cache_rows")])
def test_compile_refuses_settings_that_change_shapes(train, field):
    with pytest.raises(ConfigError, match=rf"train\.{field}: got .*allowed with (train\.)?compile"):
        parse_config({"name": "x", "method": "simcse-unsup", "model": {"name": RAW_BERT},
                      "train": {"compile": True, **train}})
