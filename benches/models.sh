#!/usr/bin/env bash
# Model throughput on a pipeline (default: pipelines/gridnav.toml, the full model loop), read back
# with SQL from what the run committed: rollout env steps/s (policy scoring included), RM samples/s,
# update tokens/s (forward tokens of the PPO steps; the snapshot pass is not counted), and the
# wall time of each iteration.
#
#   benches/models.sh [ITERATIONS] [DEVICE] [PIPELINE]
#   benches/models.sh 10                       # the issue's target: 10 iterations of gridnav, CPU
#   benches/models.sh 3 ndarray                # burn's ndarray backend (builds --features ndarray)
#   benches/models.sh 3 cuda                   # a GPU (builds --features cuda)
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-10}
device=${2:-cpu}
pipeline=${3:-pipelines/gridnav.toml}
features=()
case "$device" in
  cuda | ndarray) features=(--features "$device") ;;
esac
cargo build --quiet "${features[@]}"
bin="${CARGO_TARGET_DIR:-target}/debug/rla-pipe"
store=$(mktemp -d)
trap 'rm -rf "$store"' EXIT
start=$EPOCHREALTIME
"$bin" run "$pipeline" --store "$store" --run-id bench --iterations "$iters" --set "run.device=$device"
end=$EPOCHREALTIME
awk -v a="$start" -v b="$end" -v d="$device" -v n="$iters" 'BEGIN { printf "device %s: %d iterations in %.1f s\n", d, n, b - a }'
"$bin" sql --store "$store" "
WITH t AS (SELECT iter, stage, seconds FROM stage_runs)
SELECT s.iter,
  round(s.n / r.seconds) AS rollout_steps_per_s,
  round(coalesce(j.n, 0) / m.seconds) AS rm_samples_per_s,
  round(coalesce(u.tokens, 0) / up.seconds) AS update_tokens_per_s,
  round(i.seconds, 1) AS iteration_s
FROM (SELECT iter, count(*) AS n FROM steps GROUP BY iter) s
JOIN t r ON r.iter = s.iter AND r.stage = 'rollout'
JOIN t m ON m.iter = s.iter AND m.stage = 'rm_score'
JOIN t up ON up.iter = s.iter AND up.stage = 'update'
JOIN (SELECT iter, sum(seconds) AS seconds FROM stage_runs GROUP BY iter) i ON i.iter = s.iter
LEFT JOIN (SELECT iter, count(*) AS n FROM rm_samples GROUP BY iter) j ON j.iter = s.iter
LEFT JOIN (SELECT iter, sum(tokens) AS tokens FROM update_metrics GROUP BY iter) u ON u.iter = s.iter
ORDER BY s.iter"
"$bin" sql --store "$store" "
SELECT e.iter,
  round(sum(e.successes) * 1.0 / sum(e.rollouts), 3) AS held_out_success,
  (SELECT round(avg(acc), 3) FROM task_accuracy a WHERE a.iter = e.iter) AS train_success,
  (SELECT round(sum(rm_process_acc * judged_steps) / sum(judged_steps), 3) FROM task_accuracy a WHERE a.iter = e.iter) AS rm_process_acc
FROM evaluations e WHERE e.split = 'held_out' GROUP BY e.iter ORDER BY e.iter"
