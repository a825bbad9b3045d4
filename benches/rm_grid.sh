#!/usr/bin/env bash
# The RM-question grid (docs/src/rm-question.md): per seed a parent run of the full loop, and
# counterfactual branches that share its first iterations and change one setting each
# (`rla-pipe replay --from N --set ... --into ...`). Then pipelines/sql/rm_grid.sql's table and
# the paired per-seed differences with bootstrap 95% intervals (benches/rm_grid.py).
# Resumable: rerunning continues every run where it stopped.
#
#   benches/rm_grid.sh [SEEDS] [ITERATIONS] [STORE] [PIPELINE]
#   benches/rm_grid.sh                       # 5 seeds, 8 iterations, ./runs-rm-grid/gridnav
#
# VARIANTS="lam0 m1" runs only those branches; PARENT_PREFIX=abl-rmadapt-s takes the parents
# from runs of that name (the ablation's full-loop runs, same file and seed: benches/ablation.sh
# makes them), so the household grid shares them:
#   VARIANTS="lam0 m1 balanced" PARENT_PREFIX=abl-rmadapt-s \
#     benches/rm_grid.sh 5 8 ./runs-ablation/household pipelines/ablation/household.toml
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/common.sh
seeds=${1:-5}
iters=${2:-8}
store=${3:-./runs-rm-grid/gridnav}
pipeline=${4:-pipelines/ablation/gridnav.toml}
rla_bin
started=$(date +%s)
# variant name, the iteration it branches from, its --set arguments
variants=(
  "lam0|1|reward.lambda=0"
  "lam05|1|reward.lambda=0.5"
  "lam2|1|reward.lambda=2"
  "m1|1|reward_model.samples=1"
  "m5|1|reward_model.samples=5"
  "band|1|reward.rm_acc_min=0 reward.rm_acc_max=1"
  "lr03|1|update.rm_lr=0.0009"
  "lr3|1|update.rm_lr=0.009"
  "steps2|1|update.rm_steps=48"
  "noadapt|1|adapt.enabled=false"
  "balanced|0|pretrain.rm_balance=true"
)
for ((seed = 0; seed < seeds; seed++)); do
  parent="${PARENT_PREFIX:-grid-s}$seed"
  echo "== $parent" >&2
  "$bin" run "$pipeline" --store "$store" --run-id "$parent" --iterations "$iters" \
    --set "run.seed=$seed" -q
  for v in "${variants[@]}"; do
    IFS='|' read -r name from sets <<<"$v"
    if [ -n "${VARIANTS:-}" ] && [[ " $VARIANTS " != *" $name "* ]]; then continue; fi
    args=()
    for s in $sets; do args+=(--set "$s"); done
    echo "== grid-s$seed-$name (from iteration $from: $sets)" >&2
    "$bin" replay --store "$store" --run "$parent" --from "$from" "${args[@]}" \
      --into "grid-s$seed-$name" -q
  done
done
echo "== wall time of this invocation: $(( $(date +%s) - started )) s" >&2
"$bin" sql --store "$store" --format csv --file pipelines/sql/rm_grid.sql >"$store/rm_grid.csv"
python3 benches/rm_grid.py "$store/rm_grid.csv" "${PARENT_PREFIX:-grid-s}"
echo "== what the consistency reward pays the RM for (the parents)"
"$bin" sql --store "$store" --file pipelines/sql/rm_target.sql
