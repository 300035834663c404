"""What every evaluator returns: one typed result per task, and :class:`Evaluation`, the suite's result.

One contract for every evaluator (as sentence-transformers' ``SentenceEvaluator``): a result names its
``task`` and its ``primary_metric`` (the number a search or a table would rank by) and answers
``metrics() -> dict[str, float]``, its numbers under flat, MLflow-safe names (``sts/stsb``, ``senteval/MR``,
``search/mrr_at_10``, ``geometry/alignment``, ``sts17/en-en``: letters, digits and ``_ - . / :`` only), and
``table()``, a printable summary. The full result (every aggregation, sub-set, fold, source) stays on it, so a
run record keeps it (:attr:`raysent.train.records.RunRecord.eval`) and a table reads it by attribute.

==========  =====================  ========================
task        result                 primary metric
==========  =====================  ========================
sts         :class:`StsResult`      ``sts/avg``
senteval    :class:`SentEvalResult` ``senteval/avg``
search      :class:`RetrievalResult` ``search/mrr_at_<k>``
geometry    :class:`GeometryResult` ``geometry/alignment``
sts17       :class:`Sts17Result`    ``sts17/avg``
==========  =====================  ========================

Pydantic models, frozen: they are written into run records and read back (a record's evaluation is
validated against them). Imports nothing heavy: the record schema and the reports read these types without
loading an evaluator.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

Aggregation = Literal["all", "mean", "wmean"]
Correlation = Literal["spearman", "pearson"]
AGGREGATIONS: tuple[Aggregation, ...] = ("all", "mean", "wmean")
CORRELATIONS: tuple[Correlation, ...] = ("spearman", "pearson")
STS_LABELS = {"sts12": "STS12", "sts13": "STS13", "sts14": "STS14", "sts15": "STS15", "sts16": "STS16",
              "stsb": "STS-B", "sickr": "SICK-R"}


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TaskResult(_Result):
    """The contract of every evaluator's result: its task, its primary metric, its flat metrics, its table."""

    task: ClassVar[str]
    notes: list[str] = Field(default_factory=list)
    seconds: float = 0.0

    @property
    def primary_metric(self) -> str:
        """The name (a key of :meth:`metrics`) of the number this result is ranked by."""
        raise NotImplementedError

    @property
    def primary_score(self) -> float:
        return self.metrics()[self.primary_metric]

    def metrics(self) -> dict[str, float]:
        """Every number under its flat, MLflow-safe name (``<task>/<name>``)."""
        raise NotImplementedError

    def table(self, title: str = "") -> str:
        """A printable summary."""
        raise NotImplementedError


def row_table(title: str, heads: list[str], vals: list[str], foot: str = "") -> str:
    """Two right-aligned rows (heads, values) under a title: one task's table."""
    widths = [max(len(h), len(v)) for h, v in zip(heads, vals)]
    lines = [title] if title else []
    lines += ["  ".join(h.rjust(w) for h, w in zip(heads, widths)),
              "  ".join(v.rjust(w) for v, w in zip(vals, widths))]
    if foot:
        lines.append(foot)
    return "\n".join(lines)


# --------------------------------------------------------------------------- STS
class SubsetScore(_Result):
    """One sub-set of an STS year (STS12's MSRpar, ...)."""

    n: int
    spearman: float
    pearson: float


class PairScores(_Result):
    """Spearman and Pearson ×100 of cosine against gold on one set of scored pairs, in the three aggregations of
    its sub-sets (they coincide for a set without sub-sets)."""

    n: int
    spearman_all: float
    pearson_all: float
    spearman_mean: float
    spearman_wmean: float
    pearson_mean: float
    pearson_wmean: float
    subsets: dict[str, SubsetScore] | None = None

    def correlation(self, correlation: Correlation = "spearman", aggregation: Aggregation = "all") -> float:
        values: dict[str, float] = {"spearman_all": self.spearman_all, "spearman_mean": self.spearman_mean,
                                    "spearman_wmean": self.spearman_wmean, "pearson_all": self.pearson_all,
                                    "pearson_mean": self.pearson_mean, "pearson_wmean": self.pearson_wmean}
        return values[f"{correlation}_{aggregation}"]


class StsSetScore(PairScores):
    """One STS test set: every aggregation, and the headline ``spearman``/``pearson`` in the chosen one."""

    spearman: float
    pearson: float


class StsResult(TaskResult):
    """The seven STS test sets (:func:`raysent.eval.sts.evaluate_sts`); ``avg``: the mean of the headline
    Spearman numbers (the papers' last column)."""

    task: ClassVar[str] = "sts"
    aggregation: Aggregation
    tasks: dict[str, StsSetScore]
    avg: float
    avg_pearson: float
    sources: dict[str, str] = Field(default_factory=dict)

    @property
    def primary_metric(self) -> str:
        return "sts/avg"

    def metrics(self) -> dict[str, float]:
        m: dict[str, float] = {}
        for name, v in self.tasks.items():
            m[f"sts/{name}"] = float(v.spearman)
            m[f"sts/{name}/pearson"] = float(v.pearson)
        m["sts/avg"] = float(self.avg)
        return m

    def score(self, task: str, aggregation: Aggregation = "all", correlation: Correlation = "spearman"
              ) -> float | None:
        """One set's correlation in any aggregation (None: the set was not evaluated)."""
        s = self.tasks.get(task)
        return None if s is None else s.correlation(correlation, aggregation)

    def table(self, title: str = "") -> str:
        """The papers' table: STS12 … SICK-R and Avg. (Spearman ×100 in the chosen aggregation)."""
        heads = [STS_LABELS.get(t, t) for t in self.tasks] + ["Avg."]
        vals = [f"{s.spearman:.2f}" for s in self.tasks.values()] + [f"{self.avg:.2f}"]
        notes = "; " + "; ".join(self.notes) if self.notes else ""
        return row_table(title, heads, vals,
                         f"(Spearman x100 of cosine; STS12-16 aggregated as '{self.aggregation}'{notes})")


# --------------------------------------------------------------------------- SentEval
class SentEvalTaskScore(_Result):
    """One transfer task under SentEval's protocol (its fields per protocol: ``regs``/``fold_acc`` for nested
    k-fold, ``reg``/``scores`` for k-fold and split, ``f1`` for MRPC)."""

    acc: float
    devacc: float
    ndev: int
    ntest: int
    ntrain: int | None = None
    f1: float | None = None
    reg: float | None = None
    regs: list[float] | None = None
    scores: list[float] | None = None
    fold_acc: list[float] | None = None
    not_converged: int = 0
    fits: int = 0
    protocol: str
    features: int
    source: str = ""
    mrpc_features: str | None = None
    notes: list[str] = Field(default_factory=list)
    seconds: float = 0.0


class SentEvalResult(TaskResult):
    """SentEval transfer accuracies ×100 (:func:`raysent.eval.senteval.evaluate_senteval`); ``avg``: their mean."""

    task: ClassVar[str] = "senteval"
    tasks: dict[str, SentEvalTaskScore]
    avg: float
    probe: dict[str, Any] = Field(default_factory=dict)

    @property
    def primary_metric(self) -> str:
        return "senteval/avg"

    def metrics(self) -> dict[str, float]:
        m: dict[str, float] = {}
        for name, v in self.tasks.items():
            m[f"senteval/{name}"] = float(v.acc)
            m[f"senteval/{name}/devacc"] = float(v.devacc)
            if v.f1 is not None:
                m[f"senteval/{name}/f1"] = float(v.f1)
        m["senteval/avg"] = float(self.avg)
        return m

    def table(self, title: str = "") -> str:
        names = list(self.tasks)
        heads = names + ["Avg."]
        vals = [f"{self.tasks[n].acc:.2f}" for n in names] + [f"{self.avg:.2f}"]
        mrpc = self.tasks.get("MRPC")
        if mrpc is not None and mrpc.f1 is not None:
            heads.insert(names.index("MRPC") + 1, "MRPC-F1")
            vals.insert(names.index("MRPC") + 1, f"{mrpc.f1:.2f}")
        head = title or (f"SentEval transfer (test accuracy x100; {self.probe.get('name')}, "
                         f"kfold={self.probe.get('kfold')})")
        return row_table(head, heads, vals)


# --------------------------------------------------------------------------- semantic search
class RetrievalResult(TaskResult):
    """FAISS semantic search (:func:`raysent.eval.retrieval.evaluate_search`): MRR@``mrr_k``, recall@k, latency,
    index size; the corpus and queries it was built from."""

    task: ClassVar[str] = "search"
    mrr_k: int
    mrr: float
    recall: dict[int, float]
    ms_per_query: float
    batch_ms_per_query: float
    index_mb: float
    index_build_s: float
    queries: int
    corpus: int
    multi_relevant_queries: int
    excluded_self_matches: int
    min_score: float
    index: str
    faiss_threads: int
    data: str
    source: str

    @property
    def primary_metric(self) -> str:
        return f"search/mrr_at_{self.mrr_k}"

    def metrics(self) -> dict[str, float]:
        m = {f"search/mrr_at_{self.mrr_k}": float(self.mrr)}
        m.update({f"search/recall_at_{k}": float(v) for k, v in self.recall.items()})
        m.update({f"search/{k}": float(getattr(self, k)) for k in ("ms_per_query", "batch_ms_per_query", "index_mb",
                                                                  "queries", "corpus")})
        return m

    def table(self, title: str = "") -> str:
        heads = [f"MRR@{self.mrr_k}"] + [f"R@{k}" for k in self.recall] + ["ms/query", "index MB"]
        vals = ([f"{100 * self.mrr:.2f}"] + [f"{100 * v:.2f}" for v in self.recall.values()]
                + [f"{self.ms_per_query:.3f}", f"{self.index_mb:.2f}"])
        head = title or (f"Semantic search ({self.data}, score >= {self.min_score:g}: {self.queries:,} queries, "
                         f"{self.corpus:,} documents; x100)")
        return row_table(head, heads, vals)


# --------------------------------------------------------------------------- geometry
class GeometryResult(TaskResult):
    """Alignment and uniformity (Wang & Isola 2020) and the singular-value spectrum
    (:func:`raysent.eval.geometry.evaluate_geometry`)."""

    task: ClassVar[str] = "geometry"
    alignment: float
    uniformity: float
    effective_rank: float
    top1_energy: float
    singular_values: list[float]
    positive_pairs: int
    sentences: int
    data: str
    source: str
    min_score: float

    @property
    def primary_metric(self) -> str:
        return "geometry/alignment"

    def metrics(self) -> dict[str, float]:
        return {"geometry/alignment": float(self.alignment), "geometry/uniformity": float(self.uniformity),
                "geometry/effective_rank": float(self.effective_rank),
                "geometry/top1_energy": float(self.top1_energy)}

    def table(self, title: str = "") -> str:
        head = title or f"Geometry ({self.data}: {self.positive_pairs:,} positive pairs, {self.sentences:,} sentences)"
        return row_table(head, ["align", "uniform", "eff. rank", "top-1 energy"],
                         [f"{self.alignment:.4f}", f"{self.uniformity:.4f}", f"{self.effective_rank:.1f}",
                          f"{self.top1_energy:.3f}"])


# --------------------------------------------------------------------------- STS17
class Sts17Track(_Result):
    pearson: float
    spearman: float
    n: int
    source: str


class Sts17Result(TaskResult):
    """Multilingual and cross-lingual STS17 (:func:`raysent.eval.sts17.evaluate_sts17`); ``avg``: mean Pearson."""

    task: ClassVar[str] = "sts17"
    tracks: dict[str, Sts17Track]
    avg: float
    avg_spearman: float

    @property
    def primary_metric(self) -> str:
        return "sts17/avg"

    def metrics(self) -> dict[str, float]:
        m: dict[str, float] = {}
        for track, v in self.tracks.items():
            m[f"sts17/{track}"] = float(v.pearson)
            m[f"sts17/{track}/spearman"] = float(v.spearman)
        m["sts17/avg"] = float(self.avg)
        m["sts17/avg/spearman"] = float(self.avg_spearman)
        return m

    def table(self, title: str = "") -> str:
        names = list(self.tracks)
        return row_table(title or "STS17 (Pearson x100 of cosine; Spearman in the JSON)", names + ["Avg."],
                         [f"{self.tracks[n].pearson:.2f}" for n in names] + [f"{self.avg:.2f}"])


# --------------------------------------------------------------------------- the suite
class Evaluation(_Result):
    """What :func:`raysent.eval.suite.evaluate_tasks` returns and a final run's record keeps: each task's result,
    in the order asked (``tasks``), the seconds per task and for embedding, the sentences embedded and the notes."""

    tasks: list[str]
    sts: StsResult | None = None
    senteval: SentEvalResult | None = None
    search: RetrievalResult | None = None
    geometry: GeometryResult | None = None
    sts17: Sts17Result | None = None
    seconds: dict[str, float] = Field(default_factory=dict)
    sentences_embedded: int | None = None
    notes: list[str] = Field(default_factory=list)

    def results(self) -> list[TaskResult]:
        """Each task's result, in the order of ``tasks``."""
        by_task: dict[str, TaskResult | None] = {"sts": self.sts, "senteval": self.senteval, "search": self.search,
                                                 "geometry": self.geometry, "sts17": self.sts17}
        return [r for t in self.tasks if (r := by_task.get(t)) is not None]

    def details(self) -> dict[str, TaskResult]:
        """Each task's result by its name."""
        return {r.task: r for r in self.results()}

    @property
    def primary_metric(self) -> str:
        """The first task's primary metric."""
        results = self.results()
        if not results:
            raise ValueError("an evaluation of no task has no primary metric")
        return results[0].primary_metric

    def metrics(self) -> dict[str, float]:
        """Every task's metrics, flat (``sts/stsb``, ``senteval/MR``, ``search/mrr_at_10``, ...)."""
        out: dict[str, float] = {}
        for r in self.results():
            out.update(r.metrics())
        return out

    def table(self, title: str = "") -> str:
        """A printable summary: one small table per task, then the times and notes."""
        titles = {"sts": "STS (Spearman x100)"}
        parts = [title] if title else []
        parts += [r.table(titles.get(r.task, "")) for r in self.results()]
        tail = []
        if self.seconds:
            tail.append("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items()))
        tail += [f"note: {n}" for n in self.notes]
        if tail:
            parts.append("\n".join(tail))
        return "\n\n".join(parts)


def migrate_v2_evaluation(data: dict[str, Any]) -> dict[str, Any]:
    """A version-2 record's ``eval`` (``{"metrics": {...}, "details": {task: result}}``) as an :class:`Evaluation`'s
    fields: the details by task (the flat metrics are the results' own :meth:`~TaskResult.metrics`), a search
    result's ``mrr_at_<k>``/``recall_at_<k>`` as ``mrr_k``, ``mrr`` and ``recall``."""
    details = dict(data.get("details") or {})
    if isinstance(details.get("search"), dict):
        old = dict(details["search"])
        mrr = next((k for k in old if k.startswith("mrr_at_")), None)
        recall = {int(k[len("recall_at_"):]): old.pop(k) for k in list(old) if k.startswith("recall_at_")}
        if mrr is not None:
            old.update(mrr_k=int(mrr[len("mrr_at_"):]), mrr=old.pop(mrr))
        details["search"] = {**old, "recall": recall}
    return {"tasks": list(details), **details}
