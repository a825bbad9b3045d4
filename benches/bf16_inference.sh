#!/usr/bin/env bash
# bf16 inference on the CPU (AMX or AVX512-BF16) against f32, side by side: the inference stages of one iteration
# of a committed SmolLM2 run (rollout, RM scoring, evaluation; the update takes no step) as a
# branch from STORE's RUN at ITER, with `policy.inference_dtype = reward_model.inference_dtype`
# = bf16 and = f32 in turn (bf16, f32, bf16, f32, ...), every stage executed (--recompute).
# Prints per run and as medians: wall seconds, and the rollout, rm_score and evaluate stages'
# seconds; then the ratios bf16 / f32, and the CPU.
#
#   benches/bf16_inference.sh STORE RUN [ITER] [RUNS] [--set key=value ...]
#   benches/bf16_inference.sh ./runs-curve/household-smollm2 abl-rmadapt-s0 1 2 \
#     --set eval.tasks=8 --set eval.ood_tasks=4
#
# bf16 runs on AMX-BF16 (Intel Xeon 4th generation or later) or AVX512-BF16 (AMD Zen 4 or
# later), emulated in f32 elsewhere (the table names the kernel); it needs the pretrained model the
# run started from. The branches go into a copy of RUN in a temporary store, not into STORE.
# RLA_PIPE_BIN: a prebuilt binary (default: cargo build, dev profile).
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/common.sh
store=${1:?STORE}
run=${2:?RUN}
iter=${3:-1}
runs=${4:-2}
shift 4 || shift $#
sets_from "$@"
rla_bin
case "$store" in
  *://*) echo "STORE must be a local path (the run is copied)" >&2; exit 2 ;;
esac
tmp=$(mktemp -d /tmp/rla-bf16-bench.XXXX)
trap 'rm -rf "$tmp"' EXIT
cp -r "$store/$run" "$tmp/$run"
results="$tmp/results"
one() { # one run: the dtype
  local dtype=$1 id="$1-$RANDOM$RANDOM"
  local t0 t1
  t0=$(date +%s.%N)
  "$bin" replay --store "$tmp" --run "$run" --from "$iter" --iterations "$((iter + 1))" \
    --into "$id" --recompute --set "policy.inference_dtype=$dtype" \
    --set "reward_model.inference_dtype=$dtype" --set update.policy_steps=0 \
    --set update.rm_steps=0 "${extra[@]}" -q >"$tmp/log" 2>&1 || {
    cat "$tmp/log" >&2
    exit 1
  }
  t1=$(date +%s.%N)
  local stages
  stages=$("$bin" sql --store "$tmp" --run "$id" --format csv \
    "SELECT stage, round(seconds, 1) FROM stage_runs WHERE iter = $iter AND stage IN ('rollout', 'rm_score', 'evaluate') ORDER BY stage" |
    tail -n +2 | cut -d, -f2 | tr '\n' ' ')
  # stages in name order: evaluate, rm_score, rollout
  printf '%s %.1f %s\n' "$dtype" "$(python3 -c "print($t1 - $t0)")" "$stages" | tee -a "$results"
}
echo "dtype wall_s evaluate_s rm_score_s rollout_s"
for _ in $(seq "$runs"); do
  one bf16
  one f32
done
BF16_KERNEL=$(bf16_kernel) python3 - "$results" <<'PY'
import os, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = {d: [statistics.median(float(x[i]) for x in rows if x[0] == d) for i in (1, 2, 3, 4)]
       for d in ("bf16", "f32")}
print(f"\n| medians | f32 | bf16 ({os.environ['BF16_KERNEL']}) | bf16 / f32 |")
print("|---|---:|---:|---:|")
for i, what in enumerate(("wall (s)", "evaluate (s)", "rm_score (s)", "rollout (s)")):
    f, b = med["f32"][i], med["bf16"][i]
    print(f"| {what} | {f:,.1f} | {b:,.1f} | {b / f:.2f} |")
PY
echo
grep -m1 "model name" /proc/cpuinfo | sed 's/.*: /CPU: /'
echo "cores: $(nproc)"
