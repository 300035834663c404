"""What a finished search leaves where researchers work: files, model cards and MLflow.

After the final phase (and the paper arm), :func:`publish`:

1. writes the search's mean ± std table of its final runs (the winner and the paper's setting, with the
   papers' rows where they match) to ``results/<experiment>/summary.{md,csv,tex}`` and its plots to
   ``plots/``;
2. puts that table into the model card (README.md) of every final best-model folder of the winner;
3. with MLflow on, gives the search's parent run the outcome: the table, the plots, ``best.yaml``,
   ``summary.json`` and the Optuna study as artifacts; each ``sts/*`` mean and std of the winner and of the
   paper arm, their paired difference and p values and the best dev score as metrics; the winning
   hyperparameters as params (the names the seed runs use), and the table as the run's description;
4. logs the final phase's best model (the winner's final run with the best dev score) with MLflow's
   ``sentence_transformers`` flavour into that run (``tracking.log_model``: ``best``, ``all`` final seeds, or
   ``none``) and registers it in the model registry under ``tracking.registered_model`` (default: the
   experiment's name), a new version per search, whose description is the table and whose tags are the
   method, the seeds, the ``sts/avg`` mean and std and whether training was transductive.

The flavour is sentence-transformers, not transformers: the transformers flavour holds the encoder without
its pooling (``pipeline("feature-extraction")`` returns token vectors), while a raysent model folder is a
sentence-transformers model whose ``encode`` returns what ``raysent eval`` embeds. A pooling computed by
raysent's own module travels with raysent's code (``code_paths``), so ``mlflow.sentence_transformers
.load_model`` works where raysent is not installed.

Any failure here is one :class:`PublishError` that says what to do; the search's records and models stay in
``results/``, its state stays at this step, and ``raysent tune --resume`` runs this step again, nothing else.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import torch

from raysent.config import ExperimentConfig, hyperparameters, with_overrides
from raysent.errors import RaysentError
from raysent.methods.card import write_card
from raysent.report.runs import load_experiment
from raysent.tracking import client, experiment_name, fluent, redact, tracking_uri
from raysent.train.records import RunRecord
from raysent.tune.best import records
from raysent.tune.state import LoggedModel, Published, PublishedModel, Registered, SearchState
from raysent.tune.protocol import MlflowTarget

# Lazy imports: mlflow, ray, sentence_transformers, transformers, raysent's heavier modules (heavy, and only the
# functions that need them import them).

MODEL_ARTIFACT = "model"
EXPERIMENT_TAG = "raysent.experiment"  # on a registered model: the experiment whose versions it holds


class PublishError(RaysentError):
    """The outcome of a finished search could not be written to MLflow (the search itself is complete);
    ``result``: the search's :class:`raysent.api.SearchResult`, when it got that far."""

    result: Any = None


def registered_name(cfg: ExperimentConfig) -> str:
    return cfg.tracking.registered_model or experiment_name(cfg)


def final_records(exp: Path, run: str, cid: str) -> list[RunRecord]:
    return [r for r in records(exp, "final", run) if r.config_id == cid]


ARM_LABELS = {"paper": "paper's setting", "file": "the file's setting"}  # the warm-start arm, by its values' source


def search_table(exp: Path, run: str, best_cid: str | None = None, paper_cid: str | None = None,
                 source: str = "paper"):
    """The mean ± std table of the search's final runs (:func:`raysent.report.table.build_table`)."""
    from raysent.report.table import build_table

    runs = [r for r in load_experiment(exp.name, exp.parent, "final") if r.search == run]
    table = build_table(runs, published="match", title=f"{exp.name} (search {run})")
    if best_cid is not None or paper_cid is not None:
        for row in table.rows:
            cid = row.info.get("config_id")
            if cid == best_cid:
                row.label += " — searched best"
            elif cid == paper_cid:
                row.label += f" — {ARM_LABELS[source]} (search.warm_start)"
    return table


def state_table(exp: Path, state: SearchState):
    """The table of a search as its state names the arms."""
    return search_table(exp, state.run, state.best.config_id if state.best else None,
                        state.vs_paper.paper if state.vs_paper else None, state.warm_source or "paper")


def results_markdown(table, state: SearchState) -> str:
    """The card's and the registry's results section: the table, and the paired difference to the paper."""
    lines = ["## Results", "", table.to_markdown().strip()]
    avg = state.vs_paper.tasks.get("avg") if state.vs_paper else None
    if avg is not None and avg.diff_mean is not None:
        p = " ".join(f"{name} p {v:.3g}" for name, v in (("paired t-test", avg.t_p), ("Wilcoxon", avg.wilcoxon_p))
                     if v is not None)
        lines += ["", f"Searched − {ARM_LABELS[state.warm_source or 'paper']}, Avg: {avg.diff_mean:+.2f}"
                  + (f" ± {avg.diff_std:.2f}" if avg.diff_std is not None else "")
                  + f" over {avg.n} paired seeds" + (f"; {p}" if p else "") + "."]
    return "\n".join(lines)


def outcome_metrics(state: SearchState) -> dict[str, float]:
    """The parent run's metrics: ``sts/<set>_mean|_std`` of the winner, ``paper/…`` of the warm-start arm
    (``file/…`` when the file set its values: :func:`raysent.tune.space.warm_source`),
    ``delta/sts/<set>`` (± ``_std``), ``p_ttest/…`` and ``p_wilcoxon/…`` of their paired difference, and the
    winner's ``best_dev_spearman_mean|_std`` over the search's seeds."""
    out: dict[str, float] = {}
    warm = f"{state.warm_source or 'paper'}/"
    for prefix, arm in (("", state.final), (warm, state.paper)):
        for k, v in (arm.scores if arm else {}).items():
            out[f"{prefix}{k}_mean"] = v.mean
            out[f"{prefix}{k}_std"] = v.std
    for col, d in (state.vs_paper.tasks if state.vs_paper else {}).items():
        key = "best_dev_spearman" if col == "dev" else f"sts/{col}"
        stats = {f"delta/{key}": d.diff_mean, f"delta/{key}_std": d.diff_std, f"p_ttest/{key}": d.t_p,
                 f"p_wilcoxon/{key}": d.wilcoxon_p}
        out.update({k: float(v) for k, v in stats.items() if v is not None})
    if state.best is not None and state.best.dev_mean is not None:
        out["best_dev_spearman_mean"] = float(state.best.dev_mean)
        out["best_dev_spearman_std"] = float(state.best.dev_std)
    return out


def search_budget_of(cfg: ExperimentConfig, exp: Path, state: SearchState):
    """The search's budget curve (:func:`raysent.report.budget.search_budget`) from its records; None for a final
    phase alone (``--final-only``) or a search without a finished configuration."""
    from raysent.report.budget import search_budget

    if state.best is None or not state.best.configurations or cfg.search is None:
        return None
    return search_budget(exp, state.run, cfg.search.mode, seeds=cfg.search.seeds, final_config=state.best.config_id)


def best_final(recs: list[RunRecord]) -> RunRecord:
    """The final run whose model is logged: the best dev score (the first seed on a tie)."""
    return max(recs, key=lambda r: (r.best_dev_spearman, -r.seed))


def _artifacts(exp: Path, plots: list[Path]) -> list[tuple[Path, str | None]]:
    files: list[tuple[Path, str | None]] = [(exp / f"summary.{ext}", None) for ext in ("md", "csv", "tex", "json")]
    files += [(exp / "best.yaml", None), (exp / "optuna.db", None)]
    files += [(p, "plots") for p in plots]
    return [(f, d) for f, d in files if f.is_file()]


def publish(cfg: ExperimentConfig, exp: Path, state: SearchState, mlflow: MlflowTarget | None, say,
            save=lambda: None) -> Published:
    """Steps 1-4 of the module docstring; returns what was published (kept in the state and the summary).
    A model logged or registered is noted in ``state`` at once (``save`` writes it): a publish run again after a
    failure does not log or register it twice."""
    from raysent.report.plots import plot_experiment

    out = Published()
    recs = final_records(exp, state.run, state.best.config_id) if state.best else []
    if not recs:
        return out
    chosen = best_final(recs)
    out.best_model_dir = chosen.best_model_dir
    for r in (recs if cfg.tracking.log_model == "all" else [chosen]):  # models trained on other nodes come here
        folder = Path(r.best_model_dir or "")
        if not folder.is_dir() and r.node:
            fetch_folder(r.node, folder)
    table = state_table(exp, state)
    out.files = [str(p.relative_to(exp)) for p in table.write(exp / "summary")]
    plots, _ = plot_experiment(exp.name, exp.parent, search=state.run)
    section = results_markdown(table, state)
    budget = search_budget_of(cfg, exp, state)
    if budget is not None:  # summary.md, the card and the registry gain the budget curve; plots/budget.png
        from raysent.report.budget import budget_markdown

        text = budget_markdown(budget)
        summary_md = exp / "summary.md"
        summary_md.write_text(summary_md.read_text().rstrip() + "\n\n" + text)
        section = section.rstrip() + "\n\n" + text.replace("## Budget curve", "### Budget curve", 1)
    for r in recs:
        folder = Path(r.best_model_dir or "")
        if (folder / "raysent.json").is_file():
            out.cards.append(str(write_card(folder, results=section)))
    if mlflow is None or not state.parent_run_id:
        return out
    _to_mlflow(cfg, exp, state, mlflow, recs, section, plots, say, save, out)
    return out


def _fail(what: str, exc: BaseException, fix: str) -> PublishError:
    text = " ".join(str(exc).split())[:400]
    return PublishError(f"{what}: {type(exc).__name__}: {text}. {fix} The search is complete: its records, "
                        "table and models are in results/; `raysent tune --resume` with the same file logs its "
                        "outcome to MLflow again, without training")


def _to_mlflow(cfg: ExperimentConfig, exp: Path, state: SearchState, mlflow: MlflowTarget, recs: list[RunRecord],
               section: str, plots: list[Path], say, save, out: Published) -> None:
    from mlflow.entities import Metric, Param, RunTag


    uri, parent = mlflow.uri, str(state.parent_run_id)
    c = client(uri)
    best = state.best
    assert best is not None
    best_cfg = with_overrides(cfg, best.hp) if best.hp else cfg
    now = int(time.time() * 1000)
    params = {**{k: v for k, v in hyperparameters(best_cfg).items() if k != "seed"},
              "seeds": json.dumps(sorted(r.seed for r in recs)), "searched": json.dumps(sorted(best.hp))}
    metrics = [Metric(k, v, now, 0) for k, v in outcome_metrics(state).items()]
    try:
        logged = c.get_run(parent).data.params  # a resumed publish: MLflow params are written once
        new = [Param(k, _text(v)) for k, v in sorted(params.items()) if k not in logged]
        c.log_batch(parent, metrics=metrics,
                    params=new, tags=[RunTag("mlflow.note.content", section), RunTag("best_config_id", best.config_id)])
    except Exception as exc:
        raise _fail(f"MLflow ({redact(uri)}) did not take the search's outcome (run {parent})", exc,
                    "Check that the tracking store is reachable and writable.") from None
    try:
        for path, folder in _artifacts(exp, plots):
            c.log_artifact(parent, str(path), folder)
    except Exception as exc:
        where = c.get_run(parent).info.artifact_uri
        raise _fail(f"MLflow could not store the search's files in the parent run's artifact store {where}", exc,
                    "Make that folder writable (or set tracking.mlflow_uri to a store you can write).") from None
    out.parent_run_id = parent
    mode = cfg.tracking.log_model
    if mode == "none":
        return
    chosen = best_final(recs)
    for r in (recs if mode == "all" else [chosen]):
        if str(r.seed) not in state.logged_models:
            started = time.perf_counter()
            uri_mb = log_model(uri, r, cfg)
            state.logged_models[str(r.seed)] = LoggedModel(**uri_mb, seconds=time.perf_counter() - started)
            save()
    mine = state.logged_models[str(chosen.seed)]
    out.model = PublishedModel(seed=chosen.seed, run_id=chosen.mlflow_run_id, path=chosen.best_model_dir,
                               uri=mine.uri, seconds=sum(m.seconds for m in state.logged_models.values()),
                               megabytes=sum(m.megabytes for m in state.logged_models.values()))
    if state.registered is None:
        state.registered = register(cfg, uri, mine.uri, recs, chosen, section, state)
        save()
    out.registered = state.registered
    c.set_tag(parent, "registered_model", f"{out.registered.name}/{out.registered.version}")
    say(f"MLflow: model of seed {chosen.seed} logged ({out.model.megabytes:.1f} MB, {out.model.seconds:.1f} s) and "
        f"registered as {out.registered.name} version {out.registered.version}")


def _text(v: Any) -> str:
    return (json.dumps(v) if isinstance(v, (list, dict, tuple)) else str(v))[:6000]


def _folder_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def log_model(uri: str, record: RunRecord, cfg: ExperimentConfig) -> dict:
    """Log one final run's best model (its folder) into that run with the sentence_transformers flavour."""
    import mlflow
    import mlflow.sentence_transformers
    import transformers


    folder = Path(record.best_model_dir or "")
    run_id = record.mlflow_run_id
    if not folder.is_dir() and record.node:
        fetch_folder(record.node, folder)  # trained on another node: its disk holds the model
    if not (folder / "modules.json").is_file():
        raise PublishError(f"the best model of seed {record.seed} ({folder}) is not on this machine, nor on the "
                           f"node it trained on, or is not a sentence-transformers folder; set tracking.log_model: "
                           "none to publish the rest")
    if not run_id:
        raise PublishError(f"seed {record.seed}'s record has no MLflow run to log its model into")
    meta = json.loads((folder / "raysent.json").read_text())
    needs_raysent = bool((meta.get("sentence_transformers") or {}).get("needs_raysent"))
    try:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(folder), trust_remote_code=needs_raysent, device="cpu")
        # MLflow stores what `model.save` writes: the folder as raysent wrote it (its card, raysent.json, and the
        # Transformer's model_kwargs, which sentence-transformers' own save leaves out), not a re-serialisation
        model.save = lambda path, *args, **kwargs: shutil.copytree(  # type: ignore[method-assign]  # this model's
            folder, path, dirs_exist_ok=True)  # own save, for MLflow's log_model (an instance's method on purpose)
    except Exception as exc:
        raise PublishError(f"{folder}: sentence-transformers cannot load this model ({type(exc).__name__}: "
                           f"{' '.join(str(exc).split())[:300]}); `raysent export` rewrites its layout") from None
    requirements = [f"sentence-transformers=={importlib.metadata.version('sentence-transformers')}",
                    f"transformers=={transformers.__version__}", f"torch=={_torch_version()}"]
    code = [str(Path(__file__).resolve().parents[1])] if needs_raysent else None  # the raysent package
    try:
        with fluent(uri), mlflow.start_run(run_id=run_id):
            info = mlflow.sentence_transformers.log_model(
                model, name=MODEL_ARTIFACT, pip_requirements=requirements, code_paths=code,
                metadata={"raysent_pooling": meta.get("pooling"), "raysent_method": meta.get("method"),
                          "seed": record.seed, "needs_raysent": needs_raysent})
    except Exception as exc:
        raise _fail(f"MLflow ({redact(uri)}) did not store the model of seed {record.seed} (run {run_id})", exc,
                    "Check that the tracking store and its artifact store are reachable and writable.") from None
    return {"uri": info.model_uri, "megabytes": _folder_mb(folder)}


def _read_folder(path: str) -> dict[str, bytes]:
    root = Path(path)
    return {str(f.relative_to(root)): f.read_bytes() for f in root.rglob("*") if f.is_file()} if root.is_dir() else {}


def fetch_folder(node: str, folder: Path) -> None:
    """Copy ``folder`` from the Ray node that wrote it (a final run on another node) to the same path here, through
    Ray's object store (one task pinned to that node): no storage shared by the nodes is needed."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized() or node not in {n["NodeID"] for n in ray.nodes() if n.get("Alive")}:
        return
    files = ray.get(ray.remote(num_cpus=0)(_read_folder).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(str(folder)), timeout=600)
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)


def _torch_version() -> str:
    return torch.__version__.split("+")[0]


def register(cfg: ExperimentConfig, uri: str, model_uri: str, recs: list[RunRecord], chosen: RunRecord,
             section: str, state: SearchState) -> Registered:
    """A new version of the registered model, described by the table and tagged with the outcome."""
    from mlflow.tracking import MlflowClient


    name = registered_name(cfg)
    exp_name = experiment_name(cfg)
    registry = cfg.tracking.registry_uri or os.environ.get("MLFLOW_REGISTRY_URI") or uri
    reg = MlflowClient(tracking_uri=uri, registry_uri=registry)
    avg = state.final.scores.get("sts/avg") if state.final else None
    tags = {"method": cfg.method, "seeds": json.dumps(sorted(r.seed for r in recs)),
            "sts/avg_mean": f"{avg.mean if avg else float('nan'):.4f}",
            "sts/avg_std": f"{avg.std if avg else float('nan'):.4f}",
            "transductive": str(any(bool(r.transductive) for r in recs)).lower(),
            "experiment": exp_name, "search": state.run, "seed": str(chosen.seed),
            "config_id": chosen.config_id}
    try:
        check_registered_name(reg, name, exp_name)
        try:
            reg.create_registered_model(name, tags={EXPERIMENT_TAG: exp_name},
                                        description=f"raysent experiment {exp_name}: {cfg.method} on {cfg.model.name}")
        except Exception as exc:
            if "already exists" not in str(exc) and "RESOURCE_ALREADY_EXISTS" not in str(exc):
                raise
        with fluent(uri):  # MLflow resolves a logged model's `models:/m-…` URI through the fluent tracking URI
            version = reg.create_model_version(name, model_uri, run_id=chosen.mlflow_run_id, tags=tags,
                                               description=section)
    except PublishError:
        raise
    except Exception as exc:
        raise _fail(f"the MLflow model registry ({redact(registry)}) did not register {name!r}", exc,
                    "Check that the registry is reachable (tracking.registry_uri, MLFLOW_REGISTRY_URI).") from None
    return Registered(name=name, version=str(version.version), uri=f"models:/{name}/{version.version}")


def check_registered_name(reg, name: str, exp_name: str) -> None:
    """A registered model of this name that holds another experiment's models (or not raysent's) is a
    collision: raysent never adds its versions there."""
    try:
        existing = reg.get_registered_model(name)
    except Exception as exc:
        if "RESOURCE_DOES_NOT_EXIST" in str(exc) or "not found" in str(exc).lower():
            return
        raise
    owner = (existing.tags or {}).get(EXPERIMENT_TAG)
    if owner != exp_name:
        held = f"experiment {owner!r}'s models" if owner else "models that raysent did not register"
        raise PublishError(f"the MLflow model registry already has a model named {name!r}, holding {held}; raysent "
                           f"adds versions only to its own experiment's model. Set another name: "
                           f"`--set tracking.registered_model=NAME` (or tracking.registered_model in the file); the "
                           "search's records and models are in results/, and `raysent tune --resume` registers it")


class _FastFail:
    """MLflow's HTTP client tries an unreachable server for minutes (retries with back-off); a check before a
    search asks once, with a short timeout."""

    VARS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.VARS}
        os.environ.update(self.VARS)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _local_path(artifact_uri: str) -> Path | None:
    if artifact_uri.startswith("file://"):
        return Path(unquote(urlparse(artifact_uri).path))
    return Path(artifact_uri) if "://" not in artifact_uri else None


def check_publishing(cfg: ExperimentConfig, experiment_id: str) -> None:
    """Before a search trains: the experiment's artifact store can be written (when it is a local folder), and,
    with ``tracking.log_model`` on, the model registry answers and its name for the model is free or this
    experiment's. Raises :class:`PublishError` with what to do."""
    uri = tracking_uri(cfg)
    location = client(uri).get_experiment(experiment_id).artifact_location
    folder = _local_path(location)
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / f".raysent-write-check-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise PublishError(f"MLflow experiment {experiment_name(cfg)!r} keeps its artifacts in {folder}, which "
                               f"cannot be written ({exc.strerror or exc}): the search's table, plots and model "
                               "would be lost to MLflow. Make that folder writable, or use another store "
                               "(`--set tracking.mlflow_uri=...`) or experiment (`--set tracking.experiment=...`)"
                               ) from None
    if cfg.tracking.log_model == "none":
        return
    from mlflow.tracking import MlflowClient

    registry = cfg.tracking.registry_uri or os.environ.get("MLFLOW_REGISTRY_URI") or uri
    reg = MlflowClient(tracking_uri=uri, registry_uri=registry)
    name = registered_name(cfg)
    try:
        with _FastFail():
            check_registered_name(reg, name, experiment_name(cfg))
    except PublishError:
        raise
    except Exception as exc:
        raise PublishError(f"the MLflow model registry {redact(registry)} does not answer ({type(exc).__name__}: "
                           f"{' '.join(str(exc).split())[:200]}). Start it, point tracking.registry_uri (or "
                           "MLFLOW_REGISTRY_URI) at one that answers, or set tracking.log_model: none") from None
