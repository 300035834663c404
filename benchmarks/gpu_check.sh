#!/usr/bin/env bash
# GPU measurements in one device run, from the project root with the offline bundle of ../shared/gpu
# (`bash ../shared/gpu/make-bundle.sh` builds .gpu-bundle/), on one H200 or H100:
#   bash benchmarks/gpu_check.sh [compile64] [compile512] [search] [gpu64] [gpu512] [methods] [profile] [overhead]
# Default: issue 61's two parts, about seven minutes with the set-up (each part under its own timeout):
#   compile64   batch 64, length 32: simcse-unsup on its defaults (compile auto: CUDA graphs) in a fresh compiler
#               cache, sentence-transformers' MNRL bf16, the eager defaults (train.compile false), the defaults again
#               (a search's later trial: its graphs in the cache the first filled), compiled without CUDA graphs
#               (compile_mode default, the compile of before)
#   compile512  batch 512: the defaults (compiled), eager, MNRL bf16
#   search      issue 61's search part (about six minutes): 4 learning rates of 500 steps at batch 64, raysent one
#               trial per GPU without graphs, raysent on its defaults (packed by the probe; 500 steps are under
#               compile auto's break-even, so its log says it stays eager) and sentence-transformers'
#               hyperparameter_search
# Issue 46's parts stay: gpu64, gpu512, methods, profile, overhead (about nine minutes together).
# The bundle's check.sh sets up its packages and the random BERT-base / 2-layer models (no part of its own runs),
# then `raysent bench` measures; a part cut short keeps the cases it measured (the bench writes its record after
# every case). Everything goes to $OUT (else /tmp/gpu-check): each part's bench record as <part>.json and <part>.md,
# gpu_check.json (eager vs compiled steps/s per batch, the compile of the later trial ÷ the first's, the settings
# each case resolved), log.txt and results.tgz. Copy the records into results/bench/ by hand afterwards.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled
P=$(pwd); O=${OUT:-/tmp/gpu-check}; R=/tmp/gpu-bench; mkdir -p "$O" "$R"
PARTS=${*:-compile64 compile512}
bash .gpu-bundle/check.sh setup-only > "$O/setup.log" 2>&1  # a part name check.sh does not know: set-up only
# the bundle unpacks its wheels with zipfile, which drops the execute bit of Ray's own binaries (gcs_server, raylet)
find /tmp/site/ray -type f -path '*/core/src/*' -exec chmod +x {} +
export PYTHONPATH=/tmp/site:$P RAYSENT_DATA_DIR=$P/.gpu-bundle/data RAYSENT_MODEL_DIR=/tmp/gpu-models
exec > >(tee -a "$O/log.txt") 2>&1
tail -3 "$O/setup.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

summary() {  # gpu_check.json from every part's bench record so far (rewritten after each part)
  python3 - "$R" "$O/gpu_check.json" <<'PYEOF'
import json, pathlib, sys
root, out = pathlib.Path(sys.argv[1]), {}
for part in sorted(p for p in root.iterdir() if p.is_dir()):
    records = sorted(part.glob("*.json"))
    if not records:
        continue
    rec = json.loads(records[-1].read_text())
    g = rec.get("gpu") or {}
    cases = g.get("cases") or {}
    keep = ("steps_per_second", "sentences_per_second", "cuda_peak_mib", "mfu", "warmup_seconds", "compile_seconds",
            "precision", "settings")
    row = {"batch_size": rec["options"]["batch_size"], "torch": rec["machine"]["torch"],
           "device": rec["machine"].get("cuda"), "cases": {k: {f: c.get(f) for f in keep} for k, c in cases.items()},
           "vs_st_mnrl_bf16": g.get("steps_per_second_vs_st_mnrl_bf16"), "failed_cases": rec.get("failed_cases"),
           "interrupted_case": rec.get("interrupted_case")}
    eager, compiled = cases.get("eager"), cases.get("defaults")
    if eager and compiled:
        row["defaults_compiled_vs_eager_steps_per_second"] = compiled["steps_per_second"] / eager["steps_per_second"]
    if g.get("compile_again_vs_first") is not None:
        row["compile_again_vs_first"] = {k: g.get(k) for k in ("compile_first", "compile_again",
                                                               "compile_again_vs_first")}
    if rec.get("search"):
        s = rec["search"]
        row["search"] = {"ratios": s.get("ratios"), "ways": {w: {f: v.get(f) for f in (
            "wall_seconds", "configurations_per_hour", "trials_at_once", "trials_per_gpu", "compile", "cuda_graphs",
            "attention", "gpu_util_mean_percent", "gpu_memory_peak_mib", "best_lr", "best_dev_spearman")}
            for w, v in (s.get("ways") or {}).items()}}
    out[part.name] = row
pathlib.Path(sys.argv[2]).write_text(json.dumps(out, indent=1))
print(json.dumps({k: {x: v.get(x) for x in ("defaults_compiled_vs_eager_steps_per_second", "compile_again_vs_first",
                                             "vs_st_mnrl_bf16")} for k, v in out.items()}, indent=1))
PYEOF
}
bench() { local t=$1 out=$2; shift 2; echo "=== $out $(date +%T): bench $*"
  timeout -k 10 "$t" python3 -m raysent.cli bench --output-dir "$R/$out" "$@" 2>&1 | grep -vE "^\s*$"; echo "rc=${PIPESTATUS[0]}"
  for f in "$R/$out"/*.json "$R/$out"/*.md; do [ -f "$f" ] && cp "$f" "$O/$out.${f##*.}"; done
  summary; tar czf "$O/results.tgz" -C /tmp gpu-bench; }
for part in $PARTS; do case $part in
  compile64) bench 230 compile64 --model bert-base-random --parts gpu --batch-size 64 --steps 30 --warmup 5 \
           --gpu-cases defaults,st-mnrl-bf16,eager,defaults-again,compile-default;;
  compile512) bench 150 compile512 --model bert-base-random --parts gpu --batch-size 512 --steps 10 --warmup 3 \
           --gpu-cases defaults,eager,st-mnrl-bf16;;
  search) bench 480 search --model bert-base-random --parts search --batch-size 64 --max-length 32 \
           --search-trials 4 --search-steps 500;;
  gpu64) bench 170 gpu64 --model bert-base-random --parts gpu --batch-size 64 --steps 30 --warmup 5 \
           --gpu-cases defaults,st-mnrl-bf16,fp32,length-buckets-4,fused-adamw-off,huge-pages-on,defaults-again,compile;;
  gpu512) bench 110 gpu512 --model bert-base-random --parts gpu --batch-size 512 --steps 10 --warmup 3 \
           --gpu-cases defaults,st-mnrl-bf16,compile;;
  profile) bench 80 profile --model bert-base-random --parts profile --batch-size 64 --warmup 3 --profile-steps 5;;
  methods) bench 150 methods --model bert-base-random --parts training --batch-size 64 --steps 10 --warmup 3;;
  overhead) bench 150 overhead --model bert-base-random --parts overhead --batch-size 64 --overhead-steps 200;;
  *) echo "unknown part $part";;
esac; done
echo "=== done $(date +%T)"
