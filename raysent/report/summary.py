"""What `raysent tune` prints at the end: a search's :class:`~raysent.tune.state.Summary` as text.

The best configuration and what the search phase did (finished, failed, stopped, learned nothing,
diverged); the final phase as the papers' row (the seven STS sets in their order and Avg, mean ± std over
seeds), beside it the warm-start configuration's row, their difference and its paired tests; any arm that
diverged or learned nothing says so where its numbers are; then where the results, the best model and the
MLflow runs are. Imports no Ray and no MLflow.
"""

from __future__ import annotations

import numpy as np

from raysent.report.runs import TASK_LABELS, TASKS
from raysent.tune.state import ArmOutcome, ScoreStat, Summary

MLFLOW_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default


def runs_view_url(experiment_id: str, base: str = MLFLOW_UI) -> str:
    """The experiment's runs table in the MLflow UI (MLflow 3 opens an experiment on its GenAI overview)."""
    return f"{base}/#/experiments/{experiment_id}/runs"


def paper_row(scores: dict[str, ScoreStat], kind: str = "") -> list[str] | None:
    """The row of the papers' STS table (the 7 sets in their order, then Avg; mean ± std over seeds) from a
    final phase's scores (``kind``: "" Spearman, "/pearson" Pearson); None without them."""
    cells = [scores.get(f"sts/{t}{kind}") for t in TASKS]
    if not any(cells):
        return None
    avg = scores.get("sts/avg") if not kind else None
    vals = [f"{c.mean:.2f}±{c.std:.2f}" if c else "—" for c in [*cells, avg]]
    if kind and all(cells):  # no Pearson Avg is recorded: the mean of the sets' means
        vals[-1] = f"{np.mean([c.mean for c in cells if c]):.2f}"
    return vals


def _marked(label: str, arm: ArmOutcome) -> str:
    """A diverged run's numbers are not a trained model's: that is said beside them."""
    n = len(arm.diverged_seeds)
    return f"{label} [DIVERGED {n}/{len(arm.seeds)}]" if n else label


def _final_lines(summary: Summary, final: ArmOutcome) -> list[str]:
    lines = [f"final phase on seeds {final.seeds}"
             + (f" (missing: {final.missing_seeds})" if final.missing_seeds else "")
             + (" [transductive: trained on the evaluation sets' unlabelled text]" if final.transductive else "")
             + ": STS, ×100, mean ± std over seeds"]
    paper, vs = summary.paper, summary.vs_paper
    other = summary.warm_source or "paper"  # the warm-start arm, named for where its values come from
    arms = [(_marked("Spearman", final), final.scores, "")]
    if paper is not None and paper.scores:
        arms = [(_marked("searched", final), final.scores, ""), (_marked(other, paper), paper.scores, "")]
    rows = {label: row for label, scores, kind in arms if (row := paper_row(scores, kind))}
    if vs is not None and vs.tasks and rows:
        rows["Δ"] = [f"{d.diff_mean:+.2f}" if (d := vs.tasks.get(c)) is not None and d.diff_mean is not None
                     else "—" for c in (*TASKS, "avg")]
    if (pearson := paper_row(final.scores, "/pearson")) and rows:
        rows["Pearson"] = pearson
    if rows:
        heads = [*(TASK_LABELS[t] for t in TASKS), "Avg"]
        width = [max(len(h), *(len(r[i]) for r in rows.values())) for i, h in enumerate(heads)]
        lw = max(8, *(len(label) for label in rows))
        lines.append(f"  {'':{lw}s}  " + "  ".join(h.rjust(w) for h, w in zip(heads, width)))
        lines += [f"  {label:{lw}s}  " + "  ".join(v.rjust(w) for v, w in zip(row, width))
                  for label, row in rows.items()]
    shown = {f"sts/{t}{kind}" for t in (*TASKS, "avg") for kind in ("", "/pearson")} if rows else set()
    avg = vs.tasks.get("avg") if vs is not None else None
    if vs is not None and avg is not None and avg.diff_mean is not None:
        p_t = "—" if avg.t_p is None else f"{avg.t_p:.3g}"
        p_w = "—" if avg.wilcoxon_p is None else f"{avg.wilcoxon_p:.3g}"
        lines.append(f"  searched − {other} ({vs.searched} − {vs.paper}), Avg: {avg.diff_mean:+.2f}"
                     + (f" ± {avg.diff_std:.2f}" if avg.diff_std is not None else "")
                     + f" over {avg.n} paired seeds; paired t-test p {p_t}, Wilcoxon p {p_w}")
    for k, v in final.scores.items():
        if k not in shown:
            lines.append(f"  {k:28s} {v.mean:6.2f} ± {v.std:.2f} (n={v.n})")
    if final.not_learned_seeds:
        lines.append(f"NO LEARNING on seed(s) {final.not_learned_seeds}: the best checkpoint is step 0, the untouched "
                     "input model; those scores are the input model's, not the method's")
    if final.diverged_seeds:
        lines.append(f"DIVERGED on seed(s) {final.diverged_seeds}: the last dev score is NaN or more than 10 points "
                     "below the start; the lr (or temperature) is too high for this model")
    # an arm of which no seed finished (every one failed, a diverged loss say): said, the other arm's rows stay
    for label, arm in (("the searched best", final), (f"the {other} arm", paper)):
        if arm is not None and not arm.seeds:
            lines.append(f"FAILED: no seed of {label} finished ({len(arm.missing_seeds)} failed): "
                         + (arm.errors[0] if arm.errors else "no error was recorded"))
    return lines


def format_summary(summary: Summary) -> str:
    wall = summary.wall_seconds
    lines = [f"experiment {summary.experiment} (search {summary.search})"
             + (f" in {wall / 60:.1f} min" if wall else "")]
    best = summary.best
    if best is not None and best.configurations:
        lines.append(f"best configuration: {best.hp}  dev {best.dev_mean:.2f}"
                     + (f" ± {best.dev_std:.2f}" if best.n > 1 else "") + f" over {best.n} seed(s)"
                     + ("" if best.learned else "  (learned nothing: best at step 0 on every seed)"))
        counts = [f"{best.finished_runs} finished", f"{len(best.failed)} failed",
                  f"{len(best.stopped)} stopped early (stopped/)",
                  f"{best.not_learned_runs} learned nothing (best at step 0)", f"{best.diverged_runs} diverged"]
        lines.append(f"search trials: {', '.join(counts)}; configurations: {len(best.configurations)}")
    if summary.budget is not None:
        from raysent.report.budget import budget_lines

        lines += budget_lines(summary.budget)
    if summary.final is not None:
        lines += _final_lines(summary, summary.final)
    published = summary.published
    lines.append(f"results: {summary.results} (runs/, best.yaml, summary.json"
                 + (", summary.md, summary.csv" if published is not None and published.files else "") + ")")
    if published is not None and published.best_model_dir:
        lines.append(f"best model: {published.best_model_dir} (a sentence-transformers model; README.md is its "
                     "model card)")
    if summary.mlflow:
        lines.append(f"MLflow: {summary.mlflow}  (mlflow ui --backend-store-uri {summary.mlflow} --host "
                     f"127.0.0.1, then open {summary.mlflow_runs_url or MLFLOW_UI})")
    if published is not None and published.registered is not None:
        reg = published.registered
        lines.append(f"registered: {reg.uri} (mlflow.sentence_transformers.load_model('{reg.uri}'))")
    return "\n".join(lines)
