"""Every pooling against a hand-written computation on a padded batch; padding never pooled."""

from __future__ import annotations

import pytest
import torch

from raysent.models.heads import MLPHead
from raysent.models.pooling import BASE_POOLINGS, pool

pytestmark = pytest.mark.shared  # real data and models from ../shared

B, T, D, L = 3, 6, 5, 4
LENGTHS = [6, 3, 1]  # real tokens per row; the rest is padding


@pytest.fixture()
def batch():
    g = torch.Generator().manual_seed(0)
    hs = tuple(torch.randn(B, T, D, generator=g) for _ in range(L + 1))
    mask = torch.zeros(B, T, dtype=torch.long)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1
    # padding positions hold huge values: any pooling that touches them is visibly wrong
    for h in hs:
        h[mask == 0] = 1e4
    return hs, mask


def mean_rows(h, i):
    return torch.stack([h[i, t] for t in range(LENGTHS[i])]).mean(0)


def max_rows(h, i):
    rows = [h[i, t] for t in range(LENGTHS[i])]
    out = rows[0].clone()
    for r in rows[1:]:
        out = torch.maximum(out, r)
    return out


def expected(name, hs, mlp):
    out = []
    for i in range(B):
        if name == "cls_before_pooler":
            v = hs[-1][i, 0]
        elif name == "cls":
            v = torch.tanh(mlp.dense.weight @ hs[-1][i, 0] + mlp.dense.bias)
        elif name == "mean":
            v = mean_rows(hs[-1], i)
        elif name == "mean_no_cls":  # Liao 2021 §3: every real token but [CLS]; none left: a zero vector
            rows = [hs[-1][i, t] for t in range(1, LENGTHS[i])]
            v = torch.stack(rows).mean(0) if rows else torch.zeros(D)
        elif name == "max":
            v = max_rows(hs[-1], i)
        elif name == "first_last_avg":
            v = (mean_rows(hs[1], i) + mean_rows(hs[-1], i)) / 2
        elif name == "last2_avg":
            v = (mean_rows(hs[-2], i) + mean_rows(hs[-1], i)) / 2
        else:
            raise AssertionError(name)
        out.append(v)
    return torch.stack(out)


@pytest.mark.parametrize("name", ["cls", "cls_before_pooler", "mean", "mean_no_cls", "max", "first_last_avg",
                                  "last2_avg"])
def test_base_poolings(batch, name):
    hs, mask = batch
    mlp = MLPHead(D)
    got = pool(name, hs, mask, mlp=mlp, training=False)
    torch.testing.assert_close(got, expected(name, hs, mlp), rtol=1e-5, atol=1e-5)


def test_cls_mlp_train_uses_mlp_only_while_training(batch):
    hs, mask = batch
    mlp = MLPHead(D)
    torch.testing.assert_close(pool("cls_mlp_train", hs, mask, mlp=mlp, training=True), expected("cls", hs, mlp))
    torch.testing.assert_close(pool("cls_mlp_train", hs, mask, mlp=mlp, training=False),
                               expected("cls_before_pooler", hs, mlp))


@pytest.mark.parametrize("k", range(L + 1))
@pytest.mark.parametrize("how", ["cls", "mean", "max"])
def test_single_layer(batch, k, how):
    hs, mask = batch
    got = pool(f"layer{k}_{how}", hs, mask)
    if how == "cls":
        want = hs[k][:, 0]
    else:
        want = torch.stack([(mean_rows if how == "mean" else max_rows)(hs[k], i) for i in range(B)])
    torch.testing.assert_close(got, want)


def test_every_base_pooling_is_covered():
    assert set(BASE_POOLINGS) == {"cls", "cls_before_pooler", "cls_mlp_train", "mean", "mean_no_cls", "max",
                                  "first_last_avg", "last2_avg"}


def test_mean_no_cls_is_the_supcon_authors_pooling_without_padding(batch):
    """On a row without padding it is exactly the authors' `torch.mean(h[:, 1:], axis=1)` (Danqi7/584-final
    models.py); with padding they divide by the padded length, raysent by the real tokens."""
    hs, mask = batch
    full = pool("mean_no_cls", hs, mask)[0]  # row 0 has no padding
    torch.testing.assert_close(full, torch.mean(hs[-1][:1, 1:, :], dim=1)[0])
    padded = hs[-1][1] * mask[1].unsqueeze(-1)
    assert not torch.allclose(pool("mean_no_cls", hs, mask)[1], torch.mean(padded[1:], dim=0))


def test_unknown_and_out_of_range_poolings(batch):
    hs, mask = batch
    with pytest.raises(ValueError, match="unknown pooling 'avg'"):
        pool("avg", hs, mask)
    with pytest.raises(ValueError, match="layers 0..4"):
        pool("layer9_mean", hs, mask)


@pytest.mark.parametrize("name", ["cls_before_pooler", "mean", "max", "first_last_avg", "last2_avg", "layer2_max"])
def test_real_encoder_padding_does_not_change_vectors(raw_encoder, name):
    """A sentence embedded alone equals the same sentence inside a padded batch (masks respected)."""
    tok = raw_encoder.tokenizer
    short, long = "A man plays a guitar.", "A group of children are playing football on a sunny beach near the sea."
    alone = tok([short], return_tensors="pt")
    padded = tok([long, short], return_tensors="pt", padding=True)
    assert padded["attention_mask"][1].sum() < padded["attention_mask"].shape[1]  # really padded
    raw_encoder.eval()
    with torch.no_grad():
        v_alone = raw_encoder.embed(dict(alone), name)[0]
        v_padded = raw_encoder.embed(dict(padded), name)[1]
    torch.testing.assert_close(v_alone, v_padded, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("texts", [["A man plays a guitar.", "Children play football on a sunny beach near the sea."],
                                   ["one two three", "four five six"]], ids=["padded", "no padding"])
def test_the_prepared_attention_mask_changes_no_bit(raw_encoder, texts):
    """raysent hands transformers' SDPA attention a 4D boolean mask (raysent.models.chunked._forward: the 2D mask
    makes transformers ask ``mask.all()``, a host sync on CUDA, at every forward). Hidden states and gradients are
    bit for bit those of the 2D mask, with and without padding, dropout on."""
    from raysent.models.chunked import _forward

    model = raw_encoder.model
    assert model.config._attn_implementation == "sdpa"
    batch = dict(raw_encoder.tokenizer(texts, return_tensors="pt", padding=True))
    model.train()
    try:
        runs = []
        for prepared in (False, True):
            model.zero_grad(set_to_none=True)
            torch.manual_seed(0)
            if prepared:
                states = _forward(model, batch)
            else:
                states = tuple(model(**batch, output_hidden_states=True).hidden_states)
            sum(h.square().sum() for h in states).backward()
            runs.append((states, [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
    (plain, g_plain), (four_d, g_four_d) = runs
    assert all(torch.equal(a, b) for a, b in zip(plain, four_d))
    assert len(g_plain) > 20 and all(torch.equal(a, b) for a, b in zip(g_plain, g_four_d))
