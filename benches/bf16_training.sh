#!/usr/bin/env bash
# Adapters trained over a bf16 base on the CPU (AMX or AVX512-BF16) against f32, side by side: the update stage of
# one iteration of a committed run whose models have adapters (a SmolLM2 file), re-executed as
# a branch from STORE's RUN at ITER with `update.base_dtype` = bf16 and = f32 in turn (bf16, f32,
# bf16, f32, ...). Rollout and RM scoring are shared from the parent (their settings did not
# change), so both dtypes train on the same samples; `update.cuda_micro_batch_tokens`, which the
# CPU ignores, is set to 1 in both so that the f32 update re-executes instead of being shared.
# The stages after the update (task accuracy, judge, adaptation, evaluation) run too: shrink
# the evaluation with --set eval.tasks=1 --set eval.ood_tasks=1.
# Prints per run: the update stage's seconds and CPU seconds; then medians, the ratio bf16 / f32,
# and per optimizer step the loss and gradient norm of both (the same samples: the relative
# differences are bf16's rounding).
#
#   benches/bf16_training.sh STORE RUN [ITER] [RUNS] [--set key=value ...]
#   benches/bf16_training.sh ./runs/household-smollm2 base 0 2 --set eval.tasks=1 --set eval.ood_tasks=1
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
iter=${3:-0}
runs=${4:-2}
shift 4 || shift $#
sets_from "$@"
rla_bin
case "$store" in
  *://*) echo "STORE must be a local path (the run is copied)" >&2; exit 2 ;;
esac
tmp=$(mktemp -d /tmp/rla-bf16-train.XXXX)
trap 'rm -rf "$tmp"' EXIT
cp -r "$store/$run" "$tmp/$run"
results="$tmp/results"
ids=()
one() { # one run: the dtype
  local dtype=$1 id="$1-$RANDOM$RANDOM"
  ids+=("$id")
  "$bin" replay --store "$tmp" --run "$run" --from "$iter" --iterations "$((iter + 1))" \
    --into "$id" --set "update.base_dtype=$dtype" --set update.cuda_micro_batch_tokens=1 \
    "${extra[@]}" -q >"$tmp/log" 2>&1 || {
    cat "$tmp/log" >&2
    exit 1
  }
  local row
  row=$("$bin" sql --store "$tmp" --run "$id" --format csv \
    "SELECT round(seconds, 1), round(cpu_seconds, 1) FROM stage_runs WHERE iter = $iter AND stage = 'update'" |
    tail -n +2 | tr ',' ' ')
  printf '%s %s %s\n' "$dtype" "$id" "$row" | tee -a "$results"
}
echo "dtype run update_s update_cpu_s"
for _ in $(seq "$runs"); do
  one bf16
  one f32
done
BF16_KERNEL=$(bf16_kernel) python3 - "$results" <<'PY'
import os, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = {d: [statistics.median(float(x[i]) for x in rows if x[0] == d) for i in (2, 3)]
       for d in ("bf16", "f32")}
print(f"\n| medians | f32 | bf16 ({os.environ['BF16_KERNEL']}) | bf16 / f32 |")
print("|---|---:|---:|---:|")
for i, what in enumerate(("update (s)", "update, CPU (s)")):
    f, b = med["f32"][i], med["bf16"][i]
    print(f"| {what} | {f:,.1f} | {b:,.1f} | {b / f:.2f} |")
PY
bf=$(grep '^bf16' "$results" | head -1 | cut -d' ' -f2)
f32=$(grep '^f32' "$results" | head -1 | cut -d' ' -f2)
echo
echo "per optimizer step, the first bf16 and f32 runs (the same samples):"
"$bin" sql --store "$tmp" \
  "SELECT a.model, a.step, a.loss AS bf16_loss, b.loss AS f32_loss, a.grad_norm AS bf16_grad_norm,
      b.grad_norm AS f32_grad_norm,
      round(abs(a.grad_norm - b.grad_norm) / b.grad_norm, 4) AS grad_norm_rel_diff
    FROM update_metrics a JOIN update_metrics b
      ON a.iter = b.iter AND a.model = b.model AND a.step = b.step
    WHERE a.run_id = '$bf' AND b.run_id = '$f32' AND a.iter = $iter ORDER BY a.model, a.step"
echo
grep -m1 "model name" /proc/cpuinfo | sed 's/.*: /CPU: /'
echo "cores: $(nproc)"
