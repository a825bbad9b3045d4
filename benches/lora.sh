#!/usr/bin/env bash
# LoRA against full fine-tuning, side by side: one iteration of the smaller SmolLM2 household
# variant (pipelines/household-smollm2.toml with the sets below) with adapters (r = 8 on the 7
# projections of both models) and with full weights, in turn (LoRA, full, LoRA, full, ...),
# each into a fresh store. Prints per run and as medians: wall seconds, peak RSS, the store's
# bytes after the iteration (tables + checkpoints), the update stage's seconds; then the
# ratios LoRA / full.
#
#   benches/lora.sh [RUNS] [--set key=value ...]     # RUNS per setting, default 2
#   LAYERS=8 benches/lora.sh [RUNS] [...]             # adapters on every layer against the last 8
#
# With LAYERS=N the second setting is not full fine-tuning but adapters on the last N decoder
# layers only (`policy.lora.layers` = `reward_model.lora.layers` = N; the ratios are top-N /
# every layer).
# Extra sets apply to both (the issue's baseline: --set reward_model.reply_prefix= --set
# update.micro_batch_tokens=0). Needs models/smollm2-135m (the pipeline's header says how to
# convert it offline). RLA_PIPE_BIN: a prebuilt binary (default: cargo build, dev profile).
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/common.sh
runs=${1:-2}
shift || true
sets_from "$@"
rla_bin
[ -f models/smollm2-135m/model.safetensors ] || {
  echo "models/smollm2-135m is missing: see the header of pipelines/household-smollm2.toml" >&2
  exit 1
}
sets=(--set env.initial_tasks=4 --set rollout.slots_per_iter=2 --set eval.tasks=2
  --set eval.ood_tasks=2 --set env.max_steps=6 --set reward_model.max_tokens=16
  --set reward.policy_acc_min=0 --set reward.policy_acc_max=1
  --set pretrain.enabled=false --set policy.lora.rank=0 --set reward_model.lora.rank=0
  --set update.policy_lr=1e-5 --set update.rm_lr=1e-5
  --set policy.inference_dtype=f32 --set reward_model.inference_dtype=f32 --set update.base_dtype=f32)
lora=(--set policy.lora.rank=8 --set reward_model.lora.rank=8)
tmp=$(mktemp -d /tmp/rla-lora-bench.XXXX)
trap 'rm -rf "$tmp"' EXIT
results="$tmp/results"
one() { # one RUN: name, then the extra args
  local name=$1; shift
  local store="$tmp/store-$name"
  rm -rf "$store"
  local t0 t1
  t0=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$tmp/rss" "$bin" run pipelines/household-smollm2.toml --store "$store" \
    --run-id b --iterations 1 "${sets[@]}" "$@" "${extra[@]}" -q >"$tmp/log" 2>&1 || {
    cat "$tmp/log" >&2
    exit 1
  }
  t1=$(date +%s.%N)
  local bytes update
  bytes=$(du -sb "$store" | cut -f1)
  update=$("$bin" sql --store "$store" --format csv \
    "SELECT round(seconds, 1) FROM stage_runs WHERE stage = 'update'" | tail -1)
  printf '%s %.1f %d %d %s\n' "$name" "$(python3 -c "print($t1 - $t0)")" "$(cat "$tmp/rss")" "$bytes" "$update" |
    tee -a "$results"
}
echo "setting wall_s peak_rss_kb store_bytes update_s"
if [ -n "${LAYERS:-}" ]; then
  second=(top "${lora[@]}" --set "policy.lora.layers=$LAYERS" --set "reward_model.lora.layers=$LAYERS")
else
  second=(full)
fi
for _ in $(seq "$runs"); do
  one lora "${lora[@]}"
  one "${second[@]}"
done
python3 - "$results" "${LAYERS:-}" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
layers = sys.argv[2]
other = "top" if layers else "full"
med = {}
for name in ("lora", other):
    r = [x for x in rows if x[0] == name]
    med[name] = [statistics.median(float(x[i]) for x in r) for i in (1, 2, 3, 4)]
if layers:
    print(f"\n| medians | LoRA r = 8, every layer | the last {layers} layers | last {layers} / every |")
else:
    print("\n| medians | full fine-tuning | LoRA r = 8 | LoRA / full |")
print("|---|---:|---:|---:|")
for i, what in enumerate(("wall (s)", "peak RSS (MiB)", "store growth (MB)", "update stage (s)")):
    scale = (1, 1 / 1024, 1e-6, 1)[i]
    if layers:
        f, l = med["lora"][i] * scale, med["top"][i] * scale
    else:
        f, l = med["full"][i] * scale, med["lora"][i] * scale
    print(f"| {what} | {f:,.2f} | {l:,.2f} | {l / f:.3f} |")
EOF
