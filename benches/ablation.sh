#!/usr/bin/env bash
# The paper's ablation on household (pipelines/ablation/household.toml): three settings —
# policy only (outcome reward, static tasks), + reward model, + reward model + adaptation — over
# three seeds each, the same iteration budget; then the table (pipelines/sql/ablation.sql) and the
# reports (all nine runs; seed 0 of each setting, also as SVG figures). Runs resume: rerunning
# continues where it stopped.
#
#   benches/ablation.sh [ITERATIONS] [STORE] [REPORT_DIR]
#   benches/ablation.sh                      # 5 iterations into ./runs-ablation, report in docs/ablation/
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-5}
store=${2:-./runs-ablation}
out=${3:-docs/ablation}
# RLA_PIPE_BIN: a prebuilt binary (e.g. a copy, so rebuilding the tree meanwhile cannot mix
# versions between runs).
if [ -n "${RLA_PIPE_BIN:-}" ]; then
  bin=$RLA_PIPE_BIN
else
  cargo build --quiet
  bin="${CARGO_TARGET_DIR:-target}/debug/rla-pipe"
fi
pipeline=pipelines/ablation/household.toml
runs=()
for seed in 0 1 2; do
  for setting in policy rm rmadapt; do
    case "$setting" in
      policy) sets=(--set reward_model.enabled=false --set adapt.enabled=false) ;;
      rm) sets=(--set adapt.enabled=false) ;;
      rmadapt) sets=() ;;
    esac
    run="abl-$setting-s$seed"
    runs+=("$run")
    echo "== $run" >&2
    "$bin" run "$pipeline" --store "$store" --run-id "$run" --iterations "$iters" \
      --set "run.seed=$seed" "${sets[@]}"
  done
done
"$bin" sql --store "$store" --file pipelines/sql/ablation.sql
mkdir -p "$out"
# Every run in one report; the figures (SVG) from seed 0 of each setting, readable overlaid.
"$bin" report --store "$store" "${runs[@]}" --out "$out/report-all.html"
"$bin" report --store "$store" abl-policy-s0 abl-rm-s0 abl-rmadapt-s0 --out "$out/report.html" --svg-dir "$out"
