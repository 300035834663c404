"""The losses, views and poolers of simcse-sup, sg / sg-opt, consert, supcon and layeratt against
independent computations written here from the papers' equations (../shared/papers), with explicit
loops over anchors and candidates in float64. The package's helpers (cosine_matrix, nt_xent,
info_nce, ...) are never used by a reference.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch
from torch import nn

from raysent.methods.consert_views import embedding_dropout, feature_cutoff, fgv_noise, shuffle_positions, token_cutoff
from raysent.methods.losses import hard_negative_loss, nt_xent
from raysent.methods.sg import l2_regularizer, loss_base, loss_opt1, loss_opt2, loss_opt3
from raysent.methods.supcon import scl_loss
from raysent.models.heads import LayerAttentionPooler

TOL = 1e-5


# --------------------------------------------------------------------------- scalar helpers
def cos(u: torch.Tensor, v: torch.Tensor) -> float:
    u, v = u.double(), v.double()
    return float(torch.dot(u, v)) / (float(u.norm()) * float(v.norm()))


def dot(u: torch.Tensor, v: torch.Tensor) -> float:
    return float(torch.dot(u.double(), v.double()))


def logsumexp(xs: list[float]) -> float:
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs))


def rand(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def exact_floor(n: int, rate: float) -> int:
    """⌊n·rate⌋ with the rate read as the decimal it is written as (no float rounding)."""
    return math.floor(Fraction(n) * Fraction(str(rate)))


# =========================================================================== 1. SimCSE supervised
def ref_hard_negative_rows(a, pos, neg, tau, w, weight_col=lambda i: i):
    """SimCSE Eq. 5 per anchor: logits cos(h_i, h_j^+)/τ for all j, then cos(h_i, h_j^-)/τ for all j
    with w added to column weight_col(i) of the second block; −log softmax at positive i."""
    rows = []
    for i in range(a.shape[0]):
        logits = [cos(a[i], pos[j]) / tau for j in range(pos.shape[0])]
        logits += [cos(a[i], neg[j]) / tau + (w if j == weight_col(i) else 0.0) for j in range(neg.shape[0])]
        rows.append(logsumexp(logits) - logits[i])
    return rows


@pytest.mark.parametrize("w", [0.0, 0.5, -1.0])
@pytest.mark.parametrize("tau", [0.05, 1.0])
def test_hard_negative_loss_equals_simcse_eq5(w, tau):
    a, p, n = rand(6, 8, seed=10), rand(6, 8, seed=11), rand(6, 8, seed=12)
    got = hard_negative_loss(a, p, n, tau, hard_negative_weight=w).item()
    ref = ref_hard_negative_rows(a, p, n, tau, w)
    assert got == pytest.approx(sum(ref) / len(ref), abs=TOL)


def test_hard_negative_weight_lands_on_the_own_hard_negative_column():
    """The change made by w is the reference's change with w on column i, and not on any other."""
    a, p, n = rand(5, 8, seed=20), rand(5, 8, seed=21), rand(5, 8, seed=22)
    tau, w = 0.1, 2.0
    base = hard_negative_loss(a, p, n, tau).item()
    got_delta = hard_negative_loss(a, p, n, tau, hard_negative_weight=w).item() - base
    ref0 = ref_hard_negative_rows(a, p, n, tau, 0.0)
    ref_w = ref_hard_negative_rows(a, p, n, tau, w)
    ref_delta = sum(x - y for x, y in zip(ref_w, ref0)) / len(ref0)
    assert got_delta == pytest.approx(ref_delta, abs=TOL)
    # the test tells the columns apart: w on the next anchor's hard negative gives another loss
    wrong = ref_hard_negative_rows(a, p, n, tau, w, weight_col=lambda i: (i + 1) % 5)
    assert abs(sum(wrong) / 5 - sum(ref0) / 5 - ref_delta) > 1e-3
    # a large weight makes each anchor's own hard negative dominate: l_i ≈ w + (s_i^- − s_i^+)/τ
    big = 60.0
    got_big = hard_negative_loss(a, p, n, tau, hard_negative_weight=big).item()
    approx = sum(big + (cos(a[i], n[i]) - cos(a[i], p[i])) / tau for i in range(5)) / 5
    assert got_big == pytest.approx(approx, abs=1e-4)


@pytest.mark.parametrize("w", [0.0, 0.5, -1.0])
def test_hard_negative_loss_local_rows_against_gathered_columns(w):
    """Rows k..k+n-1 on a worker with offset k = the mean of the global reference's rows k..k+n-1."""
    big_n, k, n, tau = 9, 3, 4, 0.05
    A, P, N = rand(big_n, 6, seed=30), rand(big_n, 6, seed=31), rand(big_n, 6, seed=32)
    a_loc, p_loc, n_loc = A[k:k + n], P[k:k + n], N[k:k + n]
    full_of = {id(p_loc): P, id(n_loc): N}

    def gather(x):
        return full_of[id(x)]

    got = hard_negative_loss(a_loc, p_loc, n_loc, tau, hard_negative_weight=w, gather=gather, offset=k).item()
    ref = ref_hard_negative_rows(A, P, N, tau, w)
    assert got == pytest.approx(sum(ref[k:k + n]) / n, abs=TOL)


# =========================================================================== 2. SG / SG-OPT losses
def phi_log(u, v, tau):
    """log φ(u, v) = cos(u, v)/τ (u, v already projected by f)."""
    return cos(u, v) / tau


def ref_loss_base(fc, fh, tau):
    """Kim et al. 2021 §3.1: NT-Xent over X = {c_i} ∪ {h_i}, μ(c_i) = h_i, Z over n ≠ m, mean over 2b."""
    b = fc.shape[0]
    xs = [fc[i] for i in range(b)] + [fh[i] for i in range(b)]
    match = lambda m: m + b if m < b else m - b  # noqa: E731
    total = 0.0
    for m in range(2 * b):
        z = [phi_log(xs[m], xs[q], tau) for q in range(2 * b) if q != m]
        total += -(phi_log(xs[m], xs[match(m)], tau) - logsumexp(z))
    return total / (2 * b)


def ref_loss_opt1(fc, fh, tau):
    b = fc.shape[0]
    total = 0.0
    for i in range(b):
        z = [phi_log(fc[i], fc[j], tau) for j in range(b) if j != i] + [phi_log(fc[i], fh[j], tau) for j in range(b)]
        total += -(phi_log(fc[i], fh[i], tau) - logsumexp(z))
    return total / b


def ref_loss_opt2(fc, fh, tau):
    b = fc.shape[0]
    total = 0.0
    for i in range(b):
        z = [phi_log(fc[i], fh[j], tau) for j in range(b)]
        total += -(phi_log(fc[i], fh[i], tau) - logsumexp(z))
    return total / b


def ref_loss_opt3(fc, fh_layers, tau):
    b, n_layers, _ = fh_layers.shape
    total = 0.0
    for i in range(b):
        others = [phi_log(fc[i], fh_layers[m, q], tau) for m in range(b) if m != i for q in range(n_layers)]
        for k in range(n_layers):
            own = phi_log(fc[i], fh_layers[i, k], tau)
            total += -(own - logsumexp([own] + others))
    return total / (b * n_layers)


@pytest.mark.parametrize("tau", [0.01, 0.1, 1.0])
def test_sg_loss_base_equals_nt_xent_of_the_paper(tau):
    fc, fh = rand(5, 12, seed=40), rand(5, 12, seed=41)
    assert loss_base(fc, fh, tau).item() == pytest.approx(ref_loss_base(fc, fh, tau), abs=TOL)


@pytest.mark.parametrize("tau", [0.01, 0.1, 1.0])
def test_sg_loss_opt1_equals_the_paper(tau):
    fc, fh = rand(5, 12, seed=42), rand(5, 12, seed=43)
    got = loss_opt1(fc, fh, tau).item()
    assert got == pytest.approx(ref_loss_opt1(fc, fh, tau), abs=TOL)
    # opt1 differs from opt2 and base on this input (the references are told apart)
    assert abs(ref_loss_opt1(fc, fh, tau) - ref_loss_opt2(fc, fh, tau)) > 1e-3


@pytest.mark.parametrize("tau", [0.01, 0.1, 1.0])
def test_sg_loss_opt2_equals_the_paper(tau):
    fc, fh = rand(5, 12, seed=44), rand(5, 12, seed=45)
    assert loss_opt2(fc, fh, tau).item() == pytest.approx(ref_loss_opt2(fc, fh, tau), abs=TOL)


@pytest.mark.parametrize("tau", [0.01, 0.1, 1.0])
def test_sg_loss_opt3_equals_the_paper(tau):
    fc, fh_layers = rand(4, 10, seed=46), rand(4, 5, 10, seed=47)  # b = 4, l + 1 = 5
    got = loss_opt3(fc, fh_layers, tau).item()
    assert got == pytest.approx(ref_loss_opt3(fc, fh_layers, tau), abs=TOL)


def test_sg_loss_opt3_with_one_layer_is_opt2():
    """With a single view per sentence, L^opt3's denominator is Σ_j φ(c_i, h_j): L^opt2."""
    fc, fh = rand(6, 10, seed=48), rand(6, 10, seed=49)
    assert loss_opt3(fc, fh[:, None], 0.1).item() == pytest.approx(ref_loss_opt2(fc, fh, 0.1), abs=TOL)


def test_l2_regularizer_is_the_sum_of_squared_differences():
    torch.manual_seed(50)
    tuned = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    torch.manual_seed(51)
    frozen = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    for p in frozen.parameters():
        p.requires_grad_(False)
    frozen_params = dict(frozen.named_parameters())
    ref = 0.0
    for name, p in tuned.named_parameters():
        q = frozen_params[name]
        for x, y in zip(p.detach().double().flatten().tolist(), q.double().flatten().tolist()):
            ref += (x - y) ** 2
    assert ref > 0.1
    got = l2_regularizer(tuned, frozen)
    assert got.item() == pytest.approx(ref, abs=TOL)
    got.backward()  # d/dθ_T ‖θ_F − θ_T‖² = 2(θ_T − θ_F); BERT_F gets no gradient
    for name, p in tuned.named_parameters():
        assert torch.allclose(p.grad, 2 * (p.detach() - frozen_params[name]), atol=1e-6)
    assert all(q.grad is None for q in frozen.parameters())


# --------------------------------------------------------------------------- SG-OPT on a real encoder
SG_SENTENCES = ["a man is playing a guitar on the street", "the cat sleeps", "two dogs run across a green field",
                "it rains"]


def squared_difference(tuned: nn.Module, frozen: nn.Module) -> float:
    frozen_params = dict(frozen.named_parameters())
    return sum(float(((p.detach().double() - frozen_params[n].double()) ** 2).sum())
               for n, p in tuned.named_parameters())


@pytest.fixture(scope="module")
def sg_trained(tiny_bert):
    """A fresh encoder (SG freezes its embeddings), SG-OPT, two AdamW steps; snapshots before."""
    from raysent.methods.sg import SelfGuidedOpt, SGOptParams
    from raysent.models.encoder import Encoder

    encoder = Encoder.load(tiny_bert)
    method = SelfGuidedOpt(encoder, SGOptParams(head_width=64))
    tok = encoder.tokenizer(SG_SENTENCES, padding=True, return_tensors="pt")
    batch = {"text": {"input_ids": tok["input_ids"], "attention_mask": tok["attention_mask"]}}
    before_frozen = {n: p.detach().clone() for n, p in method.frozen.named_parameters()}
    before_emb = {n: p.detach().clone() for n, p in method.encoder.model.embeddings.named_parameters()}
    before_tuned = {n: p.detach().clone() for n, p in method.encoder.model.encoder.named_parameters()}
    assert squared_difference(method.encoder.model, method.frozen) == 0.0
    opt = torch.optim.AdamW(method.trainable_parameters(), lr=1e-3)
    method.train()
    torch.manual_seed(0)
    for _ in range(2):
        opt.zero_grad()
        out = method(batch)
        out.loss.backward()
        opt.step()
    return {"method": method, "batch": batch, "frozen": before_frozen, "emb": before_emb, "tuned": before_tuned}


def test_sg_opt_training_keeps_bert_f_and_layer0_of_bert_t_fixed(sg_trained):
    method = sg_trained["method"]
    emb_names = {n for n, _ in method.encoder.model.embeddings.named_parameters()}
    assert emb_names and not any(p.requires_grad for p in method.encoder.model.embeddings.parameters())
    for name, p in method.frozen.named_parameters():
        assert torch.equal(p, sg_trained["frozen"][name]), f"BERT_F parameter {name} changed"
    for name, p in method.encoder.model.embeddings.named_parameters():
        assert torch.equal(p, sg_trained["emb"][name]), f"layer 0 of BERT_T ({name}) changed"
    changed = [n for n, p in method.encoder.model.encoder.named_parameters()
               if not torch.equal(p, sg_trained["tuned"][n])]
    assert "layer.0.attention.self.query.weight" in changed
    last = method.encoder.model.config.num_hidden_layers - 1
    assert any(n.startswith(f"layer.{last}.") for n in changed)


def test_sg_opt_l2_regularizer_on_the_two_encoders(sg_trained):
    method = sg_trained["method"]
    ref = squared_difference(method.encoder.model, method.frozen)
    assert ref > 0
    assert l2_regularizer(method.encoder.model, method.frozen).item() == pytest.approx(ref, rel=TOL)


def test_sg_opt_forward_reports_loss_reg_and_opt3_of_bert_f_views(sg_trained):
    """loss_reg is ‖θ_F − θ_T‖²; loss_con is L^opt3 over f(c_i) (BERT_T's last [CLS]) and f(h_{i,k})
    (max pooling of BERT_F's layers 0..l over real tokens); loss = loss_con + λ·loss_reg."""
    method, batch = sg_trained["method"], sg_trained["batch"]
    tok = batch["text"]
    method.eval()
    try:
        with torch.no_grad():
            out = method(batch)
            c = method.encoder(**tok)[-1][:, 0]
            states = method.frozen(**tok, output_hidden_states=True, return_dict=True).hidden_states
            assert len(states) == method.encoder.num_layers + 1
            lengths = tok["attention_mask"].sum(1).tolist()
            h = torch.stack([torch.stack([layer[i, :lengths[i]].max(dim=0).values for layer in states])
                             for i in range(len(lengths))])  # [b, l+1, d]
            fc, fh = method.head(c), method.head(h)
    finally:
        method.train()
    reg = squared_difference(method.encoder.model, method.frozen)
    assert float(out.metrics["loss_reg"]) == pytest.approx(reg, rel=TOL)
    # τ = 0.01 multiplies float32 cosine rounding (~1e-7) by 100: 1e-4 is the honest tolerance here
    assert float(out.metrics["loss_con"]) == pytest.approx(ref_loss_opt3(fc, fh, method.params.temperature), abs=1e-4)
    assert out.loss.item() == pytest.approx(float(out.metrics["loss_con"]) + method.params.reg_lambda * reg, rel=TOL)


def test_sg_opt_in_float64_is_its_equation_to_float64_precision(tiny_bert):
    """The losses promote to at least float32 (raysent.methods.losses.at_least_float32), never down: SG-OPT with its
    paper's 4096-wide head, run wholly in float64, gives L^opt3 + λ·L^reg to float64 precision. (With ``.float()``
    the similarities were cut to float32: the loss here, 5.86 with τ = 0.01, was then 3.6e-7 off its equation.)"""
    from raysent.methods.sg import SelfGuidedOpt, SGOptParams
    from raysent.models.encoder import Encoder

    encoder = Encoder.load(tiny_bert)
    method = SelfGuidedOpt(encoder, SGOptParams()).double()
    assert method.params.head_width == 4096
    tok = encoder.tokenizer(SG_SENTENCES, padding=True, return_tensors="pt")
    batch = {"text": {"input_ids": tok["input_ids"], "attention_mask": tok["attention_mask"]}}
    method.eval()  # no dropout: the reference below sees the same network
    with torch.no_grad():
        out = method(batch)
        c = method.encoder(**batch["text"])[-1][:, 0]
        states = method.frozen(**batch["text"], output_hidden_states=True, return_dict=True).hidden_states
        lengths = tok["attention_mask"].sum(1).tolist()
        h = torch.stack([torch.stack([layer[i, :lengths[i]].max(dim=0).values for layer in states])
                         for i in range(len(lengths))])
        fc, fh = method.head(c), method.head(h)
    assert out.loss.dtype == torch.float64 and fc.dtype == torch.float64
    ref = ref_loss_opt3(fc, fh, method.params.temperature)
    assert ref > 1  # τ = 0.01 scales the similarities by 100: float32 rounding shows
    assert float(out.metrics["loss_con"]) == pytest.approx(ref, rel=1e-12)
    assert out.loss.item() == pytest.approx(ref + method.params.reg_lambda * float(out.metrics["loss_reg"]), rel=1e-12)


# =========================================================================== 3. NT-Xent (ConSERT Eq. 1)
def ref_nt_xent_terms(a, b, tau):
    """ConSERT Eq. 1: the 2N views r = a ∪ b, positive = counterpart, Σ over k ≠ m; one term per view."""
    n = a.shape[0]
    r = [a[i] for i in range(n)] + [b[i] for i in range(n)]
    terms = []
    for m in range(2 * n):
        j = m + n if m < n else m - n
        denom = [cos(r[m], r[k]) / tau for k in range(2 * n) if k != m]
        terms.append(-(cos(r[m], r[j]) / tau - logsumexp(denom)))
    return terms


@pytest.mark.parametrize("tau", [0.05, 0.1, 1.0])
def test_nt_xent_equals_consert_eq1(tau):
    a, b = rand(6, 9, seed=60), rand(6, 9, seed=61)
    terms = ref_nt_xent_terms(a, b, tau)
    assert nt_xent(a, b, tau).item() == pytest.approx(sum(terms) / len(terms), abs=TOL)


def test_nt_xent_local_rows_against_gathered_columns():
    """A worker's rows with offset k = the mean of the global reference's terms of a_k.., b_k.."""
    big_n, k, n, tau = 8, 4, 3, 0.1
    A, B = rand(big_n, 5, seed=62), rand(big_n, 5, seed=63)
    a_loc, b_loc = A[k:k + n], B[k:k + n]
    full_of = {id(a_loc): A, id(b_loc): B}
    got = nt_xent(a_loc, b_loc, tau, gather=lambda x: full_of[id(x)], offset=k).item()
    terms = ref_nt_xent_terms(A, B, tau)
    mine = terms[k:k + n] + terms[big_n + k:big_n + k + n]
    assert got == pytest.approx(sum(mine) / len(mine), abs=TOL)


# =========================================================================== 4. ConSERT views
LENGTHS = [20, 13, 7, 3, 1]
T_MAX = 24


def padded_mask(lengths=LENGTHS, t=T_MAX) -> torch.Tensor:
    mask = torch.zeros(len(lengths), t, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return mask


def no_zero_embeddings(b, t, d, seed):
    return rand(b, t, d, seed=seed) + 10.0  # no exact zeros, so zero counts are exact


@pytest.mark.parametrize("seed", range(5))
def test_shuffle_positions_permutes_real_tokens_and_keeps_padding(seed):
    mask = padded_mask()
    torch.manual_seed(seed)
    pos = shuffle_positions(mask)
    assert pos.shape == mask.shape
    moved = False
    for i, n in enumerate(LENGTHS):
        real = pos[i, :n].tolist()
        assert sorted(real) == list(range(n))
        assert pos[i, n:].tolist() == list(range(n, T_MAX))
        moved |= real != list(range(n))
    assert moved  # the 20- and 13-token rows are not left in order


def test_shuffle_positions_differ_across_seeds():
    mask = padded_mask()
    draws = []
    for seed in range(4):
        torch.manual_seed(seed)
        draws.append(shuffle_positions(mask)[0].tolist())
    assert len({tuple(d) for d in draws}) > 1


@pytest.mark.parametrize("rate", [0.15, 0.5])
@pytest.mark.parametrize("seed", range(3))
def test_token_cutoff_zeroes_whole_real_token_rows(rate, seed):
    emb, mask = no_zero_embeddings(len(LENGTHS), T_MAX, 16, seed), padded_mask()
    torch.manual_seed(seed)
    out = token_cutoff(emb, mask, rate)
    for i, n in enumerate(LENGTHS):
        zero_rows = [t for t in range(T_MAX) if bool((out[i, t] == 0).all())]
        assert len(zero_rows) == exact_floor(n, rate)
        assert all(t < n for t in zero_rows)  # padding rows are never cut
        for t in range(T_MAX):
            if t not in zero_rows:
                assert torch.equal(out[i, t], emb[i, t])  # no partial zeros, no rescaling


@pytest.mark.parametrize("rate", [0.2, 0.45])
@pytest.mark.parametrize("seed", range(3))
def test_feature_cutoff_zeroes_whole_dimensions_per_sentence(rate, seed):
    d = 20
    emb = no_zero_embeddings(len(LENGTHS), T_MAX, d, seed)
    torch.manual_seed(seed)
    out = feature_cutoff(emb, rate)
    chosen = []
    for i in range(len(LENGTHS)):
        zero_dims = [k for k in range(d) if bool((out[i, :, k] == 0).all())]
        assert len(zero_dims) == exact_floor(d, rate)
        chosen.append(tuple(zero_dims))
        for k in range(d):
            if k not in zero_dims:
                assert torch.equal(out[i, :, k], emb[i, :, k])
    assert len(set(chosen)) > 1  # drawn per sentence


@pytest.mark.parametrize("rate", [0.2, 0.1])
@pytest.mark.parametrize("seed", range(3))
def test_embedding_dropout_zeroes_exact_count_among_real_rows(rate, seed):
    d = 12
    emb = no_zero_embeddings(len(LENGTHS), T_MAX, d, seed)
    mask = padded_mask()
    torch.manual_seed(seed)
    out = embedding_dropout(emb, mask, rate)
    for i, n in enumerate(LENGTHS):
        assert int((out[i, :n] == 0).sum()) == exact_floor(n * d, rate)
        assert torch.equal(out[i, n:], emb[i, n:])  # padding untouched
        kept = out[i, :n] != 0
        assert torch.equal(out[i, :n][kept], emb[i, :n][kept])  # no 1/(1−p) rescaling


@pytest.mark.parametrize("eps", [1.0, 0.3])
def test_fgv_noise_has_norm_eps_along_the_gradient(eps):
    grad = rand(3, 5, 7, seed=70)
    grad[1, 2] = 0.0
    noise = fgv_noise(grad, eps)
    for i in range(3):
        for t in range(5):
            g, z = grad[i, t].double(), noise[i, t].double()
            if float(g.norm()) == 0.0:
                assert float(z.abs().max()) == 0.0
                continue
            assert float(z.norm()) == pytest.approx(eps, abs=TOL)
            assert cos(z, g) == pytest.approx(1.0, abs=TOL)
            for k in range(7):
                assert float(z[k]) == pytest.approx(eps * float(g[k]) / float(g.norm()), abs=TOL)


def test_consert_encode_views_cuts_tokens_at_the_transformer_input(tiny_bert):
    """The views are applied to what the transformer stack receives: a token_cutoff row has exactly
    ⌊n_i·0.15⌋ zero rows among its real tokens and is otherwise the plain embedding output; a
    feature_cutoff row has ⌊d·0.2⌋ zero dimensions; a ``none`` row is the plain output."""
    from raysent.methods.consert import ConSERT, ConSERTParams
    from raysent.models.encoder import Encoder

    encoder = Encoder.load(tiny_bert)
    method = ConSERT(encoder, ConSERTParams(augmentations=("token_cutoff", "feature_cutoff")))
    method.eval()  # the encoder's own dropout off: untouched rows compare exactly
    sentences = ["a man with a hat is playing a guitar on the busy street corner tonight again",
                 "three small dogs run across a wide green field", "the cat sleeps"]
    tok = dict(encoder.tokenizer(sentences, padding=True, return_tensors="pt"))
    tok = {"input_ids": tok["input_ids"], "attention_mask": tok["attention_mask"]}
    lengths = tok["attention_mask"].sum(1).tolist()
    assert [exact_floor(n, 0.15) for n in lengths][:2] != [0, 0]
    seen = []

    def hook(module, args, kwargs):
        seen.append((args[0] if args else kwargs["hidden_states"]).detach().clone())

    handle = encoder.model.encoder.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            method.encode_views(tok, ["none"] * 3)
            torch.manual_seed(0)
            method.encode_views(tok, ["token_cutoff"] * 3)
            torch.manual_seed(1)
            method.encode_views(tok, ["token_cutoff", "feature_cutoff", "none"])
    finally:
        handle.remove()
    assert len(seen) == 3
    plain, cut, mixed = seen
    t_max, d = plain.shape[1], plain.shape[2]
    assert not bool((plain == 0).all(dim=-1).any())  # the plain output has no zero rows
    for i, n in enumerate(lengths):
        zero_rows = [t for t in range(t_max) if bool((cut[i, t] == 0).all())]
        assert len(zero_rows) == exact_floor(n, 0.15)
        assert all(t < n for t in zero_rows)
        for t in range(t_max):
            if t not in zero_rows:
                assert torch.equal(cut[i, t], plain[i, t])
    zero_rows = [t for t in range(t_max) if bool((mixed[0, t] == 0).all())]
    assert len(zero_rows) == exact_floor(lengths[0], 0.15)
    zero_dims = [k for k in range(d) if bool((mixed[1, :, k] == 0).all())]
    assert len(zero_dims) == exact_floor(d, 0.2)
    keep = [k for k in range(d) if k not in zero_dims]
    assert torch.equal(mixed[1][:, keep], plain[1][:, keep])
    assert torch.equal(mixed[2], plain[2])


# =========================================================================== 5. SupCon (Liao 2021, Eq. 2)
# 3 premises (groups 7, 8, 9), 3 hypotheses each, interleaved; group 9 has no entailment.
SCL_GROUPS = torch.tensor([7, 8, 9, 7, 8, 9, 7, 8, 9])
SCL_LABELS = torch.tensor([1, 0, 2, 0, 2, 1, 2, 0, 1])  # 0 entailment, 1 neutral, 2 contradiction
SCL_ANCHOR_GROUPS = torch.tensor([7, 8, 9])


def ref_scl_anchor(anchor, cands, pos_idx, neg_idx, tau, sim):
    logits = {k: sim(anchor, cands[k]) / tau for k in list(pos_idx) + list(neg_idx)}
    log_z = logsumexp(list(logits.values()))
    return -sum(logits[j] - log_z for j in pos_idx) / len(pos_idx)


def scl_sets(g):
    pos = [k for k in range(len(SCL_GROUPS)) if int(SCL_GROUPS[k]) == g and int(SCL_LABELS[k]) == 0]
    neg = [k for k in range(len(SCL_GROUPS)) if k not in pos]
    return pos, neg


def scl_inputs():
    return rand(3, 6, seed=80) * 0.7, rand(9, 6, seed=81) * 0.7


@pytest.mark.parametrize("normalize,sim", [(False, dot), (True, cos)])
@pytest.mark.parametrize("tau", [1.0, 0.3])
def test_scl_loss_equals_liao_eq2(normalize, sim, tau):
    anchors, cands = scl_inputs()
    total, used = scl_loss(anchors, SCL_ANCHOR_GROUPS, cands, SCL_GROUPS, SCL_LABELS, tau, normalize=normalize)
    ref, ref_used = 0.0, 0
    for i, g in enumerate(SCL_ANCHOR_GROUPS.tolist()):
        pos, neg = scl_sets(g)
        if not pos:
            continue
        ref += ref_scl_anchor(anchors[i], cands, pos, neg, tau, sim)
        ref_used += 1
    assert (used, ref_used) == (2, 2)  # group 9 has no entailment: skipped
    assert total.item() == pytest.approx(ref, abs=TOL)
    # dot and cosine give different losses here (the test sees which one is used)
    other = dot if sim is cos else cos
    alt = sum(ref_scl_anchor(anchors[i], cands, *scl_sets(g), tau, other) for i, g in enumerate([7, 8]))
    assert abs(alt - ref) > 1e-3


def test_scl_loss_group_and_label_both_decide_positives():
    """Hand check of the sets: anchor 7's positive is candidate 3 only; anchor 8's are 1 and 7."""
    assert scl_sets(7) == ([3], [0, 1, 2, 4, 5, 6, 7, 8])
    assert scl_sets(8) == ([1, 7], [0, 2, 3, 4, 5, 6, 8])
    anchors, cands = scl_inputs()
    # anchor 8 alone: its two positives, every other candidate as negative
    total, used = scl_loss(anchors[1:2], SCL_ANCHOR_GROUPS[1:2], cands, SCL_GROUPS, SCL_LABELS, 1.0)
    assert used == 1
    assert total.item() == pytest.approx(ref_scl_anchor(anchors[1], cands, [1, 7], [0, 2, 3, 4, 5, 6, 8], 1.0, dot),
                                         abs=TOL)


@pytest.mark.parametrize("seed", range(4))
def test_scl_loss_caps_use_one_positive_and_two_negatives(seed):
    """pos_cap=1, neg_cap=2: the sum equals the reference for some choice of 1 positive and 2
    negatives per anchor (and not the uncapped loss)."""
    anchors, cands = scl_inputs()
    tau = 0.5
    torch.manual_seed(seed)
    total, used = scl_loss(anchors, SCL_ANCHOR_GROUPS, cands, SCL_GROUPS, SCL_LABELS, tau, pos_cap=1, neg_cap=2)
    assert used == 2
    per_anchor = []
    for i, g in enumerate([7, 8]):
        pos, neg = scl_sets(g)
        per_anchor.append([ref_scl_anchor(anchors[i], cands, [p], list(ns), tau, dot)
                           for p in pos for ns in itertools.combinations(neg, 2)])
    sums = [x + y for x, y in itertools.product(*per_anchor)]
    assert min(abs(total.item() - s) for s in sums) < TOL
    uncapped = sum(ref_scl_anchor(anchors[i], cands, *scl_sets(g), tau, dot) for i, g in enumerate([7, 8]))
    assert abs(total.item() - uncapped) > 1e-3


def test_scl_loss_caps_above_the_counts_are_all():
    anchors, cands = scl_inputs()
    full, _ = scl_loss(anchors, SCL_ANCHOR_GROUPS, cands, SCL_GROUPS, SCL_LABELS, 1.0)
    capped, _ = scl_loss(anchors, SCL_ANCHOR_GROUPS, cands, SCL_GROUPS, SCL_LABELS, 1.0, pos_cap=5, neg_cap=20)
    assert capped.item() == pytest.approx(full.item(), abs=TOL)


# =========================================================================== 6. Layer-wise attention pooler
def ref_layer_attention(pooler: LayerAttentionPooler, states, mask) -> torch.Tensor:
    """Oh et al. 2022 Eq. 1-5 with loops over sentences and layers, float64."""
    wq, wk, wv = (m.weight.detach().double() for m in (pooler.w_q, pooler.w_k, pooler.w_v))
    w, bias = pooler.mlp.dense.weight.detach().double(), pooler.mlp.dense.bias.detach().double()
    n_layers = len(states)
    outs = []
    for b in range(mask.shape[0]):
        n = int(mask[b].sum())
        hc = [states[i][b, 0].double() for i in range(n_layers)]
        ha = []
        for j in range(n_layers):
            acc = torch.zeros_like(hc[0])
            for t in range(n):
                acc = acc + states[j][b, t].double()
            ha.append(acc / n)
        h_l = []
        for i in range(n_layers):
            q = wq @ hc[i]
            scores = [float(torch.dot(q, wk @ ha[j])) for j in range(n_layers)]
            log_z = logsumexp(scores)
            alpha = [math.exp(s - log_z) for s in scores]
            h_l.append(sum(alpha[j] * (wv @ ha[j]) for j in range(n_layers)))
        h_big_l = sum(h_l) / n_layers
        outs.append(torch.tanh(w @ torch.cat([hc[-1], h_big_l]) + bias))
    return torch.stack(outs)


def make_pooler_inputs(seed):
    torch.manual_seed(seed)
    pooler = LayerAttentionPooler(8)
    with torch.no_grad():  # larger weights than BERT's init, so the attention is far from uniform
        for m in (pooler.w_q, pooler.w_k, pooler.w_v, pooler.mlp.dense):
            m.weight.normal_(0, 0.5)
        pooler.mlp.dense.bias.normal_(0, 0.5)
    lengths = [6, 4, 2]
    mask = padded_mask(lengths, 6)
    states = tuple(rand(3, 6, 8, seed=seed * 10 + k) for k in range(5))  # N = 5 hidden states
    return pooler, states, mask


@pytest.mark.parametrize("seed", [1, 2])
def test_layer_attention_pooler_equals_eq1_to_5(seed):
    pooler, states, mask = make_pooler_inputs(seed)
    with torch.no_grad():
        got = pooler(states, mask)
        alpha, _ = pooler.attention(states, mask)
    ref = ref_layer_attention(pooler, states, mask)
    assert got.shape == (3, 8)
    assert torch.allclose(got.double(), ref, atol=TOL, rtol=0)
    assert torch.allclose(alpha.sum(-1), torch.ones(3, 5), atol=1e-6)
    assert float(alpha.max() - alpha.min()) > 0.1  # the test is not run with a flat attention


def test_layer_attention_pooler_ignores_padding():
    pooler, states, mask = make_pooler_inputs(3)
    polluted = tuple(torch.where(mask[:, :, None].bool(), s, torch.full_like(s, 1e6)) for s in states)
    with torch.no_grad():
        clean, dirty = pooler(states, mask), pooler(polluted, mask)
    assert torch.allclose(dirty.double(), ref_layer_attention(pooler, states, mask), atol=TOL, rtol=0)
    assert torch.allclose(clean, dirty, atol=TOL, rtol=0)


# =========================================================================== 7. LayerAtt objectives
@pytest.fixture(scope="module")
def layeratt_encoder(tiny_bert):
    from raysent.models.encoder import Encoder

    return Encoder.load(tiny_bert)


def _tok(encoder, sentences):
    t = encoder.tokenizer(sentences, padding=True, return_tensors="pt")
    return {"input_ids": t["input_ids"], "attention_mask": t["attention_mask"]}


@pytest.mark.parametrize("objective", ["eq6", "eq7", "eq8"])
def test_layeratt_objectives_backpropagate_into_the_pooler(layeratt_encoder, objective):
    from raysent.methods.layeratt import LayerAtt, LayerAttParams

    enc = layeratt_encoder
    torch.manual_seed(0)
    method = LayerAtt(enc, LayerAttParams(objective=objective))
    sent0 = ["a man plays a guitar", "two dogs run in a field", "the sun is hot today"]
    sent1 = ["someone makes music", "animals are outside", "it is warm"]
    hard = ["nobody is playing anything at all tonight", "the dogs sleep", "it is snowing hard in the city"]
    if objective == "eq7":
        batch = {"text": _tok(enc, sent0)}
    elif objective == "eq6":
        batch = {"sent0": _tok(enc, sent0), "sent1": _tok(enc, sent1)}
    else:
        batch = {"sent0": _tok(enc, sent0), "sent1": _tok(enc, sent1), "hard_neg": _tok(enc, hard)}
    method.train()
    out = method(batch)
    assert torch.isfinite(out.loss) and out.loss.item() > 0
    out.loss.backward()
    grad = method.pooler.w_q.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and float(grad.abs().sum()) > 0

    # without dropout, the loss is the paper's objective over the pooled vectors (Eq. 6/7/8)
    method.eval()
    with torch.no_grad():
        loss = method(batch).loss.item()
        h0 = method.pooled(batch["sent0"] if objective != "eq7" else batch["text"])
        tau = method.params.temperature
        if objective == "eq7":
            ref = ref_hard_negative_rows(h0, h0, h0[:0], tau, 0.0)  # two identical views, no extra block
        else:
            h1 = method.pooled(batch["sent1"])
            neg = method.pooled(batch["hard_neg"]) if objective == "eq8" else h1[:0]
            ref = ref_hard_negative_rows(h0, h1, neg, tau, 0.0)
    assert loss == pytest.approx(sum(ref) / len(ref), abs=1e-4)


def test_sg_opt_official_views_mean_pooled_with_bert_f_dropout_on(tiny_bert):
    """The authors' code (galsang/SG-BERT) pools BERT_F's layers with mean and, its `train()` undoing the
    `eval()`, runs BERT_F with dropout: `view_pooling: mean` + `frozen_dropout: true`. The paper's setting
    (max, BERT_F fixed) stays the default; the two are search choices."""
    from raysent.methods.sg import SelfGuidedOpt, SGOptParams
    from raysent.models.encoder import Encoder

    encoder = Encoder.load(tiny_bert)
    tok = encoder.tokenizer(SG_SENTENCES, padding=True, return_tensors="pt")
    tok = {"input_ids": tok["input_ids"], "attention_mask": tok["attention_mask"]}
    paper = SelfGuidedOpt(encoder, SGOptParams(head_width=64))
    assert (paper.params.view_pooling, paper.params.frozen_dropout) == ("max", False)
    paper.train()
    assert not paper.frozen.training and torch.equal(paper.views(tok), paper.views(tok))  # fixed: no dropout

    official = SelfGuidedOpt(Encoder.load(tiny_bert), SGOptParams(head_width=64, view_pooling="mean",
                                                                  frozen_dropout=True))
    official.train()
    assert official.frozen.training
    torch.manual_seed(0)
    first = official.views(tok)
    assert not torch.equal(first, official.views(tok))  # dropout: other views at every call
    official.frozen.eval()
    with torch.no_grad():
        states = official.frozen(**tok, output_hidden_states=True, return_dict=True).hidden_states
    lengths = tok["attention_mask"].sum(1).tolist()
    want = torch.stack([torch.stack([layer[i, :lengths[i]].mean(dim=0) for layer in states])
                        for i in range(len(lengths))])
    torch.testing.assert_close(official.views(tok), want, rtol=1e-5, atol=1e-5)
