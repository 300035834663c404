"""ConSERT's settings where the paper is silent and only the official scripts (yym6472/ConSERT
scripts/*-base.sh) say: the views of each supervision mode and stage, the second stage's epochs, and the
joint script's max(u, v)² classifier feature; and the paper's own values kept where it states one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysent.config import parse_config
from raysent.methods.consert import ConSERT, ConSERTParams

from conftest import RAW_BERT


def config(supervision: str, **params) -> dict:
    return {"name": "c", "method": "consert", "model": {"name": RAW_BERT},
            "params": {"supervision": supervision, **params}}


@pytest.mark.parametrize("supervision, views, epochs", [
    ("unsup", ("feature_cutoff", "shuffle"), 10),  # unsup-consert-base.sh: --da_final_1/2, --num_epochs 10
    ("joint", ("none", "token_cutoff"), 1),  # sup-consert-joint-base.sh: cutoff row; main.py's 1 epoch
    ("sup-unsup", ("none", "feature_cutoff"), 25),  # sup-consert-sup-unsup-base.sh: cutoff column, 25 epochs
    ("joint-unsup", ("none", "shuffle"), 25),  # sup-consert-joint-unsup-base.sh: shuffle, 25 epochs
])
def test_views_and_epochs_default_to_the_official_scripts(supervision, views, epochs):
    cfg = parse_config(config(supervision))
    assert cfg.method_params.augmentations == views and cfg.train.epochs == epochs
    # what the paper states stays (§4.1): encoder dropout off, cutoff rates 0.15 / 0.2, last-two-layer evaluation
    assert cfg.model.dropout == 0.0 and cfg.method_params.eval_pooling == "last2_avg"
    assert (cfg.method_params.token_cutoff_rate, cfg.method_params.feature_cutoff_rate) == (0.15, 0.2)
    assert cfg.method_params.classifier_max_square is False  # Eq. 2: (r1, r2, |r1 − r2|)


def test_each_stage_trains_with_its_own_views():
    joint_unsup = parse_config(config("joint-unsup"))
    (_, first), (_, second) = ConSERT.stages(joint_unsup)
    assert first["params"]["supervision"] == "joint" and first["params"]["augmentations"] == ["none", "token_cutoff"]
    assert second["params"]["supervision"] == "unsup" and second["params"]["augmentations"] == ["none", "shuffle"]
    mine = parse_config(config("joint-unsup", augmentations=["shuffle", "token_cutoff"],
                               sup_augmentations=["none", "adversarial"]))
    (_, first), (_, second) = ConSERT.stages(mine)
    assert first["params"]["augmentations"] == ["none", "adversarial"]
    assert second["params"]["augmentations"] == ["shuffle", "token_cutoff"]
    (_, _), (_, second) = ConSERT.stages(parse_config(config("sup-unsup")))
    assert second["params"]["augmentations"] == ["none", "feature_cutoff"]
    with pytest.raises(ValueError, match="second view of sup_augmentations"):
        ConSERTParams(supervision="joint-unsup", sup_augmentations=["adversarial", "none"])


def test_the_joint_scripts_max_square_feature_matches_its_classifier(raw_encoder):
    """classifier_max_square: the official AdvCLSoftmaxLoss._reps_to_output concatenates rep_a, rep_b,
    |rep_a − rep_b| and max(rep_a, rep_b)² and applies one Linear; the joint loss's CE equals that, computed
    here in numpy from the classifier's weights and the two pooled views."""
    torch.manual_seed(0)
    method = ConSERT(raw_encoder, ConSERTParams(supervision="joint", classifier_max_square=True))
    method.eval()
    h = raw_encoder.hidden_size
    assert method.classifier.linear.in_features == 4 * h
    u, v = torch.randn(5, h), torch.randn(5, h)
    a, b = u.numpy().astype(np.float64), v.numpy().astype(np.float64)
    feats = np.concatenate([a, b, np.abs(a - b), np.maximum(a, b) ** 2], axis=1)
    w = method.classifier.linear.weight.detach().numpy().astype(np.float64)
    bias = method.classifier.linear.bias.detach().numpy().astype(np.float64)
    np.testing.assert_allclose(method.classifier(u, v).detach().numpy(), feats @ w.T + bias, rtol=1e-5, atol=1e-5)

    tok = raw_encoder.tokenizer(["a man plays a guitar .", "two dogs run on the beach ."], padding=True,
                                return_tensors="pt")
    tok = {"input_ids": tok["input_ids"], "attention_mask": tok["attention_mask"]}
    batch = {"premise": {k: t[:1] for k, t in tok.items()}, "hypothesis": {k: t[1:] for k, t in tok.items()},
             "labels": torch.tensor([2])}
    with torch.no_grad():
        out = method(batch)
        r = method.encode_views(tok, ["none", "none"])  # the CE's view ('none': no augmentation, dropout off)
    x = np.concatenate([r[0].numpy(), r[1].numpy(), np.abs(r[0].numpy() - r[1].numpy()),
                        np.maximum(r[0].numpy(), r[1].numpy()) ** 2]).astype(np.float64)
    logits = w @ x + bias
    ce = float(np.log(np.exp(logits - logits.max()).sum()) + logits.max() - logits[2])
    assert float(out.metrics["loss_ce"]) == pytest.approx(ce, rel=1e-5)


def test_checkpoints_are_selected_on_select_pooling_and_the_model_keeps_eval_pooling(raw_encoder, tmp_path):
    """select_pooling: mean is the scripts' selection (last-layer mean); the saved model is still evaluated
    with eval_pooling (last2_avg, §4.1)."""
    from raysent.models.encoder import Encoder

    tok = dict(raw_encoder.tokenizer(["a man plays a guitar .", "the cat sleeps"], padding=True, return_tensors="pt"))
    tok = {"input_ids": tok["input_ids"], "attention_mask": tok["attention_mask"]}
    paper = ConSERT(raw_encoder, ConSERTParams())
    script = ConSERT(raw_encoder, ConSERTParams(select_pooling="mean"))
    paper.eval()
    with torch.no_grad():
        torch.testing.assert_close(paper.embed(tok), raw_encoder.embed(tok, "last2_avg"), rtol=0, atol=0)
        torch.testing.assert_close(script.embed(tok), raw_encoder.embed(tok, "mean"), rtol=0, atol=0)
        assert not torch.allclose(script.embed(tok), paper.embed(tok))
    script.export(tmp_path / "best")
    assert Encoder.load(str(tmp_path / "best")).meta.pooling == "last2_avg"
    with pytest.raises(ValueError, match="select_pooling"):
        ConSERTParams(select_pooling="avg")


def test_encoder_dropout_is_off_by_default_and_the_scripts_setting_keeps_it():
    """§4.1 removes BERT's dropout (model.dropout: 0); the official supervised scripts keep it (model.dropout:
    null: the checkpoint's own, 0.1 for BERT)."""
    from raysent.train.run import build_method

    for dropout, expected in ((None, 0.0), ("keep", 0.1)):
        raw = config("joint")
        if dropout == "keep":
            raw["model"] = {"name": RAW_BERT, "dropout": None}
        method = build_method(parse_config(raw))
        ps = {m.p for m in method.encoder.modules() if isinstance(m, torch.nn.Dropout)}
        assert ps == {expected}, (dropout, ps)
