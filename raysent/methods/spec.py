"""What each method is without its model: name, paper, hyperparameters and the paper's defaults. Imports no torch.

``raysent.config`` reads these to validate an experiment file, so that an error in it (``params.temprature``,
``train.lr: abc``) is said before torch, Ray or MLflow is imported (issue 47: under 1 s). The methods
(``raysent/methods/<method>.py``, one file each with its equations) take their description from here: ``class
SimCSEUnsup(SimCSEUnsupSpec, Method)``; ``tests/methods/test_method_names.py`` checks that every registered
method is its spec's subclass.

Defaults cite the paper (or the official script) they come from, as the method files did.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from raysent.errors import RaysentError, did_you_mean
from raysent.methods.papers import CONSERT, LAYERATT, SBERT, SELF_GUIDED, SIMCSE, SUPCON
from raysent.models.pooling import check_pooling

PREVIOUS_STAGE_BEST = "<previous stage's best model>"


class MethodParams(BaseModel):
    """Base of every method's hyperparameters: typed, defaults from the paper, no unknown keys."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)  # as raysent.config


class PoolingParams(MethodParams):
    pooling: str = "cls_mlp_train"

    @field_validator("pooling")
    @classmethod
    def _pooling(cls, v):
        return check_pooling(v, "pooling")


class MethodSpec:
    """Base class of the descriptions. Subclasses set the class attributes."""

    name: ClassVar[str]
    paper: ClassVar[str]  # "Authors Year. Title" of the paper whose equations the method's file implements
    arxiv: ClassVar[str | None] = None  # the paper's arXiv id (raysent.methods.papers)
    citation: ClassVar[str | None] = None  # its BibTeX entry
    summary: ClassVar[str]
    Params: ClassVar[type[MethodParams]] = MethodParams
    kind: ClassVar[str] = "sentences"  # the training data it needs: sentences | triplets | nli_pairs
    seeds: ClassVar[tuple[int, ...]] = (42,)
    variants: ClassVar[dict[str, tuple]] = {}  # selectable variants, listed by `raysent methods`
    model_defaults: ClassVar[dict[str, Any]] = {}
    data_defaults: ClassVar[dict[str, Any]] = {}
    train_defaults: ClassVar[dict[str, Any]] = {}
    eval_defaults: ClassVar[dict[str, Any]] = {}
    trains: ClassVar[bool] = True  # False for the no-tuning baseline
    # gradient caching (raysent.models.chunked.GradCache) needs every encoder call of a step to be a plain
    # function of the token ids; a method that acts inside the encoder per row (ConSERT) says False
    supports_grad_cache: ClassVar[bool] = True
    # "module:Class" of the method (the spec's subclass with the torch model): the one registry, SPECS, names it,
    # and raysent.methods.registry imports it (a spec is read before torch loads)
    implementation: ClassVar[str]

    @classmethod
    def defaults(cls, params: MethodParams) -> dict[str, dict]:
        """Paper defaults for the config parts (may depend on the method's params)."""
        return {"model": dict(cls.model_defaults), "data": dict(cls.data_defaults),
                "train": dict(cls.train_defaults), "eval": dict(cls.eval_defaults)}

    @classmethod
    def data_kind(cls, params: MethodParams) -> str:
        return cls.kind

    @classmethod
    def stages(cls, cfg) -> list[tuple[str, dict]] | None:
        """Multi-stage methods (ConSERT's sup-unsup, joint-unsup): ``[(label, overrides), ...]``, each
        stage's config being the experiment's with those overrides (raysent.config.with_overrides);
        ``model.name`` may be :data:`PREVIOUS_STAGE_BEST`. None: one stage."""
        return None


# --------------------------------------------------------------------------- SimCSE (Gao, Yao, Chen 2021)
class SimCSEUnsupParams(PoolingParams):
    temperature: float = Field(0.05, gt=0, description="τ (Gao et al. 2021, §3)")
    pooling: str = Field("cls_mlp_train", description="[CLS]+MLP at train, [CLS] at test (SimCSE §6.3)")


class SimCSEUnsupSpec(MethodSpec):
    """Paper defaults (SimCSE's run_unsup_example.sh, BERT-base): wiki1m, 1 epoch, batch 64, lr 3e-5, max length
    32, τ 0.05, STS-B dev every 125 steps."""

    name = "simcse-unsup"
    implementation = "raysent.methods.simcse_unsup:SimCSEUnsup"
    paper = "Gao, Yao, Chen 2021. SimCSE: Simple Contrastive Learning of Sentence Embeddings"
    arxiv, citation = SIMCSE.arxiv, SIMCSE.citation
    summary = "two dropout views of each sentence, in-batch negatives, InfoNCE (Eq. 1)"
    Params = SimCSEUnsupParams
    kind = "sentences"
    data_defaults = {"train": "wiki1m"}
    train_defaults = {"batch_size": 64, "lr": 3e-5, "max_length": 32, "eval_every": 125, "epochs": 1}


class SimCSESupParams(PoolingParams):
    temperature: float = Field(0.05, gt=0, description="τ (Gao et al. 2021)")
    hard_negative_weight: float = Field(0.0, description="w added to each anchor's own hard-negative logit "
                                        "(log of SimCSE's α, Table 7; 0 = α 1, the paper's best)")
    pooling: str = Field("cls", description="[CLS] with the MLP at train and test (SimCSE §6.3)")


class SimCSESupSpec(MethodSpec):
    """Paper defaults (SimCSE's run_sup_example.sh): NLI triplets, 3 epochs, batch 512, lr 5e-5, max length 32."""

    name = "simcse-sup"
    implementation = "raysent.methods.simcse_sup:SimCSESup"
    paper = "Gao, Yao, Chen 2021. SimCSE: Simple Contrastive Learning of Sentence Embeddings"
    arxiv, citation = SIMCSE.arxiv, SIMCSE.citation
    summary = "NLI (premise, entailment, contradiction); contradictions as hard negatives (Eq. 5)"
    Params = SimCSESupParams
    kind = "triplets"
    data_defaults = {"train": "nli-triplets"}
    train_defaults = {"batch_size": 512, "lr": 5e-5, "epochs": 3, "max_length": 32, "eval_every": 125}


# --------------------------------------------------------------------------- SG, SG-OPT (Kim, Yoo, Lee 2021)
class SGParams(MethodParams):
    loss: Literal["base", "opt1", "opt2", "opt3"] = Field("base", description="L^base, L^opt1, L^opt2, L^opt3")
    temperature: float = Field(0.01, gt=0, description="τ (Table 8)")
    reg_lambda: float = Field(0.1, ge=0, description="λ of λ·‖θ_F − θ_T‖² (Table 8)")
    view_pooling: Literal["max", "mean"] = Field("max", description="p: pooling of BERT_F's layers (§3.1)")
    layers: tuple[int, int] | None = Field(None, description="[first, last] layer of BERT_F used for views "
                                           "(inclusive; 0 = embeddings); null: all 0..l")
    head_width: int = Field(4096, gt=0, description="width of the projection head f (footnote 4)")
    frozen_dropout: bool = Field(False, description="run BERT_F with dropout (the official code does)")

    @model_validator(mode="after")
    def _layers(self):
        if self.layers is not None and not 0 <= self.layers[0] <= self.layers[1]:
            raise ValueError(f"layers must be [first, last] with 0 <= first <= last, got {list(self.layers)}")
        return self


class SGOptParams(SGParams):
    loss: Literal["base", "opt1", "opt2", "opt3"] = Field("opt3", description="L^opt3 (SG-OPT)")


class SelfGuidedSpec(MethodSpec):
    """Table 8 and the official code (galsang/SG-BERT): batch 16, lr 5e-5, Adam β (0.9, 0.9), 1 epoch, STS-B dev
    every 50 steps with patience 10, max length 128, 10 % warmup; the paper's 8 seeds."""

    name = "sg"
    implementation = "raysent.methods.sg:SelfGuided"
    paper = "Kim, Yoo, Lee 2021. Self-Guided Contrastive Learning for BERT Sentence Representations"
    arxiv, citation = SELF_GUIDED.arxiv, SELF_GUIDED.citation
    summary = "BERT_T's [CLS] pulled to BERT_F's layer views through a projection head; L^base by default"
    Params = SGParams
    kind = "sentences"
    seeds = (1, 2, 3, 4, 1234, 2345, 3456, 7890)
    variants = {"loss": ("base", "opt1", "opt2", "opt3"), "view_pooling": ("max", "mean")}
    data_defaults = {"train": "stsb-unlabeled"}
    train_defaults = {"batch_size": 16, "lr": 5e-5, "adam_betas": (0.9, 0.9), "epochs": 1, "eval_every": 50,
                      "patience": 10, "max_length": 128, "warmup_ratio": 0.1}


class SelfGuidedOptSpec(SelfGuidedSpec):
    name = "sg-opt"
    implementation = "raysent.methods.sg:SelfGuidedOpt"
    summary = "SG with the optimised loss L^opt: every layer's view guides [CLS] (L^opt3 + λ·L^reg)"
    Params = SGOptParams


# --------------------------------------------------------------------------- ConSERT (Yan et al. 2021)
AUGMENTATIONS = ("none", "shuffle", "token_cutoff", "feature_cutoff", "dropout", "adversarial")

# the official scripts' view pairs (yym6472/ConSERT scripts/*-base.sh), by supervision mode; the paper
# compares views for unsup only (Figure 5: feature_cutoff + shuffle is its best pair)
SCRIPT_VIEWS: dict[str, tuple[str, str]] = {
    "unsup": ("feature_cutoff", "shuffle"),  # unsup-consert-base.sh
    "joint": ("none", "token_cutoff"),  # sup-consert-joint-base.sh: cutoff, direction row
    "sup-unsup": ("none", "feature_cutoff"),  # sup-consert-sup-unsup-base.sh, stage 2: cutoff, direction column
    "joint-unsup": ("none", "shuffle"),  # sup-consert-joint-unsup-base.sh, stage 2
}

class ConSERTParams(PoolingParams):
    supervision: Literal["unsup", "joint", "sup-unsup", "joint-unsup"] = Field("unsup", description="§3.3")
    augmentations: tuple[str, str] = Field(  # type: ignore[assignment]  # None until the validator sets the default
        None, description="the two views (§3.2); default by supervision, the official scripts' (see the module)",
        validate_default=False)
    sup_augmentations: tuple[str, str] = Field(  # type: ignore[assignment]  # None until the validator sets it
        None, description="joint-unsup: the views of the joint first stage (default none + token_cutoff, the joint "
        "script's)", validate_default=False)
    classifier_max_square: bool = Field(False, description="joint: add max(r1, r2)² to Eq. 2's classifier "
                                        "features, as the official joint script does")
    token_cutoff_rate: float = Field(0.15, ge=0, lt=1)
    feature_cutoff_rate: float = Field(0.2, ge=0, lt=1)
    dropout_rate: float = Field(0.2, ge=0, lt=1)
    adv_epsilon: float = Field(1.0, gt=0, description="FGV perturbation norm per token")
    temperature: float = Field(0.1, gt=0, description="τ of NT-Xent (§4.1, §5.4)")
    con_weight: float = Field(0.15, ge=0, description="α of L_ce + α·L_con (joint)")
    pooling: str = Field("mean", description="training pooling (§3.1)")
    eval_pooling: str = Field("last2_avg", description="evaluation pooling (§4.1)")
    select_pooling: str | None = Field(None, description="pooling of the dev evaluation that selects the best "
                                       "checkpoint; null: eval_pooling (§4.1). The official scripts select on "
                                       "last-layer mean pooling: mean")
    sup_lr: float = Field(2e-5, gt=0, description="learning rate of the supervised first stage")
    sup_epochs: int = Field(1, gt=0, description="epochs of the supervised first stage")

    @field_validator("augmentations", "sup_augmentations", mode="before")
    @classmethod
    def _aug(cls, v):
        if v is None:
            return None  # filled in by supervision (_adversarial)
        v = list(v) if isinstance(v, (list, tuple)) else v
        if not isinstance(v, list) or len(v) != 2:
            raise ValueError(f"two views are needed, e.g. [feature_cutoff, shuffle]; got {v!r}")
        for a in v:
            if a not in AUGMENTATIONS:
                raise ValueError(f"unknown augmentation {a!r}; allowed: {', '.join(AUGMENTATIONS)}")
        return tuple(v)

    @model_validator(mode="after")
    def _adversarial(self):
        if self.augmentations is None:
            self.augmentations = SCRIPT_VIEWS[self.supervision]
        if self.sup_augmentations is None:
            self.sup_augmentations = SCRIPT_VIEWS["joint"]
        if "adversarial" in self.sup_augmentations and self.sup_augmentations[0] == "adversarial":
            raise ValueError("'adversarial' must be the second view of sup_augmentations")
        if "adversarial" in self.augmentations:
            if self.supervision != "joint":
                raise ValueError("the 'adversarial' view needs the supervised loss's gradient: only with "
                                 "supervision 'joint'")
            if self.augmentations[0] == "adversarial":
                raise ValueError("'adversarial' must be the second view: its perturbation comes from the "
                                 "supervised loss of the first view")
        check_pooling(self.eval_pooling, "eval_pooling")
        if self.select_pooling is not None:
            check_pooling(self.select_pooling, "select_pooling")
        return self

    def rates(self) -> dict[str, float]:
        return {"token_cutoff": self.token_cutoff_rate, "feature_cutoff": self.feature_cutoff_rate,
                "dropout": self.dropout_rate}


class ConSERTSpec(MethodSpec):
    """Defaults by supervision, from §4.1 and the official scripts (yym6472/ConSERT scripts/*-base.sh): see
    raysent/methods/consert.py."""

    name = "consert"
    implementation = "raysent.methods.consert:ConSERT"
    paper = "Yan et al. 2021. ConSERT: A Contrastive Framework for Self-Supervised Sentence Representation Transfer"
    arxiv, citation = CONSERT.arxiv, CONSERT.citation
    summary = "two augmented views at the embedding layer, NT-Xent over 2N; unsup/joint/sup-unsup/joint-unsup"
    Params = ConSERTParams
    variants = {"supervision": ("unsup", "joint", "sup-unsup", "joint-unsup"), "augmentations": AUGMENTATIONS}
    model_defaults = {"dropout": 0.0}
    supports_grad_cache = False  # the augmentations act on the embedding layer's output, row by row

    @classmethod
    def defaults(cls, params: MethodParams) -> dict[str, dict]:
        d = super().defaults(params)
        params = cast(ConSERTParams, params)
        joint = params.supervision == "joint"
        two_stage = params.supervision in ("sup-unsup", "joint-unsup")
        d["train"] = {"batch_size": 96, "max_length": 64, "eval_every": 200, "warmup_ratio": 0.1,
                      "lr": 2e-5 if joint else 5e-7, "epochs": 1 if joint else 25 if two_stage else 10,
                      **({} if joint else {"patience": 10})}
        d["data"] = {"train": "snli"} if joint else {"train": "sts-unlabeled"}
        if params.supervision in ("sup-unsup", "joint-unsup"):
            d["data"]["sup"] = "snli"
        return d

    @classmethod
    def data_kind(cls, params: MethodParams) -> str:
        return "nli_pairs" if cast(ConSERTParams, params).supervision == "joint" else "sentences"

    @classmethod
    def stages(cls, cfg) -> list[tuple[str, dict]] | None:
        """Two-stage modes: (label, overrides) per stage; the last stage is the run itself."""
        p = cfg.method_params
        if p.supervision not in ("sup-unsup", "joint-unsup"):
            return None
        if p.supervision == "sup-unsup":
            first = {"method": "sbert-nli", "params": {"pooling": p.pooling, "eval_pooling": p.eval_pooling},
                     "model.dropout": None}
        else:
            first = {"params": {**cfg.params, "supervision": "joint", "augmentations": list(p.sup_augmentations)}}
        first.update({"data.train": cfg.data.sup, "lr": p.sup_lr, "epochs": p.sup_epochs, "patience": None,
                      "data.max_train_samples": cfg.data.max_train_samples})
        second = {"params": {**cfg.params, "supervision": "unsup", "augmentations": list(p.augmentations)},
                  "model.name": PREVIOUS_STAGE_BEST}
        return [("stage1-" + ("sbert-nli" if p.supervision == "sup-unsup" else "joint"), first),
                ("stage2-unsup", second)]


# ------------------------------------------------------------------- layer-wise attention pooling (Oh et al. 2022)
TABLE4 = {"eq6": {"batch_size": 256, "lr": 1e-5}, "eq7": {"batch_size": 64, "lr": 3e-5},
          "eq8": {"batch_size": 256, "lr": 2e-5}}


# The paper states no max length, epochs or evaluation cadence. For the supervised objectives the
# authors' script (nlpods/LayerAttPooler run_sup_layerattnpooler.sh: --max_seq_length 64
# --num_train_epochs 3 --eval_steps 100, 4 GPUs × 64 = Table 4's batch 256) gives them; for Eq. 7 there is
# no script, so SimCSE's unsupervised setting, which the paper follows.
OFFICIAL_SUPERVISED = {"max_length": 64, "epochs": 3, "eval_every": 100}
SIMCSE_UNSUP = {"max_length": 32, "epochs": 1, "eval_every": 125}


class LayerAttParams(MethodParams):
    objective: Literal["eq6", "eq7", "eq8"] = Field("eq7", description="training objective (§2.2)")
    temperature: float = Field(0.05, gt=0)
    inference: Literal["pooler", "cls"] = Field("pooler", description="keep the pooler at inference, or use "
                                                "the last layer's [CLS] (Table 3's semantic search)")


class LayerAttSpec(MethodSpec):
    name = "layeratt"
    implementation = "raysent.methods.layeratt:LayerAtt"
    paper = ("Oh et al. 2022. Don't Judge a Language Model by Its Last Layer: "
             "Contrastive Learning with Layer-Wise Attention Pooling")
    arxiv, citation = LAYERATT.arxiv, LAYERATT.citation
    summary = "attention over per-layer [CLS] and mean vectors + last-layer [CLS], MLP (Eq. 1-5); Eq. 6/7/8"
    Params = LayerAttParams
    variants = {"objective": ("eq6", "eq7", "eq8"), "inference": ("pooler", "cls")}

    @classmethod
    def defaults(cls, params: MethodParams) -> dict[str, dict]:
        d = super().defaults(params)
        p = cast(LayerAttParams, params)
        d["train"] = {**TABLE4[p.objective], **(OFFICIAL_SUPERVISED if p.objective != "eq7" else SIMCSE_UNSUP)}
        d["data"] = {"train": "wiki1m" if p.objective == "eq7" else "nli-triplets"}
        return d

    @classmethod
    def data_kind(cls, params: MethodParams) -> str:
        return "sentences" if cast(LayerAttParams, params).objective == "eq7" else "triplets"


# --------------------------------------------------------------------------- SBERT's NLI objective, SupCon (Liao 2021)
class SBERTNLIParams(PoolingParams):
    pooling: str = Field("mean", description="SBERT's mean pooling")
    eval_pooling: str | None = Field(None, description="evaluation pooling (null: the training pooling); ConSERT's "
                                                      "sup-unsup stage 1 sets its own (last2_avg), so the stage's "
                                                      "checkpoint is chosen, and the untuned model read, as ConSERT "
                                                      "evaluates")

    @field_validator("eval_pooling")
    @classmethod
    def _known_eval_pooling(cls, v):
        return check_pooling(v, "eval_pooling")


class SBERTNLISpec(MethodSpec):
    """SBERT's NLI setting as Liao 2021 trains its baseline: batch 64, lr 2e-5, 1 epoch, 10 % warmup, max length
    128, SNLI."""

    name = "sbert-nli"
    implementation = "raysent.methods.sbert_nli:SBERTNLI"
    paper = "Reimers & Gurevych 2019. Sentence-BERT (as the baseline of Liao 2021 and stage 1 of ConSERT sup-unsup)"
    arxiv, citation = SBERT.arxiv, SBERT.citation
    summary = "softmax classifier over (u, v, |u-v|) on NLI pairs, cross-entropy only"
    Params: ClassVar[type[SBERTNLIParams]] = SBERTNLIParams  # SupCon's params extend these
    kind = "nli_pairs"
    data_defaults = {"train": "snli"}
    train_defaults = {"batch_size": 64, "lr": 2e-5, "epochs": 1, "warmup_ratio": 0.1, "max_length": 128,
                      "eval_every": 250}


class SupConParams(SBERTNLIParams):
    pooling: str = Field("mean_no_cls", description="the paper's pooling: the mean of the output tokens except "
                         "[CLS] (§3; mean: SBERT's, [CLS] included)")
    scl_weight: float = Field(0.3, ge=0, le=1, description="λ of (1−λ)·CE + λ·SCL (Eq. 3)")
    temperature: float = Field(1.0, gt=0, description="τ (Table 7: best 1.0)")
    pos_cap: Literal["all"] | int = Field("all", description="N+: positives per anchor (all or a number)")
    neg_cap: Literal["all"] | int = Field("all", description="N−: negatives per anchor (all or a number)")
    scl_normalize: bool = Field(False, description="cosine instead of the paper's dot product")


class SupConSpec(SBERTNLISpec):
    name = "supcon"
    implementation = "raysent.methods.supcon:SupCon"
    paper = "Liao 2021. Sentence Embeddings using Supervised Contrastive Learning"
    arxiv, citation = SUPCON.arxiv, SUPCON.citation
    summary = "(1−λ)·CE over (u, v, |u−v|) + λ·SCL with N+ positives and N− negatives per premise (Eq. 3)"
    Params = SupConParams
    variants = {"pos_cap": ("all", "<n>"), "neg_cap": ("all", "<n>")}
    train_defaults = {"batch_size": 64, "lr": 2e-5, "epochs": 1, "warmup_ratio": 0.1, "max_length": 128,
                      "eval_every": 250}


# --------------------------------------------------------------------------- no tuning
class BaselineParams(PoolingParams):
    pooling: str = Field("mean", description="how vectors are read off the untuned encoder")


class BaselineSpec(MethodSpec):
    name = "baseline"
    implementation = "raysent.methods.baseline:Baseline"
    paper = "no tuning (the 'No tuning' rows of Kim et al. 2021 Table 1 and Yan et al. 2021 Table 2)"
    summary = "the raw encoder with any pooling; no training step"
    Params = BaselineParams
    kind = "sentences"
    trains = False
    data_defaults = {"train": "stsb:train"}
    train_defaults = {"max_steps": 1, "eval_at_start": True}


# --------------------------------------------------------------------------- the registry
# in `raysent methods`' order
SPECS: dict[str, type[MethodSpec]] = {
    cls.name: cls
    for cls in (SimCSEUnsupSpec, SimCSESupSpec, SelfGuidedSpec, SelfGuidedOptSpec, ConSERTSpec, LayerAttSpec,
                SupConSpec, SBERTNLISpec, BaselineSpec)
}


def get_spec(name: str) -> type[MethodSpec]:
    try:
        return SPECS[name]
    except KeyError:
        raise RaysentError(f"unknown method {name!r}{did_you_mean(name, SPECS)}; allowed: {', '.join(SPECS)}") \
            from None
