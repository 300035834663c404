"""Where a search keeps things: its experiment folder under results/, and Tune's storage.

``resources.storage_path`` (a folder every node sees, or s3:// / gs://) holds Tune's experiment state and trial
folders under the experiment's name; without it they are in ``results/<experiment>/tune`` on this machine. A
local storage path is made absolute before any trial starts (:func:`with_absolute_storage`): trials run in
their own folders, and on other nodes.
"""

from __future__ import annotations

from pathlib import Path

from raysent.config import ExperimentConfig, with_overrides
from raysent.tracking import experiment_name


def experiment_dir(cfg: ExperimentConfig) -> Path:
    """``results/<experiment>``, absolute."""
    return Path(cfg.tracking.results_dir).resolve() / experiment_name(cfg)


def tune_storage(cfg: ExperimentConfig, exp: Path) -> str:
    """Where Tune keeps the experiment state and trial folders: ``resources.storage_path`` under the experiment's
    name, else results/<experiment>/tune on this machine."""
    if cfg.resources.storage_path:
        root = cfg.resources.storage_path
        root = root if "://" in root else str(Path(root).expanduser().resolve())
        return f"{root.rstrip('/')}/{exp.name}"
    return str(exp / "tune")


def with_absolute_storage(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with a local ``resources.storage_path`` made absolute (as the trials, in their own folders and on
    other nodes, must read it); a URI (s3://, gs://) or no storage path leaves it as it is."""
    sp = cfg.resources.storage_path
    if sp and "://" not in sp:
        return with_overrides(cfg, {"resources.storage_path": str(Path(sp).expanduser().resolve())})
    return cfg
