#!/usr/bin/env bash
# A lent GPU machine's whole measurement in one call, with everything built here beforehand
# (docs/src/real-models.md, "The GPU path"). Such a machine has no Rust toolchain and a short
# lease, so it builds nothing:
#
#   benches/gpu_lease.sh pack [MODEL_DIR]   # here: builds the `--features cuda` CLI and the `it`
#                                           # test binary, strips and compresses them into lease/
#                                           # with MODEL_DIR's JSON files (config, tokenizer;
#                                           # default models/smollm2-135m): ~46 MB, no weights
#   benches/gpu_lease.sh slim               # here: the book's kept runs out of the index, so
#                                           # that the working tree and lease/ fit a call's 64 MiB
#   (the call: `benches/gpu_lease.sh run`, carrying lease/, a 600 s limit)
#   benches/gpu_lease.sh unslim             # here, right after: the kept runs back
#   benches/gpu_lease.sh run [--budget S] [-- PROFILE_ARGS...]
#                                           # there, from the repository's root, with lease/
#                                           # beside it: the ignored GPU test, then
#                                           # benches/gpu_profile.py in what is left of S seconds
#                                           # (default 540)
#
# `run` unpacks lease/, points the test binary at the unpacked CLI (RLA_PIPE_TEST_BIN), links
# the build's repository root (Cargo writes it into the test binary) to this one unless something
# is there already, runs `it gpu --ignored` (GPU_TEST_TIMEOUT, default 150 s), then the profile with the
# rest of the budget, and writes to $OUT (or ./lease-out): summary.txt (the profile's table
# and the test's verdict), gpu-test.log, and profile.tar.xz (every log of the profile).
# PROFILE_ARGS go to benches/gpu_profile.py as they are; LEASE_MODEL overrides the model's
# directory (a CPU check of this script with `-- --device cpu --real-weights ...` needs the
# weights: LEASE_MODEL=models/smollm2-135m).
#
# The build: the dev profile with rla-pipe at opt-level 2 (dependencies are optimised in the
# dev profile already), the profile benches/gpu_profile.py's figures were measured with since
# 11-28.
set -euo pipefail
cd "$(dirname "$0")/.."
lease=lease

pack() {
  local model=${1:-models/smollm2-135m}
  ls "$model"/config.json "$model"/tokenizer.json >/dev/null \
    || { echo "pack: no model's config and tokenizer in $model (README: SmolLM2 conversion)" >&2; exit 1; }
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/rla-pipe-target}"
  local cfg=(--features cuda --config 'profile.dev.package.rla-pipe.opt-level=2')
  local it
  it=$(cargo test "${cfg[@]}" --test it --no-run --message-format=json-render-diagnostics \
    | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "it" and m.get("executable"):
        print(m["executable"])')
  [ -x "$it" ] || { echo "pack: cargo built no \`it\` test binary" >&2; exit 1; }
  # The CLI the test binary was built with (the same features).
  local cli=$CARGO_TARGET_DIR/debug/rla-pipe
  rm -rf "$lease"
  mkdir -p "$lease/model"
  cp "$model"/*.json "$lease/model/"
  # One xz stream over both (x86 filter, a dictionary that spans both): the library's code is
  # in both binaries, and a solid stream stores it about once. 61 MB as two streams at `-6`,
  # 44 MB so; ~5 minutes of one core.
  local staged
  staged=$(mktemp -d)
  strip -o "$staged/rla-pipe" "$cli"
  strip -o "$staged/it" "$it"
  tar -C "$staged" -cf - rla-pipe it \
    | xz -T1 --x86 --lzma2=preset=6,dict=384MiB >"$lease/bin.tar.xz"
  rm -rf "$staged"
  {
    echo "commit=$(git rev-parse HEAD)$(git diff --quiet HEAD || echo +changes)"
    echo "manifest_dir=$PWD"
    echo "built=$(date -u +%FT%TZ) on $(uname -m)"
  } >"$lease/paths"
  ls -l "$lease" "$lease/model"
  travels || echo "pack: packed; the call needs \`benches/gpu_lease.sh slim\` first"
}

run() {
  local budget=540
  while [ $# -gt 0 ]; do
    case $1 in
      --budget) budget=$2; shift 2 ;;
      --) shift; break ;;
      *) echo "run: unknown argument $1 (usage: run [--budget S] [-- PROFILE_ARGS...])" >&2; exit 2 ;;
    esac
  done
  local start=$SECONDS
  [ -f "$lease/paths" ] || { echo "run: no $lease/paths: run \`benches/gpu_lease.sh pack\` first and carry $lease/" >&2; exit 1; }
  local out=${OUT:-$PWD/lease-out}
  mkdir -p "$out"
  local bin=${TMPDIR:-/tmp}/rla-pipe-lease/bin
  mkdir -p "$bin"
  # (Python's tarfile: the lent machine's image need not have xz.)
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
    "$lease/bin.tar.xz" "$bin"
  chmod +x "$bin/rla-pipe" "$bin/it"
  local manifest_dir
  manifest_dir=$(sed -n 's/^manifest_dir=//p' "$lease/paths")
  # The test binary runs this CLI (tests/it/main.rs, `rla_pipe_bin`), and reads pipelines/ under
  # the repository's root of the build.
  export RLA_PIPE_TEST_BIN=$bin/rla-pipe
  if [ ! -e "$manifest_dir" ]; then
    mkdir -p "$(dirname "$manifest_dir")" && ln -s "$PWD" "$manifest_dir" \
      || echo "run: could not link $manifest_dir to $PWD: the test's iteration will fail" >&2
  fi
  {
    echo "lease: $(tr '\n' ' ' <"$lease/paths")"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 \
      || echo "no GPU: nvidia-smi failed or is missing"
  } | tee "$out/summary.txt"
  local test_rc=0
  if command -v nvidia-smi >/dev/null; then
    ( cd "$manifest_dir" && timeout "${GPU_TEST_TIMEOUT:-150}" "$bin/it" gpu --ignored --nocapture \
      --test-threads 1 ) >"$out/gpu-test.log" 2>&1 || test_rc=$?
  else
    # No GPU (a check of this script): the one GPU test that runs without one.
    ( cd "$manifest_dir" && "$bin/it" gpu::cuda_without_a_gpu_is_an_error_not_a_panic --exact --nocapture ) \
      >"$out/gpu-test.log" 2>&1 || test_rc=$?
  fi
  echo "GPU test: exit $test_rc after $((SECONDS - start)) s; $(grep -E '^test result' "$out/gpu-test.log" || echo 'no result line')" \
    | tee -a "$out/summary.txt"
  local rest=$((budget - (SECONDS - start) - 15))
  local model=${LEASE_MODEL:-$lease/model}
  local profile_rc=0
  mkdir -p "$out/profile"
  PYTHONUNBUFFERED=1 RLA_PIPE_BIN="$bin/rla-pipe" \
    python3 benches/gpu_profile.py "$model" --budget "$rest" --out "$out/profile" "$@" \
    >"$out/profile.log" 2>&1 || profile_rc=$?
  echo "profile: exit $profile_rc after $((SECONDS - start)) s in all" | tee -a "$out/summary.txt"
  # The profile's summary table: the end of its output.
  tail -n 80 "$out/profile.log" | tee -a "$out/summary.txt"
  mv "$out/profile.log" "$out/profile/"
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "w:xz").add(sys.argv[2], "profile")' \
    "$out/profile.tar.xz" "$out/profile" && rm -rf "$out/profile"
  [ "$test_rc" = 0 ] && [ "$profile_rc" = 0 ]
}

# The book's kept runs (docs/src/ablation/*/kept: ~83 MB in 13k files, what benches/ablation.sh
# extends a grid from) are tracked, and a call carries at most 64 MiB of working tree with
# lease/: `slim` takes them out of the index (the files stay where they are) and ignores them
# while a call is made; `unslim` puts them back. Between the two, a commit is refused (a hook):
# it would delete them from the repository.
kept='docs/src/ablation/*/kept/*'
# (Here only: the lent machine's copy of the working tree need not be a git repository.)
git_paths() {
  marker=$(git rev-parse --git-path rla-pipe-slim)
  hook=$(git rev-parse --git-path hooks/pre-commit)
  exclude=$(git rev-parse --git-path info/exclude)
}

slim() {
  git_paths
  [ ! -e "$marker" ] || { echo "slim: slimmed already (benches/gpu_lease.sh unslim undoes it)"; return 0; }
  git diff --cached --quiet || { echo "slim: the index has staged changes: commit or unstage them first" >&2; exit 1; }
  [ ! -e "$hook" ] || { echo "slim: $hook exists; this command installs its own there" >&2; exit 1; }
  git ls-files -- "$kept" | wc -l >"$marker"
  mkdir -p "$(dirname "$hook")" "$(dirname "$exclude")"
  printf '#!/bin/sh\n# benches/gpu_lease.sh slim\necho "the kept runs are out of the index: benches/gpu_lease.sh unslim first" >&2\nexit 1\n' >"$hook"
  chmod +x "$hook"
  git rm -r -q --cached -- "$kept"
  printf '# benches/gpu_lease.sh slim (unslim removes these two lines)\n/docs/src/ablation/*/kept/\n' >>"$exclude"
  echo "slim: $(cat "$marker") kept files out of the index until \`benches/gpu_lease.sh unslim\`"
  travels
}

unslim() {
  git_paths
  [ -e "$marker" ] || { echo "unslim: not slimmed"; return 0; }
  git reset -q HEAD -- "$kept"
  sed -i '\|^# benches/gpu_lease.sh slim |,+1d' "$exclude"
  local n
  n=$(git ls-files -- "$kept" | wc -l)
  [ "$n" = "$(cat "$marker")" ] || { echo "unslim: $n kept files in the index, $(cat "$marker") before" >&2; exit 1; }
  rm -f "$marker" "$hook"
  echo "unslim: $n kept files back in the index"
}

# What a call carries: the working tree (tracked files and untracked ones not ignored) and lease/.
travels() {
  git_paths
  local lease_b=0 tree_b
  [ ! -d "$lease" ] || lease_b=$(du -sb "$lease" | cut -f1)
  tree_b=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- | tail -n 1 | cut -f1)
  echo "travels: the working tree $((tree_b >> 20)) MiB + lease/ $((lease_b >> 20)) MiB (a call carries at most 64)"
  [ $((lease_b + tree_b)) -le $((62 << 20)) ] || {
    echo "travels: less than 2 MiB of a call's 64 would be left$([ -e "$marker" ] || echo "; \`benches/gpu_lease.sh slim\` first")" >&2
    return 1
  }
}

case ${1:-} in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  slim) slim ;;
  unslim) unslim ;;
  *) sed -n '2,31p' "$0"; exit 2 ;;
esac
