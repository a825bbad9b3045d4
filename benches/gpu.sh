#!/usr/bin/env bash
# The GPU path, measured where a GPU is available (needs an NVIDIA GPU and its driver; burn-cuda
# loads CUDA at run time, nothing is downloaded at build time):
#
#   benches/gpu.sh [MODEL_DIR]        # default models/smollm2-135m (README: how to convert it)
#
# 1. builds `--features cuda` (release);
# 2. the ignored GPU test: a cuda iteration commits, and the CUDA log-probabilities of the same
#    prefix-tree samples agree with the CPU's (tests/it/gpu.rs);
# 3. the smaller SmolLM2 household iteration (README, "Real models") on `cuda` and on `cpu`,
#    back to back: wall time, per-stage seconds and CPU use, tokens computed/reused, peak RSS;
# 4. benches/smollm2_update.py on the cuda binary (the same PPO update in PyTorch on the CPU:
#    its ratio is then GPU vs CPU, not like for like).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/smollm2-135m}
[ -f "$model/config.json" ] || { echo "no model at $model (README: SmolLM2 conversion)" >&2; exit 1; }
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/rla-pipe-target}"
cargo build --release --features cuda
bin="$CARGO_TARGET_DIR/release/rla-pipe"
cargo test --release --features cuda --test it gpu -- --ignored --nocapture
sets=(--set run.iterations=1 --set env.initial_tasks=4 --set rollout.slots_per_iter=2
  --set eval.tasks=2 --set eval.ood_tasks=2 --set env.max_steps=6
  --set reward_model.max_tokens=16 --set reward.policy_acc_min=0 --set reward.policy_acc_max=1
  --set "policy.init=hf:$model" --set "reward_model.init=hf:$model")
for device in cuda cpu; do
  store=$(mktemp -d)
  /usr/bin/time -f "$device: %e s wall, peak RSS %M KiB" \
    "$bin" run pipelines/household-smollm2.toml --store "$store" --run-id gpu "${sets[@]}" \
    --set "run.device=$device"
  "$bin" sql --store "$store" "SELECT stage, round(seconds, 1) AS s,
      round(cpu_seconds / seconds, 2) AS cores, tokens_computed, tokens_reused
    FROM stage_runs ORDER BY started_at"
  rm -rf "$store"
done
RLA_PIPE_BIN="$bin" python3 benches/smollm2_update.py pipelines/household-smollm2.toml \
  --set run.device=cuda
