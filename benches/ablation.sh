#!/usr/bin/env bash
# The paper's ablation (pipelines/ablation/<env>.toml): three settings — policy only (outcome
# reward, static tasks), + reward model, + reward model + adaptation — over SEEDS seeds each (5),
# the same iteration budget, every run warm-started by `pretrain` (the two smaller settings are
# branches of the full loop from iteration 0: what their overrides do not reach is shared
# with it, not executed again); plus, per seed, the
# pretrained models alone (`pre-s<seed>`: one iteration whose update takes no step, so its
# evaluation and RM accuracy are those of the warm start). Then the tables: per setting with
# bootstrap 95% intervals over the seeds and the settings paired per seed
# (pipelines/sql/ablation.sql → benches/ablation.py), the per-iteration curves, the reports (all
# runs; seed 0 of each setting, also as SVG figures), and the fingerprint of the first
# iteration (pipelines/sql/ablation_fingerprint.sql → REPORT_DIR/fingerprint.csv, with the
# commit in REPORT_DIR/measured.txt) that the test `ablation_tables_are_current` recomputes: a
# code change that moves the tables fails it. Runs resume: rerunning continues where it stopped.
#
# Also the learning curve (pipelines/sql/learning_curve.sql → benches/learning_curve.py): per
# setting and iteration held-out and OOD success with intervals over the seeds, after the warm
# start first, and the RL gain (last iteration minus the warm start, paired per seed).
#
#   [SEEDS=5] [ABL_SEEDS=SEEDS] [SETS="k=v ..."] benches/ablation.sh [ITERATIONS] [STORE] [REPORT_DIR] [ENV]
#   benches/ablation.sh                      # household, 5 seeds, 8 iterations, ./runs-ablation/household, docs/src/ablation/household
#   benches/ablation.sh 8 ./runs-ablation/gridnav docs/src/ablation/gridnav gridnav
# ENV names pipelines/ablation/ENV.toml, or is a pipeline file itself (a path ending in .toml),
# e.g. a pretrained model's curve: the full loop over 5 seeds, the other two settings over the
# first 3, every run evaluated sampled and greedy:
#   ABL_SEEDS=3 SETS="eval.mode=both" benches/ablation.sh 10 ./runs-curve/household \
#     docs/src/ablation/household-smollm2 pipelines/household-smollm2.toml
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-8}
env=${4:-household}
if [[ "$env" == *.toml ]]; then
  pipeline=$env
  env=$(basename "$env" .toml)
else
  pipeline=pipelines/ablation/$env.toml
fi
store=${2:-./runs-ablation/$env}
out=${3:-docs/src/ablation/$env}
extra=()
for kv in ${SETS:-}; do extra+=(--set "$kv"); done
# RLA_PIPE_BIN: a prebuilt binary (e.g. a copy, so rebuilding the tree meanwhile cannot mix
# versions between runs).
if [ -n "${RLA_PIPE_BIN:-}" ]; then
  bin=$RLA_PIPE_BIN
else
  cargo build --quiet
  bin="${CARGO_TARGET_DIR:-target}/debug/rla-pipe"
fi
started=$(date +%s)
runs=()
seeds=${SEEDS:-5}
abl_seeds=${ABL_SEEDS:-$seeds}
for ((seed = 0; seed < seeds; seed++)); do
  echo "== pre-s$seed" >&2
  "$bin" run "$pipeline" --store "$store" --run-id "pre-s$seed" --iterations 1 "${extra[@]}" \
    --set "run.seed=$seed" --set update.policy_steps=0 --set update.rm_steps=0 --set adapt.enabled=false
  settings=(rmadapt rm policy)   # the full loop first: every seed runs it
  if ((seed >= abl_seeds)); then settings=(rmadapt); fi
  for setting in "${settings[@]}"; do
    case "$setting" in
      policy) sets=(--set reward_model.enabled=false --set adapt.enabled=false) ;;
      rm) sets=(--set adapt.enabled=false) ;;
      rmadapt) sets=() ;;
    esac
    run="abl-$setting-s$seed"
    runs+=("$run")
    echo "== $run" >&2
    full="abl-rmadapt-s$seed"
    if [ "$setting" = rmadapt ] \
      || { "$bin" show --store "$store" "$run" >/dev/null 2>&1 \
        && ! "$bin" show --store "$store" "$run" 2>/dev/null | grep -q "branch of"; }; then
      # The full loop, or a run an earlier version of this script started: run (or resumed).
      "$bin" run "$pipeline" --store "$store" --run-id "$run" --iterations "$iters" "${extra[@]}" \
        --set "run.seed=$seed" "${sets[@]}"
    else
      # The other settings branch from the full loop at iteration 0: the stages their
      # overrides do not reach (the warm start, the rollout, ...) are shared, not executed
      # again; the rows are those a run of their own would commit.
      "$bin" replay --store "$store" --run "$full" --from 0 --into "$run" --iterations "$iters" \
        "${sets[@]}"
    fi
  done
done
echo "== wall time of this invocation: $(( $(date +%s) - started )) s" >&2
echo "== the ablation ($env, $iters iterations)"
"$bin" sql --store "$store" --format csv --file pipelines/sql/ablation.sql >"$store/ablation.csv"
python3 benches/ablation.py "$store/ablation.csv"
echo "== the warm start alone (pretrain, before any update)"
"$bin" sql --store "$store" --file pipelines/sql/pretrain_alone.sql
echo "== held-out success and RM process accuracy per iteration"
"$bin" sql --store "$store" --file pipelines/sql/ablation_curves.sql
echo "== the learning curve: after the warm start, then every iteration; the RL gain"
"$bin" sql --store "$store" --format csv --file pipelines/sql/learning_curve.sql >"$store/learning_curve.csv"
python3 benches/learning_curve.py "$store/learning_curve.csv"
mkdir -p "$out"
"$bin" sql --store "$store" --format csv --file pipelines/sql/ablation_fingerprint.sql >"$out/fingerprint.csv"
echo "measured on commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' + uncommitted changes to src/') with $iters iterations and $seeds seeds" >"$out/measured.txt"
# Every run in one report; the figures (SVG) from seed 0 of each setting, readable overlaid.
"$bin" report --store "$store" "${runs[@]}" --out "$out/report-all.html"
"$bin" report --store "$store" abl-policy-s0 abl-rm-s0 abl-rmadapt-s0 --out "$out/report.html" --svg-dir "$out"
