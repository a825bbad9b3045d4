#!/usr/bin/env bash
# Generation after long prompts (docs/src/performance.md, "Long prompts"): `rla-pipe model
# generate` on 16 prompts of ~520 tokens (the same words every time: a seeded draw from a
# household vocabulary, each prompt numbered), sampled at T = 0.8 with seed 3, MAX_TOKENS new
# tokens each. Time it whole, e.g. two builds side by side in turn; MAX_TOKENS = 1 times the
# prompts' encoding alone.
#
#   RLA_PIPE_BIN=target/release/rla-pipe benches/long_prompts.sh [MODEL_DIR] [MAX_TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/common.sh
rla_bin
model=${1:-models/smollm2-135m}
max=${2:-48}
long=$(python3 -c '
import random
random.seed(0)
words = "the a kitchen table apple drawer open close take put go north south east west key chest room door you see here an old wooden box on floor".split()
print(" ".join(random.choice(words) for _ in range(520)))')
args=()
for i in $(seq 16); do args+=(--prompt "$long $i"); done
exec "$bin" model generate "$model" "${args[@]}" --max-tokens "$max" --temperature 0.8 --seed 3 -q
