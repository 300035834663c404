"""One entry point for every evaluation: :func:`evaluate_tasks` (``raysent eval --tasks ...``).

Tasks (the values allowed in ``eval.tasks`` of an experiment YAML and in ``--tasks``):

=========  ==========================================================  ============================
task       what                                                        module
=========  ==========================================================  ============================
sts        STS12-16, STS-B, SICK-R: Spearman ×100 of cosine            :mod:`raysent.eval.sts`
senteval   MR CR SUBJ MPQA SST-2 TREC MRPC: probe accuracy ×100        :mod:`raysent.eval.senteval`
search     FAISS semantic search: MRR@10, recall@k, latency, memory    :mod:`raysent.eval.retrieval`
geometry   alignment, uniformity, singular-value spectrum              :mod:`raysent.eval.geometry`
sts17      multilingual / cross-lingual STS17: Pearson ×100            :mod:`raysent.eval.sts17`
=========  ==========================================================  ============================

The model is embedded through one cache: a sentence shared by several tasks (STS-B test is read
by ``sts``, ``search`` and ``geometry``) is embedded once. The result is an
:class:`~raysent.eval.results.Evaluation`: each task's typed result, whose ``metrics()`` are flat,
MLflow-safe names (``sts/stsb``, ``senteval/MR``, ``search/mrr_at_10``, ``geometry/alignment``,
``sts17/en-en``), and ``table()``, a printable summary.
Imports no Ray and no MLflow.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from raysent.errors import RaysentError, did_you_mean
from raysent.eval.geometry import evaluate_geometry
from raysent.eval.names import EVAL_TASKS
from raysent.eval.results import Evaluation, TaskResult
from raysent.eval.retrieval import evaluate_search
from raysent.eval.senteval import evaluate_senteval
from raysent.eval.sts import evaluate_sts
from raysent.eval.sts17 import evaluate_sts17

# Lazy imports: raysent's heavier modules (heavy, and only the functions that need them import them).

TASK_TITLES = {"sts": "STS", "senteval": "SentEval transfer", "search": "Semantic search", "geometry": "Geometry",
               "sts17": "STS17"}


def check_tasks(tasks: str | Sequence[str], field: str = "tasks") -> list[str]:
    """``'sts,senteval'`` or a list -> the validated, de-duplicated list (error names the allowed values)."""
    if isinstance(tasks, str):
        tasks = [t.strip() for t in tasks.split(",") if t.strip()]
    tasks = list(dict.fromkeys(tasks))
    if not tasks:
        raise RaysentError(f"{field}: no evaluation task given; allowed: {', '.join(EVAL_TASKS)}")
    for t in tasks:
        if t not in EVAL_TASKS:
            raise RaysentError(f"{field}: unknown evaluation task {t!r}{did_you_mean(str(t), EVAL_TASKS)}; "
                               f"allowed: {', '.join(EVAL_TASKS)}")
    return tasks


class EmbeddingCache:
    """``encode(sentences)`` that remembers every vector: each distinct sentence is embedded once."""

    def __init__(self, encode: Callable[[Sequence[str]], np.ndarray]):
        self.encode = encode
        self.vectors: dict[str, np.ndarray] = {}
        self.seconds = 0.0

    def __call__(self, sentences: Sequence[str]) -> np.ndarray:
        missing = [s for s in dict.fromkeys(sentences) if s not in self.vectors]
        if missing:
            t0 = time.perf_counter()
            vecs = np.asarray(self.encode(missing))
            self.seconds += time.perf_counter() - t0
            if len(vecs) != len(missing):
                raise RaysentError(f"the encoder returned {len(vecs)} vectors for {len(missing)} sentences")
            self.vectors.update(zip(missing, vecs))
        if not len(sentences):
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([self.vectors[s] for s in sentences])

    def __len__(self) -> int:
        return len(self.vectors)


def make_encode(model: Any, pooling: str | None = None, max_length: int = 256, batch_size: int = 128
                ) -> Callable[[Sequence[str]], np.ndarray]:
    """A sentence -> vector function from an :class:`~raysent.models.encoder.Encoder` or a callable."""
    from raysent.models.encoder import Encoder

    if isinstance(model, Encoder):
        from raysent.models.embedder import Embedder
        from raysent.models.pooling import check_pooling, describe_allowed

        pooling = pooling or model.meta.pooling
        if pooling is None:
            raise RaysentError(f"a pooling is needed to embed with {model.source} (it has no raysent.json); "
                               f"allowed: {describe_allowed()}")
        check_pooling(pooling, "pooling", error=RaysentError)
        return Embedder(lambda tok: model.embed(tok, pooling), model.tokenizer, module=model,
                        max_length=max_length, batch_size=batch_size)
    if callable(model):
        if pooling is not None:
            raise RaysentError("pooling applies to an Encoder; a callable encode(sentences) embeds by itself")
        return model
    raise RaysentError(f"expected an Encoder or a function encode(sentences) -> array, got {type(model).__name__}")


def _task_functions() -> dict[str, Callable[..., TaskResult]]:
    return {"sts": evaluate_sts, "senteval": evaluate_senteval, "search": evaluate_search,
            "geometry": evaluate_geometry, "sts17": evaluate_sts17}


def _check_options(task: str, fn: Callable, options: dict) -> None:
    sig = inspect.signature(fn)
    named = [p for p in list(sig.parameters)[1:] if p not in ("progress",)
             and sig.parameters[p].kind is not inspect.Parameter.VAR_KEYWORD]
    extra = []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()) and task == "senteval":
        extra = ["optim", "batch_size", "tenacity", "epoch_size", "max_epoch", "dropout"]
    for key in options:
        if key not in named + extra:
            raise RaysentError(f"unknown option {key!r} for the {task} task{did_you_mean(key, named + extra)}; "
                               f"allowed: {', '.join(named + extra)}")


def evaluate_tasks(
    model: Any,
    tasks: str | Sequence[str] = ("sts",),
    *,
    pooling: str | None = None,
    max_length: int = 256,
    batch_size: int = 128,
    max_samples: int | None = None,
    options: dict[str, dict] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Evaluation:
    """Evaluate a model on several tasks; one embedding cache for all of them.

    ``model``: an :class:`~raysent.models.encoder.Encoder` (with ``pooling``, or the pooling its
    ``raysent.json`` names) or any ``encode(sentences) -> np.ndarray [N, d]`` (e.g. an
    :class:`~raysent.models.embedder.Embedder`). ``options``: per task, keyword arguments of its
    evaluator, e.g. ``{"senteval": {"tasks": ["CR"], "classifier": "mlp"}, "search": {"data":
    "quora-duplicates"}, "sts": {"aggregation": "wmean"}}``. ``max_samples`` caps the data of
    senteval, search, geometry and sts17 (a quick check; noted on the result), not of sts.

    Returns an :class:`~raysent.eval.results.Evaluation`: each task's typed result (``.sts``, ``.senteval``,
    ...), ``metrics()`` (flat names), ``table()``, ``seconds`` (per task, ``embedding``, ``total``),
    ``sentences_embedded`` and ``notes``.
    """
    tasks = check_tasks(tasks)
    options = dict(options or {})
    for key in options:
        if key not in EVAL_TASKS:
            raise RaysentError(f"options: unknown task {key!r}{did_you_mean(key, EVAL_TASKS)}; "
                               f"allowed: {', '.join(EVAL_TASKS)}")
    fns = _task_functions()
    for t in tasks:
        _check_options(t, fns[t], options.get(t, {}))
    cache = EmbeddingCache(make_encode(model, pooling, max_length, batch_size))
    t_all = time.perf_counter()
    details: dict[str, TaskResult] = {}
    seconds: dict[str, float] = {}
    notes: list[str] = []
    for t in tasks:
        kwargs = dict(options.get(t, {}))
        if max_samples is not None:
            if t == "sts":
                notes.append("max_samples does not apply to sts: the STS sets are always evaluated whole")
            else:
                kwargs.setdefault("max_samples", max_samples)
        t0 = time.perf_counter()
        details[t] = fns[t](cache, progress=progress, **kwargs)
        seconds[t] = time.perf_counter() - t0
        notes += [f"{t}: {n}" if not n.startswith(t) else n for n in details[t].notes]
    seconds["embedding"] = cache.seconds
    seconds["total"] = time.perf_counter() - t_all
    return Evaluation(tasks=tasks, **details, seconds=seconds, sentences_embedded=len(cache),
                      notes=list(dict.fromkeys(notes)))
