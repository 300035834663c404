"""The evaluation tasks' names, without their evaluators (which import scipy and scikit-learn): ``raysent.config``
checks ``eval.tasks`` against them before anything heavy loads."""

from __future__ import annotations

EVAL_TASKS = ("sts", "senteval", "search", "geometry", "sts17")
