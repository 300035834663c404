"""Measure seed-aware ASHA: `python benchmarks/early_stopping.py [benchmarks/early_stopping.yaml]`.

Runs three kinds of search of one grid (see the YAML), each search phase only, in
results/early-stopping/<search>/, and writes results/early-stopping/measurement.json:
- per search: finished and stopped runs, trial-steps (the steps every run trained, stopped ones
  included), wall time, its pick with its dev mean and std over the 3 seeds (from the search without
  early stopping, which ran every configuration on every seed);
- whether each seed that ASHA let finish has the dev curve it has in the search without early stopping.
A search already measured (its summary.json exists) is not run again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from raysent.config import load_config, with_overrides
from raysent.tune.driver import tune_experiment

ROOT = Path("results/early-stopping")


def searches(cfg):
    yield "apart", with_overrides(cfg, {"search.scheduler": None})
    yield "asha", cfg
    for s in cfg.seeds:
        yield f"asha-1-{s}", with_overrides(cfg, {"search.seeds": 1, "seeds": [s]})


def records(exp: Path, folder: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((exp / folder).glob("search-*.json"))]


def main(path: str = "benchmarks/early_stopping.yaml") -> dict:
    base = load_config(path)
    out = {}
    for name, cfg in searches(base):
        cfg = with_overrides(cfg, {"name": name, "tracking.results_dir": str(ROOT)})
        exp = ROOT / name
        if not (exp / "summary.json").is_file():
            tune_experiment(cfg, search_only=True, source=path)
        summary = json.loads((exp / "summary.json").read_text())
        runs, stopped = records(exp, "runs"), records(exp, "stopped")
        out[name] = {"finished_runs": len(runs), "stopped_runs": len(stopped),
                     "trial_steps": sum(r["final_step"] for r in runs + stopped),
                     "wall_seconds": summary["wall_seconds"], "pick": summary["best"]["hp"],
                     "pick_dev_mean_seen": summary["best"]["dev_mean"], "pick_config": summary["best"]["config_id"]}
    apart = {(r["config_id"], r["seed"]): r for r in records(ROOT / "apart", "runs")}
    by_config: dict = {}
    for (cid, _), r in apart.items():
        by_config.setdefault(cid, []).append(r["best_dev_spearman"])
    out["configurations"] = {cid: {"lr": next(r["hp"] for k, r in apart.items() if k[0] == cid)["lr"],
                                   "dev_mean": float(np.mean(v)), "dev_std": float(np.std(v, ddof=1)), "n": len(v)}
                             for cid, v in by_config.items()}
    full = out["apart"]["trial_steps"]
    for name in [n for n in out if n not in ("configurations",)]:
        pick = out["configurations"][out[name]["pick_config"]]
        out[name].update(pick_dev_mean=pick["dev_mean"], pick_dev_std=pick["dev_std"],
                         steps_vs_apart=out[name]["trial_steps"] / full)
        same = [r["dev_curve"] == apart[(r["config_id"], r["seed"])]["dev_curve"]
                for r in records(ROOT / name, "runs") if (r["config_id"], r["seed"]) in apart]
        out[name]["finished_runs_equal_to_apart"] = f"{sum(same)}/{len(same)}"
    (ROOT / "measurement.json").write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:]), indent=2))
