"""raysent: train, tune and compare contrastive sentence-embedding methods at scale.

The core (:mod:`raysent.config`, :mod:`raysent.data`, :mod:`raysent.models`, :mod:`raysent.methods`,
:mod:`raysent.eval`, :mod:`raysent.train` without ``ray_train``) needs only torch; the orchestration
over it (:mod:`raysent.train.ray_train`, :mod:`raysent.tune`, :mod:`raysent.tracking`,
:mod:`raysent.report`, :mod:`raysent.bench`, :mod:`raysent.cli`) adds Ray Train, Ray Tune, Optuna and
MLflow. tests/test_layers.py checks the split.
"""

__version__ = "0.2.0.dev0"
