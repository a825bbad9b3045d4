#!/usr/bin/env bash
# Crash soak: crash a small gridnav run 12 times at named points of the commit protocol (the
# engine's RLA_PIPE_CRASH_AT hook: after a stage's data, after its checkpoints, after its
# manifest, before `_iteration.json`) and kill -9 it at KILLS random moments (inside stage
# computation and writes, wherever the moment falls), resume it each time, then check that
#   - every resume completed and the run reached its iterations,
#   - after every kill `sql` answered and saw only whole committed stages (its steps /
#     trajectories counts are those of 0..N committed rollouts of the uninterrupted run),
#   - the final tables and checkpoints equal an uninterrupted run's (ordered CSV of every table,
#     blake3 of every committed artifact), and `replay --verify` passes,
#   - `gc` removes every orphaned file the kills left, and a second `gc` finds none.
#
#   benches/soak.sh [KILLS] [DIR]       # defaults: 24 kills, a temporary directory
#   SOAK_ITERATIONS=16 (default): the run's length, enough work for all the crashes
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/common.sh
kills=${1:-24}
dir=${2:-$(mktemp -d)}
rla_bin
iters=${SOAK_ITERATIONS:-16}
sets=()
for s in env.initial_tasks=8 rollout.n=4 eval.tasks=8 policy.d_model=16 policy.context=48 \
  reward_model.d_model=16 reward_model.context=64 update.policy_steps=2 update.rm_steps=2 \
  update.minibatch=64 pretrain.policy_episodes=8 pretrain.policy_epochs=1 pretrain.rm_steps=64 \
  pretrain.rm_epochs=1; do
  sets+=(--set "$s")
done
run() { "$bin" -q run pipelines/gridnav.toml --store "$1" --run-id soak --iterations "$iters" "${sets[@]}"; }
counts() {
  "$bin" sql --store "$1" --format csv \
    "SELECT (SELECT count(*) FROM steps) AS s, (SELECT count(*) FROM trajectories) AS t" 2>&1 | tail -n 1
}

ref="$dir/ref"
soak="$dir/soak"
rm -rf "$ref" "$soak"
start=$(date +%s%N)
run "$ref"
ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "== uninterrupted run: ${ms} ms"

# The counts a reader may see: those after 0..iters committed rollouts.
allowed="0,0"
for ((i = 0; i < iters; i++)); do
  allowed="$allowed $("$bin" sql --store "$ref" --format csv \
    "SELECT (SELECT count(*) FROM steps WHERE iter <= $i) AS s, (SELECT count(*) FROM trajectories WHERE iter <= $i) AS t" | tail -n 1)"
done

killed=0
attempts=0
bad_reads=0
check_reads() {
  seen=$(counts "$soak")
  case " $allowed " in
    *" $seen "*) ;;
    *)
      if [[ "$seen" != *"holds no run"* && "$seen" != *"no store there"* ]]; then
        echo "after $1: sql saw '$seen', not one of: $allowed"
        bad_reads=$((bad_reads + 1))
      fi
      ;;
  esac
}
# First the named points of the commit protocol (the engine's RLA_PIPE_CRASH_AT hook aborts
# the process there, as kill -9 would): each point, three times, at its 1st–4th occurrence.
named=0
for point in after-data after-artifacts after-manifest before-iteration; do
  for rep in 1 2 3; do
    n=$(( RANDOM % 4 + 1 ))
    attempts=$((attempts + 1))
    # (bash reports each abort as "Aborted": expected)
    if ( RLA_PIPE_CRASH_AT="$point:$n" exec "$bin" -q run pipelines/gridnav.toml --store "$soak" \
        --run-id soak --iterations "$iters" "${sets[@]}" > "$dir/attempt.log" 2>&1 ) 2>/dev/null; then
      echo "crash at $point:$n: the run finished first"
    else
      grep -q "aborting at $point" "$dir/attempt.log" || { cat "$dir/attempt.log"; exit 1; }
      named=$((named + 1))
    fi
    check_reads "$point:$n"
  done
done
echo "== $named crashes at named points of the commit protocol"
attempts=0
# Each attempt resumes the run and is killed after a random 0–700 ms (a stage here takes
# 1–300 ms, so kills land inside stages as well as between commits) until KILLS attempts died
# mid-run; an attempt that finishes the run ends the soak early.
while [ "$killed" -lt "$kills" ]; do
  attempts=$((attempts + 1))
  at=$(( RANDOM % 700 ))
  # exec: $! is rla-pipe itself, so kill -9 hits it (not a wrapping shell).
  ( exec "$bin" -q run pipelines/gridnav.toml --store "$soak" --run-id soak --iterations "$iters" "${sets[@]}" ) \
    > "$dir/attempt.log" 2>&1 &
  pid=$!
  sleep "$(awk "BEGIN { print $at / 1000 }")"
  if kill -9 "$pid" 2>/dev/null; then
    killed=$((killed + 1))
    wait "$pid" 2>/dev/null || true
  else
    wait "$pid" 2>/dev/null || true
    echo "attempt $attempts finished the run before its kill at ${at} ms"
    break
  fi
  check_reads "kill $killed at ${at} ms"
done
echo "== $killed kill -9s mid-run in $attempts attempts; sql after each: $bad_reads bad reads"

run "$soak"
for t in tasks trajectories steps rm_samples step_rewards policy_advantages rm_advantages \
  update_metrics task_accuracy judgements adaptations evaluations demonstrations; do
  n=$("$bin" sql --store "$ref" --format csv "SELECT * FROM $t LIMIT 1" | head -n 1 | tr ',' '\n' | wc -l)
  order=$(seq -s, 1 "$n")
  a=$("$bin" sql --store "$ref" --format csv "SELECT * FROM $t ORDER BY $order" | sha256sum)
  b=$("$bin" sql --store "$soak" --format csv "SELECT * FROM $t ORDER BY $order" | sha256sum)
  if [ "$a" != "$b" ]; then
    echo "table $t differs from the uninterrupted run"
    exit 1
  fi
done
echo "== every table equals the uninterrupted run's"
refck=$(cd "$ref/soak/artifacts" && find . -type f | sort)
"$bin" gc --store "$soak" --grace-secs 0 | tail -n 1
soakck=$(cd "$soak/soak/artifacts" && find . -type f | sort)
if [ "$refck" != "$soakck" ]; then
  echo "checkpoints differ from the uninterrupted run's:"
  diff <(echo "$refck") <(echo "$soakck") || true
  exit 1
fi
echo "== every checkpoint equals the uninterrupted run's (content-addressed names, after gc)"
left=$("$bin" gc --store "$soak" --grace-secs 0 --dry-run | tail -n 1)
echo "== a second gc: $left"
case "$left" in *" 0 "*) ;; *) echo "orphans remain"; exit 1 ;; esac
for ((i = 0; i < iters; i++)); do
  "$bin" replay --store "$soak" --run soak --iter "$i" --verify | tail -n 1
done
[ "$bad_reads" -eq 0 ] || exit 1
echo "== soak passed: $((named + killed)) crashes survived ($named at named points, $killed kill -9s at random moments), identical outputs"
