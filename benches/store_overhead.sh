#!/usr/bin/env bash
# The store's share of an iteration: Parquet encoding + blake3 + object-store upload of every
# stage's data files and checkpoints (each manifest's `store_seconds`, exposed as
# `stage_runs.store_seconds`), against the stages' wall time, on the default gridnav and
# household pipelines. The commit itself (one small manifest put per stage, after its timer
# stops) is within the process time outside the stages, printed per run as an upper bound.
#
#   benches/store_overhead.sh [GRIDNAV_ITERATIONS] [HOUSEHOLD_ITERATIONS] [STORE]
#   benches/store_overhead.sh 3 1            # the README's figures (about 6 minutes)
#   benches/store_overhead.sh 3 1 s3://b/x   # the same against an S3 store (AWS_* environment)
#
# `store_seconds` sums each stage's table writers, which run in parallel with its computation,
# so the share is an upper bound on the wall time the store costs.
set -euo pipefail
cd "$(dirname "$0")/.."
gi=${1:-3}
hi=${2:-1}
cargo build --quiet
bin="${CARGO_TARGET_DIR:-target}/debug/rla-pipe"
if [ -n "${3:-}" ]; then
  store=$3
else
  store=$(mktemp -d)
  trap 'rm -rf "$store"' EXIT
fi
for p in gridnav:$gi household:$hi; do
  name=${p%%:*}
  n=${p##*:}
  [ "$n" -gt 0 ] || continue
  start=$EPOCHREALTIME
  "$bin" -q run "pipelines/$name.toml" --store "$store" --run-id "bench-$name" --iterations "$n"
  end=$EPOCHREALTIME
  stages=$("$bin" -q sql --store "$store" --format csv \
    "SELECT sum(seconds) FROM stage_runs WHERE run_id = 'bench-$name'" | tail -n 1)
  awk -v a="$start" -v b="$end" -v r="$name" -v n="$n" -v s="$stages" \
    'BEGIN { printf "%s: %d iterations in %.1f s; outside the stages (process start, initial checkpoints, manifest puts, summaries): %.2f s\n", r, n, b - a, b - a - s }'
done
"$bin" sql --store "$store" "
SELECT run_id, stage, count(*) AS runs, round(sum(seconds), 2) AS stage_s,
  round(sum(store_seconds), 3) AS store_s,
  round(100 * sum(store_seconds) / sum(seconds), 2) AS store_pct,
  sum(bytes) AS bytes
FROM stage_runs WHERE run_id LIKE 'bench-%'
GROUP BY run_id, stage ORDER BY run_id, stage_s DESC"
"$bin" sql --store "$store" "
SELECT run_id, count(DISTINCT iter) AS iterations, round(sum(seconds), 1) AS stages_s,
  round(sum(store_seconds), 2) AS store_s,
  round(100 * sum(store_seconds) / sum(seconds), 2) AS store_pct_of_iteration,
  round(sum(bytes) / 1048576.0, 1) AS mib_written
FROM stage_runs WHERE run_id LIKE 'bench-%'
GROUP BY run_id ORDER BY run_id"
