#!/usr/bin/env bash
# A newcomer's first hour, measured: a fresh clone of this repository's HEAD in a temporary
# directory and an empty target directory, then the README's two first commands —
#   1. `cargo run -- run pipelines/gridnav.toml` (the main job), its build timed apart from its
#      run (`cargo build --timings` first: the report says where the build's time goes);
#   2. `cargo test` (every test; they install what they need themselves).
# Prints, and writes to OUT/summary.md, wall and CPU seconds and peak memory of each step, with
# the commit and the machine; keeps OUT/cargo-timing.html, the run's summary lines and the test
# log.
#
# Usage: benches/first_run.sh [OUT_DIR]          (default: ./first-run-COMMIT)
#   FIRST_RUN_FRESH_CRATES=1  download every crate again into an empty CARGO_HOME (a new
#                             machine; needs the crates.io registry), else the crates already
#                             downloaded here are used and the download step costs nothing
#   FIRST_RUN_SKIP_TESTS=1    stop after the main job
#   FIRST_RUN_KEEP=DIR        keep the clone and its target directory in DIR (to go on from them)
# Python packages the tests install (numpy, textworld, moto, ...) stay installed between
# measurements: on a machine that has never had them, add their pip installs to the test time.
set -euo pipefail

repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
commit=$(git -C "$repo" rev-parse --short HEAD)
out=$(realpath -m "${1:-$PWD/first-run-$commit}")
mkdir -p "$out"
if [[ -n "${FIRST_RUN_KEEP:-}" ]]; then
  work=$(realpath -m "$FIRST_RUN_KEEP")
  [[ ! -e "$work" ]] || { echo "FIRST_RUN_KEEP=$work exists already" >&2; exit 2; }
  mkdir -p "$work"
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/rla-pipe-first-run.XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi

git clone -q --no-hardlinks "$repo" "$work/rla-pipe"
git -C "$work/rla-pipe" checkout -q "$commit"
export CARGO_TARGET_DIR="$work/target"
if [[ "${FIRST_RUN_FRESH_CRATES:-}" == 1 ]]; then
  # rustup's toolchains stay where they are (RUSTUP_HOME); only the crates come again.
  export RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}"
  export CARGO_HOME="$work/cargo-home"
fi
cd "$work/rla-pipe"

# step NAME COMMAND...: run it, appending wall, user, sys seconds and peak RSS to $out/times.
: >"$out/times"
step() {
  local name=$1
  shift
  echo "== $name: $*" >&2
  /usr/bin/time -f "$name %e %U %S %M" -a -o "$out/times" "$@"
}

step download cargo fetch --locked
step build cargo build --locked --timings
cp target/cargo-timings/cargo-timing.html "$out/" 2>/dev/null \
  || cp "$CARGO_TARGET_DIR"/cargo-timings/cargo-timing.html "$out/" 2>/dev/null || true
# The README's first command; built above, so this is its run (and a build check of a second).
step main_job sh -c 'cargo run --locked -q -- run pipelines/gridnav.toml >"$0" 2>&1' "$out/main_job.log"
if [[ "${FIRST_RUN_SKIP_TESTS:-}" != 1 ]]; then
  step tests sh -c 'cargo test --locked >"$0" 2>&1' "$out/tests.log"
fi

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
{
  echo "# First run of $commit"
  echo
  echo "$(date -u +%Y-%m-%d), $(nproc) cores ($cpu), $(rustc --version)," \
    "crates $([[ "${FIRST_RUN_FRESH_CRATES:-}" == 1 ]] && echo downloaded || echo 'already downloaded')," \
    "empty target directory: \`benches/first_run.sh\`"
  echo
  echo "| step | wall | CPU (user + sys) | peak RSS |"
  echo "|---|---:|---:|---:|"
  awk '{ printf "| %s | %d min %02d s | %.0f s | %.2f GiB |\n", $1, int($2 / 60), int($2) % 60, $3 + $4, $5 / 1048576 }' "$out/times"
  if [[ -f "$out/tests.log" ]]; then
    echo
    echo "Tests: $(grep -E '^test result:' "$out/tests.log" | awk '{p += $4; f += $6} END {print p " passed, " f " failed"}')"
  fi
} >"$out/summary.md"
cat "$out/summary.md"
