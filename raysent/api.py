"""raysent from Python (a notebook, a script): the four things the command line does, as functions.

============================================  ==========================================  =====================
function                                      returns                                     command
============================================  ==========================================  =====================
``raysent.search(config, overrides)``          :class:`SearchResult`                       ``raysent tune``
``raysent.fit(config, overrides)``             :class:`~raysent.train.records.TrainSummary`  ``raysent train``
``raysent.evaluate(model, tasks)``             :class:`EvalResult`                         ``raysent eval``
``raysent.load(path)``                         :class:`~raysent.models.sentence_encoder.SentenceEncoder`
============================================  ==========================================  =====================

``config`` is an experiment file's path, a mapping with its content, or an
:class:`~raysent.config.ExperimentConfig`; ``overrides`` are ``--set``'s ``{name: value}`` (flat hyperparameter
names or dotted paths). The commands call these functions: one path, two doors. Errors a user can cause are
:class:`~raysent.errors.RaysentError` with the message the command prints. (Named ``search``, ``fit`` and
``evaluate`` so as not to shadow the packages ``raysent.tune``, ``raysent.train`` and ``raysent.eval``.)
docs/python-api.md shows them at work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysent.config import ExperimentConfig, load_config, parse_config, user_overrides, with_overrides
from raysent.errors import RaysentError
from raysent.preflight import preflight
from raysent.report.runs import TASK_LABELS
from raysent.train import compile_cache
from raysent.train.records import read_record
from raysent.tune.space import WARM_ARMS
from raysent.tune.state import SearchState

if TYPE_CHECKING:  # pandas and the records load with the functions that return them
    import pandas as pd

    from raysent.eval.results import TaskResult
    from raysent.models.sentence_encoder import SentenceEncoder
    from raysent.train.records import RunRecord, TrainSummary
    from raysent.tune.state import Summary

# Lazy imports: torch (raysent.models), pandas, raysent's heavier modules (heavy, and only the functions that need
# them import them: the command line reads an experiment file through resolve_config, and refuses a bad one before
# torch, Ray or MLflow is imported).

ConfigLike = str | Path | Mapping[str, Any] | ExperimentConfig


def resolve_config(config: ConfigLike, overrides: Mapping[str, Any] | None = None) -> ExperimentConfig:
    """An experiment from a path, a mapping or a config, with ``overrides`` applied and validated."""
    if isinstance(config, ExperimentConfig):
        cfg = config
    elif isinstance(config, (str, Path)):
        cfg = load_config(config)
    elif isinstance(config, Mapping):
        cfg = parse_config(dict(config), source="<dict>")
    else:
        raise RaysentError(f"config: expected a path, a mapping or an ExperimentConfig, got {type(config).__name__}")
    return user_overrides(cfg, overrides) if overrides else cfg


def _source(config: ConfigLike) -> str:
    return str(config) if isinstance(config, (str, Path)) else getattr(config, "_source", "<config>")


# --------------------------------------------------------------------------- search
@dataclass
class SearchResult:
    """What a search leaves: the best configuration, the table, the records, where MLflow holds it."""

    experiment: str
    search: str  # its run id (its start time)
    best_hp: dict[str, Any]  # the searched values of the winner (empty: --final-only's configuration)
    table: pd.DataFrame  # the final phase's mean ± std per data set (raysent.report.table.Table.numbers)
    records: list[RunRecord]  # every run of the search and its final phase, read back from results/
    mlflow_run_id: str | None  # the search's parent run
    best_model_path: Path | None  # the winner's final run with the best dev score: a sentence-transformers folder
    registered_model: str | None  # ``models:/<name>/<version>`` when the model was registered
    results_dir: Path
    summary: Summary = field(repr=False)  # summary.json: what `raysent tune` prints
    # per arm (the search's runs, the searched best's final runs, the warm-start configuration's): how many of its
    # runs learned nothing (best dev checkpoint at step 0: they report the untouched encoder), of how many
    not_learned: dict[str, tuple[int, int]] = field(default_factory=dict)

    def load(self) -> SentenceEncoder:
        """The best model, ready to ``encode``."""
        if self.best_model_path is None:
            raise RaysentError(f"search {self.search} of {self.experiment} has no final best model")
        return load(self.best_model_path)

    @property
    def learning(self) -> str:
        """One line: per arm, the runs that learned nothing, of all (what :func:`search` prints, even quiet);
        in capitals when any run learned nothing."""
        parts = ", ".join(f"{arm} {k}/{n}" for arm, (k, n) in self.not_learned.items())
        if any(k for k, _ in self.not_learned.values()):
            return f"RUNS THAT LEARNED NOTHING (best dev checkpoint at step 0: the untouched encoder): {parts}"
        return f"runs that learned nothing (best dev checkpoint at step 0): {parts}"


def search(config: ConfigLike, overrides: Mapping[str, Any] | None = None, *, resume: bool = False,
           final_only: bool = False, address: str | None = None, quiet: bool = True) -> SearchResult:
    """``raysent tune``: search the experiment's space, run the best configuration on every seed, evaluate it,
    write results/ and MLflow. ``resume`` continues an interrupted search (or only logs its outcome again);
    ``final_only`` runs the configuration as given on every seed. ``quiet`` (the default) prints nothing while it
    runs (no progress lines, no Tune status tables); at the end it prints one line, quiet or not: per arm, how
    many runs learned nothing (:attr:`SearchResult.learning`). Raises :class:`~raysent.tune.publish.PublishError`
    when the search finished but MLflow did not take its outcome."""
    try:
        result = tune_search(config, overrides, resume=resume, final_only=final_only, address=address, quiet=quiet)
    except RaysentError as exc:
        if getattr(exc, "result", None) is not None:  # PublishError: the search itself finished
            print(exc.result.learning)  # type: ignore[attr-defined]  # a PublishError's result: a SearchResult
        raise
    print(result.learning)
    return result


def tune_search(config: ConfigLike, overrides: Mapping[str, Any] | None = None, *, resume: bool = False,
                final_only: bool = False, address: str | None = None, quiet: bool = True) -> SearchResult:
    """:func:`search` without its closing line: what `raysent tune` runs, which prints the whole summary."""
    from raysent.tune.driver import tune_experiment

    cfg = resolve_config(config, overrides)
    if address:
        cfg = with_overrides(cfg, {"resources.address": address})
    summary = tune_experiment(cfg, resume=resume, final_only=final_only, quiet=quiet, source=_source(config))
    result = search_result(summary)
    if summary.publish_error:
        from raysent.tune.publish import PublishError

        error = PublishError(summary.publish_error)
        error.result = result
        raise error
    return result


def search_result(summary: Summary) -> SearchResult:
    """The :class:`SearchResult` of a finished search's summary (summary.json)."""
    import pandas as pd

    from raysent.tune.publish import best_final, final_records, search_table

    exp = Path(summary.results)
    run = summary.search
    best = summary.best
    typed = [read_record(p) for p in sorted((exp / "runs").glob(f"*-{run}-*.json"))]
    finals = final_records(exp, run, best.config_id) if best else []
    chosen = best_final(finals) if finals else None
    published = summary.published
    table = (search_table(exp, run, best.config_id if best else None,
                          summary.vs_paper.paper if summary.vs_paper else None,
                          summary.warm_source or "paper").numbers() if finals else pd.DataFrame())
    return SearchResult(
        experiment=summary.experiment, search=run, best_hp=dict(best.hp) if best else {}, table=table,
        records=typed, mlflow_run_id=(published.parent_run_id if published else None) or _parent(exp),
        best_model_path=Path(chosen.best_model_dir) if chosen and chosen.best_model_dir else None,
        registered_model=published.registered.uri if published and published.registered else None,
        results_dir=exp, summary=summary, not_learned=not_learned(typed, summary))


def not_learned(records: Sequence[RunRecord], summary: Summary) -> dict[str, tuple[int, int]]:
    """Per arm of a search, (runs that learned nothing, runs): ``search`` (every configuration it tried), ``searched
    best`` (the winner's final runs) and the warm-start configuration's final runs, when it ran them. A method that
    does not train (``learned`` None) counts as neither."""
    best = summary.best.config_id if summary.best else None
    warm = summary.vs_paper.paper if summary.vs_paper else None
    arms: dict[str, list[RunRecord]] = {"search": [r for r in records if r.phase == "search"]}
    arms["searched best" if summary.best and summary.best.hp else "final"] = [
        r for r in records if r.phase == "final" and r.config_id == best]
    if warm is not None and warm != best:
        arms[WARM_ARMS[summary.warm_source or "paper"]] = [r for r in records if r.phase == "final"
                                                          and r.config_id == warm]
    return {arm: (sum(r.learned is False for r in runs), sum(r.learned is not None for r in runs))
            for arm, runs in arms.items() if runs}


def _parent(exp: Path) -> str | None:
    state = SearchState.load(exp)
    return state.parent_run_id if state else None


# --------------------------------------------------------------------------- fit
def fit(config: ConfigLike, overrides: Mapping[str, Any] | None = None, *, output_dir: str | Path | None = None,
        resume: bool = False, quiet: bool = True) -> TrainSummary:
    """``raysent train``: one configuration once (``train.seed``), in this process or on
    ``resources.workers`` Ray Train workers, after the same checks. The best model (a sentence-transformers
    folder) is ``summary.best_model_dir``."""
    cfg = resolve_config(config, overrides)
    if output_dir is not None:
        cfg = with_overrides(cfg, {"train.output_dir": str(output_dir)})
    preflight(cfg, output_dir=True)
    compile_cache.use_for(cfg)  # the experiment's compile caches, shared as a search's trials share them
    if cfg.resources.workers:
        from raysent.train.ray_train import train_with_ray

        return train_with_ray(cfg, resume=resume, quiet=quiet)
    from raysent.train.run import train_in_process

    return train_in_process(cfg, resume=resume, quiet=quiet)


# --------------------------------------------------------------------------- evaluate
@dataclass
class EvalResult:
    """The numbers of ``raysent eval``: flat ``metrics`` (``sts/stsb``, ``senteval/MR``, ...), each task's
    ``details``, the printed ``text`` and, for STS, a one-row ``table`` (Spearman ×100 per set and Avg)."""

    model: str
    pooling: str
    tasks: list[str]
    metrics: dict[str, float]
    details: dict[str, TaskResult]
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    sentences_embedded: int = 0

    @property
    def text(self) -> str:
        """The tables ``raysent eval`` prints."""
        from raysent.eval.results import Evaluation

        return Evaluation(tasks=self.tasks, **self.details, seconds=self.seconds, notes=self.notes).table(
            title=f"{self.model}  pooling={self.pooling}  tasks={','.join(self.tasks)}")

    @property
    def table(self) -> pd.DataFrame:
        import pandas as pd


        sts = {TASK_LABELS.get(k.split("/")[1], k): v for k, v in self.metrics.items()
               if k.startswith("sts/") and k.count("/") == 1}
        return pd.DataFrame([sts], index=[self.model])


def evaluate(model: str | Path | SentenceEncoder, tasks: str | Sequence[str] = ("sts",), *,
             pooling: str | None = None, max_length: int | None = None, batch_size: int = 128,
             max_samples: int | None = None, options: Mapping[str, Mapping[str, Any]] | None = None,
             progress=None) -> EvalResult:
    """``raysent eval``: ``model`` (a folder, a name under RAYSENT_MODEL_DIR, a hub id, or a loaded
    :class:`SentenceEncoder`) on ``tasks`` (sts, senteval, search, geometry, sts17). ``options``: per task, the
    evaluator's keywords (``{"sts": {"aggregation": "wmean"}}``)."""
    from raysent.eval.suite import check_tasks, evaluate_tasks
    from raysent.models.sentence_encoder import SentenceEncoder

    tasks = check_tasks(tasks, field="tasks")
    encoder = model if isinstance(model, SentenceEncoder) else load(model, pooling=pooling, max_length=max_length,
                                                                       batch_size=batch_size)
    res = evaluate_tasks(encoder.encode, tasks, max_samples=max_samples,
                         options={t: dict(o) for t, o in (options or {}).items()}, progress=progress)
    name = str(model) if not isinstance(model, SentenceEncoder) else model.path
    return EvalResult(model=name, pooling=encoder.pooling, tasks=tasks, metrics=res.metrics(), details=res.details(),
                      seconds=res.seconds, notes=res.notes, sentences_embedded=res.sentences_embedded or 0)


# --------------------------------------------------------------------------- load
def load(model: str | Path, pooling: str | None = None, max_length: int | None = None,
         batch_size: int = 128) -> SentenceEncoder:
    """A saved model (a folder raysent saved, a sentence-transformers folder, a name under RAYSENT_MODEL_DIR or a
    hub id) with its pooling, ready to ``encode`` (:func:`raysent.models.sentence_encoder.load`): ``pooling``
    overrides the one the model names, and a model that names none needs it. A pooling the model cannot read
    (``cls`` without a trained pooler, ``layeratt`` without its pooler) or a ``max_length`` beyond its positions is
    refused here, not at the first ``encode``."""
    from raysent.models.sentence_encoder import load as load_model

    return load_model(model, pooling=pooling, max_length=max_length, batch_size=batch_size)


def __getattr__(name: str) -> Any:
    if name == "SentenceEncoder":  # with torch, when first asked for
        from raysent.models.sentence_encoder import SentenceEncoder

        return SentenceEncoder
    raise AttributeError(f"module 'raysent.api' has no attribute {name!r}")


__all__ = ["EvalResult", "SearchResult", "SentenceEncoder", "evaluate", "fit", "load", "resolve_config", "search",
           "tune_search"]
