"""SimCSE-unsup: the loss against an independent computation, and the method's forward pass."""

from __future__ import annotations

import math

import pytest
import torch

from raysent.methods.losses import info_nce
from raysent.methods.simcse_unsup import SimCSEUnsup, SimCSEUnsupParams


def reference_loss(z1, z2, tau):
    """Explicit cosine matrix, log-softmax over each row, diagonal targets (Gao et al. 2021, Eq. 1)."""
    n = z1.shape[0]
    total = 0.0
    for i in range(n):
        sims = [float(torch.dot(z1[i], z2[j]) / (z1[i].norm() * z2[j].norm())) / tau for j in range(n)]
        m = max(sims)
        log_z = m + math.log(sum(math.exp(s - m) for s in sims))
        total += -(sims[i] - log_z)
    return total / n


@pytest.mark.parametrize("tau", [0.05, 0.1, 1.0])
def test_info_nce_equals_independent_computation(tau):
    g = torch.Generator().manual_seed(1)
    z1, z2 = torch.randn(7, 16, generator=g), torch.randn(7, 16, generator=g)
    got = info_nce(z1, z2, tau)
    assert got.item() == pytest.approx(reference_loss(z1.double(), z2.double(), tau), abs=1e-5)


def test_info_nce_local_rows_against_gathered_columns():
    """A worker's rows against the global candidates with its offset = the same rows of the global loss."""
    g = torch.Generator().manual_seed(2)
    z1, z2 = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
    full = torch.nn.functional.cross_entropy(
        torch.nn.functional.normalize(z1, dim=-1) @ torch.nn.functional.normalize(z2, dim=-1).T / 0.05,
        torch.arange(8), reduction="none")
    part = info_nce(z1[4:], z2[4:], 0.05, gather=lambda x: z2, offset=4)
    assert part.item() == pytest.approx(full[4:].mean().item(), abs=1e-5)


@pytest.mark.shared
def test_forward_two_dropout_views_in_one_pass(raw_encoder):
    method = SimCSEUnsup(raw_encoder, SimCSEUnsupParams(pooling="mean"))
    tok = raw_encoder.tokenizer(["a cat sat on the mat", "dogs bark loudly at night", "the sun is hot"],
                                padding=True, return_tensors="pt")
    batch = {"text": {"input_ids": tok["input_ids"], "attention_mask": tok["attention_mask"]}}
    seen = []
    hook = raw_encoder.model.register_forward_hook(lambda m, a, k, o: seen.append(k["input_ids"].shape), with_kwargs=True)
    try:
        method.train()
        torch.manual_seed(0)
        out = method(batch)
    finally:
        hook.remove()
    assert seen == [torch.Size([6, tok["input_ids"].shape[1]])]  # one forward of 2N rows
    assert torch.isfinite(out.loss) and out.loss.item() > 0
    out.loss.backward()
    assert raw_encoder.model.encoder.layer[0].attention.self.query.weight.grad is not None
    # with dropout off the two views coincide, so the loss reaches its dropout-free value
    method.eval()
    with torch.no_grad():
        z = method.embed(batch["text"])
        want = info_nce(z, z, 0.05)
        assert method(batch).loss.item() == pytest.approx(want.item(), abs=1e-5)
