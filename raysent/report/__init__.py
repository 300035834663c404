"""Results as the papers show them: tables (mean±std over seeds beside the published numbers),
plots, and paired comparisons across seeds.

* :mod:`raysent.report.runs`: reading ``results/<experiment>/runs/*.json`` and naming runs
* :mod:`raysent.report.table`: ``raysent table`` (markdown, LaTeX, CSV)
* :mod:`raysent.report.published`: the papers' numbers (``results/published.yaml``)
* :mod:`raysent.report.plots`: ``raysent plot`` (dev curves, score per hyperparameter, Optuna's plots,
  the layer × pooling grid of ``raysent eval --layers``)
* :mod:`raysent.report.compare`: ``raysent compare`` (paired t-test and Wilcoxon across seeds)

Imports no Ray and no MLflow.
"""
