"""What every method is: an ``nn.Module`` whose ``forward(batch)`` returns the training loss.

A method owns the encoder and whatever heads its paper adds. The trainer (raysent.train) knows
nothing about any method: it gives the method batches, calls ``forward``, steps the optimizer,
and asks the method for inference embeddings (``embed``) and an exported model (``export``).

Negatives across workers: the trainer injects a :class:`Gatherer`. ``gather(x)`` returns the
rows of ``x`` from every worker concatenated (this worker's rows carry their gradient, and the
gradient reaches the other workers' rows too), and ``offset`` is where this worker's rows start.
With one worker it is the identity, so a loss written as "local rows against gathered columns"
is the same code on 1 and N workers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from raysent.methods.spec import PREVIOUS_STAGE_BEST, MethodParams, MethodSpec, PoolingParams
from raysent.models.encoder import Encoder
from raysent.models.heads import MLPHead
from raysent.models.pooling import inference_pooling, pool, uses_mlp

__all__ = ["PREVIOUS_STAGE_BEST", "Gatherer", "LossOutput", "Method", "MethodParams", "PoolingParams", "Speedups"]


class Gatherer:
    """Identity gatherer (one worker). The distributed one lives in raysent.train.gather."""

    rank: int = 0
    world_size: int = 1

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def offset(self, local_rows: int) -> int:
        return self.rank * local_rows

    def gather_nograd(self, x: torch.Tensor) -> torch.Tensor:
        return x


@dataclass
class Speedups:
    """How a method computes, not what: switches that keep the loss and gradients unchanged.

    Set by the training loop from ``train`` (raysent.config.TrainConfig); tests compare each on and off.
    """

    concat_views: bool = True  # every view / field of a batch in one concatenated forward
    cache_views: bool = True  # SG: BERT_F's views computed once per sentence (raysent.methods.sg)


@dataclass
class LossOutput:
    """A step's loss and the parts a method reports beside it (each a detached tensor on the device: reading one
    as a number would make the host wait on the device, so nothing reads them inside a step)."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


def nli_fields(data):
    """Premise and hypothesis texts; labels and premise-group ids as extras."""
    groups = {p: i for i, p in enumerate(dict.fromkeys(data.premise))}
    return ({"premise": data.premise, "hypothesis": data.hypothesis},
            {"labels": data.labels, "group": [groups[p] for p in data.premise]})


def batch_views(tok: dict, n: int) -> dict:
    """The same tokenized batch repeated ``n`` times along the batch axis (one forward, n views)."""
    return {k: torch.cat([v] * n, dim=0) for k, v in tok.items()}


def concat_batches(*toks: dict) -> dict:
    """Several tokenized batches stacked into one (padded to the longest), for one forward."""
    width = max(t["input_ids"].shape[1] for t in toks)
    out: dict[str, list] = {}
    for t in toks:
        for k, v in t.items():
            pad = width - v.shape[1]
            out.setdefault(k, []).append(nn.functional.pad(v, (0, pad), value=0) if pad else v)
    return {k: torch.cat(v, dim=0) for k, v in out.items()}


class Method(MethodSpec, nn.Module):
    """Base class. Subclasses take their description from their spec (:mod:`raysent.methods.spec`: name, paper,
    Params, the paper's defaults) and implement ``forward``."""

    def __init__(self, encoder: Encoder, params: MethodParams):
        super().__init__()
        self.encoder = encoder
        self.params = params
        self.gatherer: Gatherer = Gatherer()
        self.speedups = Speedups()
        pooling = getattr(params, "pooling", None)
        self.mlp = MLPHead(encoder.hidden_size) if pooling and uses_mlp(pooling, training=True) else None

    # ------------------------------------------------------------ training data
    def fields(self, data) -> tuple[dict[str, list[str]], dict[str, Any]]:
        """Texts to tokenize per batch field, and extra per-example arrays (labels, groups)."""
        return {"text": data.sentences()}, {}

    def groups(self, data):
        """Per-example group ids when a batch must keep groups together (SupCon), else None."""
        return None

    def set_gatherer(self, gatherer: Gatherer) -> None:
        self.gatherer = gatherer

    def prepare(self, data, device: torch.device, log=None) -> dict:
        """Precompute what the method can once for the whole training data (SG: BERT_F's views); returns
        what it recorded (kept in the run's result.json under ``prepare``)."""
        return {}

    def encode_parts(self, toks: list[dict], pool_fn=None) -> list[torch.Tensor]:
        """Training embeddings of several tokenized batches (views, or the fields of a triplet).

        One concatenated forward (``speedups.concat_views``, the default) or one forward each: the
        same vectors either way (dropout aside). ``pool_fn(hidden_states, mask)`` defaults to the
        method's training pooling.
        """
        pool_fn = pool_fn or self.pool_train
        if self.speedups.concat_views and len(toks) > 1:
            tok = concat_batches(*toks)
            z = pool_fn(self.encoder(**tok), tok["attention_mask"])
            return list(z.split([t["input_ids"].shape[0] for t in toks]))
        return [pool_fn(self.encoder(**t), t["attention_mask"]) for t in toks]

    # ------------------------------------------------------------ encoding
    def pool_train(self, hidden_states, attention_mask, pooling: str | None = None) -> torch.Tensor:
        # a method whose params have no ``pooling`` overrides this and inference_pooling
        pooling = pooling or cast(PoolingParams, self.params).pooling
        return pool(pooling, hidden_states, attention_mask, mlp=self.mlp, training=True)

    def inference_pooling(self) -> str:
        return inference_pooling(cast(PoolingParams, self.params).pooling)

    def embed(self, tok: dict) -> torch.Tensor:
        """Inference sentence vectors for one tokenized batch (the method's evaluation pooling)."""
        pooling = self.inference_pooling()
        mlp = self.mlp if uses_mlp(pooling, training=False) else None
        return self.encoder.embed(tok, pooling, mlp=mlp)

    def embeds_with(self) -> tuple[dict[str, Any], list[dict[str, torch.Tensor]]]:
        """What :meth:`embed` reads: a description (its pooling) and the weights it uses, as state dicts (not a
        pooler drawn at random that the pooling never reads: :meth:`Encoder.weights_read`). The untuned model's dev
        scores are reused under these (:mod:`raysent.train.initial_dev`), so a method that overrides ``embed``
        overrides this too (tests/train/test_initial_dev.py holds every registered method to it)."""
        pooling = self.inference_pooling()
        mlp = self.mlp if uses_mlp(pooling, training=False) else None
        return {"pooling": pooling}, [self.encoder.weights_read(pooling, mlp)] + (
            [mlp.state_dict()] if mlp is not None else [])

    def inference_head(self) -> nn.Module | None:
        """The trained head the inference pooling reads (SimCSE's [CLS] MLP), saved with the model."""
        return self.mlp

    def export(self, path, extra: dict | None = None, max_length: int = 256):
        """Save the inference model: a save_pretrained folder any HF tool loads, a sentence-transformers model
        that reads ``max_length`` tokens per sentence, and raysent.json (the model card is written from it,
        :mod:`raysent.methods.card`)."""
        return self.encoder.save(path, pooling=self.inference_pooling(), mlp=self.inference_head(),
                                 extra={"method": self.name, "params": self.params.model_dump(mode="json"),
                                        **(extra or {})}, max_length=max_length)

    def trainable_parameters(self):
        return [p for p in self.parameters() if p.requires_grad]

    def ddp_ignored(self) -> list[str]:
        """Parameter/buffer names DDP must not synchronise (state kept local to each worker)."""
        return []

    def forward(self, batch: dict) -> LossOutput:  # pragma: no cover - abstract
        raise NotImplementedError
