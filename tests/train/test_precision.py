"""``train.precision: bf16`` on CPU: the code a GPU run executes (autocast around every forward pass, gradient
caching under autocast), run here against fp32, on the tiny random BERT. The 2-worker gather in bf16 is in
tests/train/test_ray_train.py; the measurements behind the tolerances in docs/performance.md ("bf16 without a
GPU").

Tolerances. bf16 keeps 8 significant bits: a value is rounded to within U = 2^-8 (0.4 %) of itself, about 2.4
decimal digits. The loss is asked to agree with fp32 to U (measured: 1.2e-3 of the loss at most, SG-OPT at
τ = 0.01; 6e-4 or less for the others). A gradient passes through a dozen bf16 roundings (each layer's
activations forward, its products backward), so each parameter tensor's gradient is asked to agree to 8U =
2^-5 (3.1 %) in norm (measured: 1.0 % at most against fp32, 2.0 % for gradient caching, layeratt eq8). Gradients
that are ~0 in theory (an attention key's bias: softmax does not see it) hold only rounding noise, so a tensor
is measured against 5 % of the whole gradient's norm when its own is smaller.

Both sides of a comparison start from the same seed: the heads, the dropout masks (drawn alike for fp32 and
bf16 tensors) and ConSERT's augmentations are the same, so rounding is the only difference.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raysent.config import parse_config
from raysent.methods import METHODS
from raysent.methods.losses import cosine_matrix, dot_matrix
from raysent.train.loop import Stepper, TrainHooks, _to_device, autocast, forward_backward, used_precision
from raysent.train.run import build_method, prepare_data

U = 2.0**-8  # bf16's unit roundoff
LOSS_RTOL = U
GRAD_RTOL = 8 * U
FLOOR = 0.05  # of the whole gradient's norm: the scale a tensor with a ~0 gradient is measured against
ROWS = 16

# method -> (params, training data): each method's paper defaults otherwise (dropout included: ConSERT's 0)
CASES: dict[str, tuple[dict, str]] = {
    "simcse-unsup": ({}, "sts-unlabeled"),
    "simcse-sup": ({}, "nli-triplets"),
    "sg": ({}, "sts-unlabeled"),
    "sg-opt": ({}, "sts-unlabeled"),
    "consert": ({}, "sts-unlabeled"),
    # supervised: the classifier, and the adversarial view's gradient taken inside the forward pass
    "consert-joint-adversarial": ({"supervision": "joint", "augmentations": ["none", "adversarial"]},
                                  "snli:dev+test"),
    "layeratt": ({}, "sts-unlabeled"),
    "layeratt-eq8": ({"objective": "eq8"}, "nli-triplets"),
    "supcon": ({}, "snli:dev+test"),
    "sbert-nli": ({}, "snli:dev+test"),
}
NOT_TRAINED = {"baseline"}  # no training step (Method.trains is False)


def _method(case: str) -> str:
    return next(m for m in sorted(METHODS, key=len, reverse=True) if case.startswith(m))


def step_of(model: str, case: str, precision: str, tmp_path, train: dict | None = None, params: dict | None = None,
            dropout: float | None = None) -> tuple[float, dict[str, torch.Tensor], set[torch.dtype]]:
    """Loss and gradients of one step through the loop's Stepper and forward_backward, and the dtypes every
    linear layer of the method put out during it."""
    case_params, data = CASES[case]
    cfg = parse_config({"name": "precision", "method": _method(case),
                        "model": {"name": model, **({} if dropout is None else {"dropout": dropout})},
                        "params": {**case_params, **(params or {})},
                        "data": {"train": data, "max_train_samples": 64},
                        "train": {"batch_size": ROWS, "max_length": 32, "precision": precision, **(train or {})}})
    method = build_method(cfg)  # seeded: the same heads for both precisions
    tok, groups, _ = prepare_data(cfg, method)
    stepper = Stepper(cfg, method, TrainHooks(tmp_path), None, None)
    method.prepare(tok, torch.device("cpu"))
    method.train()
    rows = np.arange(ROWS) if groups is None else np.argsort(groups, kind="stable")[:ROWS]
    dtypes: set[torch.dtype] = set()
    handles = [m.register_forward_hook(lambda mod, args, out: dtypes.add(out.dtype))
               for m in method.modules() if isinstance(m, torch.nn.Linear)]
    torch.manual_seed(0)  # the same dropout masks, augmentations and samples on both sides
    try:
        loss = forward_backward(stepper.model, method, _to_device(tok.collate(rows), torch.device("cpu")),
                                grad_cache=stepper.grad_cache, autocast=stepper.autocast)
    finally:
        for h in handles:
            h.remove()
    grads = {n: p.grad.detach().clone() for n, p in method.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads, dtypes


def grad_errors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per parameter tensor: ‖got − want‖ / max(‖want‖, FLOOR · ‖every gradient of want‖)."""
    assert set(got) == set(want) and len(want) > 20
    total = math.sqrt(sum(float(g.double().pow(2).sum()) for g in want.values()))
    return {n: float((got[n] - want[n]).norm()) / max(float(want[n].norm()), FLOOR * total) for n in want}


def assert_close_in_bf16(label: str, loss: float, grads: dict, ref_loss: float, ref_grads: dict,
                         loss_rtol: float = LOSS_RTOL) -> None:
    assert abs(loss - ref_loss) <= loss_rtol * abs(ref_loss), f"{label}: loss {loss} vs {ref_loss}"
    errors = grad_errors(grads, ref_grads)
    worst = max(errors, key=errors.__getitem__)
    assert errors[worst] <= GRAD_RTOL, f"{label}: gradient of {worst} off by {errors[worst]:.4f} (> {GRAD_RTOL:.4f})"


def test_every_trained_method_has_a_case():
    assert {_method(c) for c in CASES} == set(METHODS) - NOT_TRAINED
    assert all(not METHODS[m].trains for m in NOT_TRAINED)


def test_bf16_autocasts_on_cpu_and_fp16_stays_on_cuda():
    assert used_precision("bf16", "cpu") == "bf16" and used_precision("bf16", "cuda") == "bf16"
    assert used_precision("fp16", "cpu") == "fp32" and used_precision("fp16", "cuda") == "fp16"
    assert used_precision("fp32", "cuda") == "fp32"
    x = torch.randn(4, 8)
    with autocast("bf16", torch.device("cpu")):
        assert (x @ x.T).dtype == torch.bfloat16
    for precision in ("fp32", "fp16"):  # no autocast on a CPU
        with autocast(precision, torch.device("cpu")):
            assert (x @ x.T).dtype == torch.float32


def test_similarities_stay_float32_under_autocast():
    """The loss's similarity logits (cos/τ, dot/τ) are computed in float32 even in a bf16 forward pass."""
    a, b = torch.randn(6, 16), torch.randn(9, 16)
    want_cos = cosine_matrix(a, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got_cos, got_dot = cosine_matrix(a, b), dot_matrix(a.bfloat16(), b)  # a bf16 input is widened, not b
        assert (a @ b.T).dtype == torch.bfloat16  # what a plain product gives here
    assert got_cos.dtype == got_dot.dtype == torch.float32
    assert torch.equal(got_cos, want_cos)
    assert torch.equal(got_dot, a.bfloat16().float() @ b.T)


@pytest.mark.shared
@pytest.mark.parametrize("case", list(CASES))
def test_a_bf16_step_equals_the_fp32_step(case, tiny_bert, tmp_path):
    ref_loss, ref_grads, ref_dtypes = step_of(tiny_bert, case, "fp32", tmp_path)
    loss, grads, dtypes = step_of(tiny_bert, case, "bf16", tmp_path)
    assert ref_dtypes == {torch.float32} and dtypes == {torch.bfloat16}, (ref_dtypes, dtypes)
    assert loss != ref_loss  # rounded, not the fp32 step again
    assert_close_in_bf16(case, loss, grads, ref_loss, ref_grads)


# every method with gradient caching; dropout off (each chunk draws its own masks) and mean pooling for SimCSE
# (the tiny random BERT's [CLS] is nearly the same vector for every sentence: without dropout, the gradient
# would be a difference of near-equal terms, as it is in fp32 too)
GRAD_CACHE = {c: ({"pooling": "mean"} if c.startswith("simcse") else {})
              for c in CASES if METHODS[_method(c)].supports_grad_cache}


@pytest.mark.shared
@pytest.mark.parametrize("case", list(GRAD_CACHE))
def test_grad_cache_in_bf16_equals_the_bf16_step_without_it(case, tiny_bert, tmp_path):
    """Pass 1 (no graph) and pass 2 (each chunk again, with a graph) both run under autocast."""
    assert len(GRAD_CACHE) >= 6
    ref_loss, ref_grads, _ = step_of(tiny_bert, case, "bf16", tmp_path, train={"length_buckets": 1},
                                     params=GRAD_CACHE[case], dropout=0.0)
    loss, grads, dtypes = step_of(tiny_bert, case, "bf16", tmp_path, train={"length_buckets": 1, "grad_cache_rows": 5},
                                  params=GRAD_CACHE[case], dropout=0.0)
    assert dtypes == {torch.bfloat16}
    # the same bf16 forward pass, in chunks: measured 8e-6 of the loss at most
    assert_close_in_bf16(case, loss, grads, ref_loss, ref_grads, loss_rtol=1e-4)


@pytest.mark.slow
@pytest.mark.shared
def test_a_run_records_the_precision_it_trained_in(tiny_bert, tmp_path, capsys):
    """bf16 trains in bf16 on a CPU (and says so in result.json); fp16 trains in fp32 there, said and recorded."""
    import json

    from raysent.train.run import train_in_process

    def run(precision: str):
        cfg = parse_config({"name": f"run-{precision}", "method": "simcse-unsup", "model": {"name": tiny_bert},
                            "data": {"train": "sts-unlabeled", "dev": ["sickr:dev"], "max_train_samples": 64},
                            "train": {"batch_size": ROWS, "max_steps": 3, "eval_every": 3, "log_every": 1,
                                      "eval_at_start": False, "max_length": 32, "precision": precision,
                                      "output_dir": str(tmp_path / precision)}})
        summary = train_in_process(cfg)
        assert [c["step"] for c in summary.loss_curve] == [1, 2, 3]
        assert all(math.isfinite(c["loss"]) for c in summary.loss_curve)
        assert json.loads((tmp_path / precision / "result.json").read_text())["precision"] == summary.precision
        return summary, capsys.readouterr().err

    summary, err = run("bf16")
    assert summary.precision == "bf16" and summary.device == "cpu" and "NOTE" not in err
    summary, err = run("fp16")
    assert summary.precision == "fp32"
    assert "NOTE: train.precision=fp16 is not available on cpu" in err and "fp16, with its GradScaler: CUDA only" in err
    assert "this run trains in fp32" in err
