#!/usr/bin/env bash
# Issue 46's GPU measurements in one device run of about nine minutes (one H200 or H100), from the project root with
# the offline bundle of ../shared/gpu (`bash ../shared/gpu/make-bundle.sh` builds .gpu-bundle/):
#   bash benchmarks/gpu_check.sh [gpu64] [gpu512] [methods] [profile] [overhead]     (default: all, in this order)
# The bundle's check.sh sets up its packages and the random BERT-base / 2-layer models (no part of its own runs),
# then `raysent bench` measures, each part under a timeout that keeps the whole inside ten minutes; a part cut
# short keeps the cases it measured (the bench writes its record after every case). Everything goes to
# $OUT/results.tgz (refreshed after each part) and $OUT/log.txt; the .json/.md records are copied into
# results/bench/gpu-<date>/ by hand afterwards.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled
P=$(pwd); O=${OUT:-/tmp/gpu-check}; R=/tmp/gpu-bench; mkdir -p "$O" "$R"
PARTS=${*:-gpu64 gpu512 methods profile overhead}
bash .gpu-bundle/check.sh setup-only > "$O/setup.log" 2>&1  # a part name check.sh does not know: set-up only
# the bundle unpacks its wheels with zipfile, which drops the execute bit of Ray's own binaries (gcs_server, raylet)
find /tmp/site/ray -type f -path '*/core/src/*' -exec chmod +x {} +
export PYTHONPATH=/tmp/site:$P RAYSENT_DATA_DIR=$P/.gpu-bundle/data RAYSENT_MODEL_DIR=/tmp/gpu-models
exec > >(tee -a "$O/log.txt") 2>&1
tail -3 "$O/setup.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
bench() { local t=$1 out=$2; shift 2; echo "=== $out $(date +%T): bench $*"
  timeout -k 10 "$t" python3 -m raysent.cli bench --output-dir "$R/$out" "$@" 2>&1 | grep -vE "^\s*$"; echo "rc=${PIPESTATUS[0]}"
  tar czf "$O/results.tgz" -C /tmp gpu-bench; }
for part in $PARTS; do case $part in
  gpu64) bench 170 gpu64 --model bert-base-random --parts gpu --batch-size 64 --steps 30 --warmup 5 \
           --gpu-cases defaults,st-mnrl-bf16,fp32,length-buckets-4,fused-adamw-off,huge-pages-on,defaults-again,compile;;
  gpu512) bench 110 gpu512 --model bert-base-random --parts gpu --batch-size 512 --steps 10 --warmup 3 \
           --gpu-cases defaults,st-mnrl-bf16,compile;;
  profile) bench 80 profile --model bert-base-random --parts profile --batch-size 64 --warmup 3 --profile-steps 5;;
  methods) bench 150 methods --model bert-base-random --parts training --batch-size 64 --steps 10 --warmup 3;;
  overhead) bench 150 overhead --model bert-base-random --parts overhead --batch-size 64 --overhead-steps 200;;
esac; done
echo "=== done $(date +%T)"
