#!/usr/bin/env bash
# The GPU path, measured where a GPU is available (needs an NVIDIA GPU and its driver; burn-cuda
# loads CUDA at run time, nothing is downloaded at build time):
#
#   benches/gpu.sh [MODEL_DIR]        # default models/smollm2-135m (README: how to convert it)
#
# (benches/gpu_profile.py profiles the same iteration — per stage, per kernel, peak device memory,
# against PyTorch, transformers and the CPU — in one call, with a binary built elsewhere.)
#
# 1. builds `--features cuda` (release), unless RLA_PIPE_BIN names a cuda binary built already
#    (and RLA_PIPE_IT the matching `it` test binary: a GPU machine without a Rust toolchain);
# 2. the ignored GPU test: a cuda iteration commits, and the CUDA log-probabilities of the same
#    prefix-tree samples agree with the CPU's (tests/it/gpu.rs);
# 3. the smaller SmolLM2 household iteration (README, "Real models") on `cuda` and on `cpu`,
#    back to back: wall time, peak RSS, peak GPU memory in use, per-stage seconds and CPU use,
#    tokens computed/reused. The cuda run also dumps its update (RLA_PIPE_BENCH_UPDATE: the
#    weights and samples, a few seconds of writing inside its update stage);
# 4. benches/smollm2_update.py on that dump with PyTorch on the GPU (TORCH_DEVICE=cuda): the
#    same PPO update, burn-cuda vs PyTorch CUDA, like for like.
#
# RANDOM_WEIGHTS=1: MODEL_DIR needs only config.json, generation_config.json and the tokenizer
# files; the weights are initialised at random (transformers, seed 0) in a temporary copy —
# for a GPU machine the 540 MB of weights cannot be copied to. Speed depends on the shapes,
# not the values, but a random policy's and RM's samples carry no advantage, so the update
# then trains nothing (and step 4 compares nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/smollm2-135m}
[ -f "$model/config.json" ] || { echo "no model at $model (README: SmolLM2 conversion)" >&2; exit 1; }
if [ "${RANDOM_WEIGHTS:-}" = 1 ]; then
  random=$(mktemp -d)
  cp "$model"/config.json "$model"/generation_config.json "$model"/tokenizer*.json "$random"/
  python3 - "$random" <<'PY'
import sys, torch, transformers
torch.manual_seed(0)
cfg = transformers.AutoConfig.from_pretrained(sys.argv[1])
transformers.AutoModelForCausalLM.from_config(cfg).float().save_pretrained(sys.argv[1])
PY
  # the model's own config (transformers 5 rewrites it in its newer layout)
  cp "$model"/config.json "$model"/generation_config.json "$random"/
  model=$random
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/rla-pipe-target}"
if [ -z "${RLA_PIPE_BIN:-}" ]; then
  cargo build --release --features cuda
  RLA_PIPE_BIN="$CARGO_TARGET_DIR/release/rla-pipe"
  RLA_PIPE_IT=test
fi
# a failure is reported at the end; the measurements still run
status=0
if [ "${RLA_PIPE_IT:-}" = test ]; then
  timeout "${GPU_TEST_TIMEOUT:-1800}" \
    cargo test --release --features cuda --test it gpu -- --ignored --nocapture || status=$?
elif [ -n "${RLA_PIPE_IT:-}" ]; then
  timeout "${GPU_TEST_TIMEOUT:-1800}" "$RLA_PIPE_IT" gpu --ignored --nocapture || status=$?
fi
bin=$RLA_PIPE_BIN
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
sets=(--set run.iterations=1 --set env.initial_tasks=4 --set rollout.slots_per_iter=2
  --set eval.tasks=2 --set eval.ood_tasks=2 --set env.max_steps=6
  --set reward_model.max_tokens=16 --set reward.policy_acc_min=0 --set reward.policy_acc_max=1
  --set "policy.init=hf:$model" --set "reward_model.init=hf:$model"
  --set pretrain.enabled=false --set policy.lora.rank=0 --set reward_model.lora.rank=0
  --set policy.inference_dtype=f32 --set reward_model.inference_dtype=f32 --set update.base_dtype=f32
  --set update.policy_lr=1e-5 --set update.rm_lr=1e-5)
# wall seconds and the peak RSS of a command and its children (no /usr/bin/time needed)
timed() {
  python3 -c 'import resource, subprocess, sys, time
t = time.perf_counter(); rc = subprocess.call(sys.argv[2:])
print(f"{sys.argv[1]}: {time.perf_counter() - t:.1f} s wall, peak RSS "
      f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1048576:.2f} GiB", flush=True)
sys.exit(rc)' "$@"
}
dump=$(mktemp -d)/dump
for device in cuda cpu; do
  store=$(mktemp -d)
  smi=$(mktemp)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$smi" 2>/dev/null &
  watch=$!
  if [ "$device" = cuda ]; then export RLA_PIPE_BENCH_UPDATE=$dump; fi
  timed "$device" "$bin" run pipelines/household-smollm2.toml --store "$store" --run-id gpu \
    "${sets[@]}" --set "run.device=$device" -q || status=$?
  unset RLA_PIPE_BENCH_UPDATE
  kill "$watch" 2>/dev/null || true
  echo "$device: peak GPU memory in use $(sort -n "$smi" | tail -1) MiB (whole device)"
  "$bin" sql --store "$store" "SELECT stage, round(seconds, 1) AS s,
      round(cpu_seconds / seconds, 2) AS cores, tokens_computed, tokens_reused
    FROM stage_runs ORDER BY started_at" || status=$?
  rm -rf "$store" "$smi"
done
DUMP=$dump TORCH_DEVICE=cuda RLA_PIPE_BIN="$bin" python3 benches/smollm2_update.py || status=$?
exit $status
