#!/usr/bin/env bash
# The paper's ablation (pipelines/ablation/<env>.toml): three settings — policy only (outcome
# reward, static tasks), + reward model, + reward model + adaptation — over SEEDS seeds each (5),
# the same iteration budget, every run warm-started by `pretrain` (the two smaller settings are
# branches of the full loop from iteration 0: what their overrides do not reach is shared
# with it, not executed again); plus, per seed, the
# pretrained models alone (`pre-s<seed>`: a branch of the full loop's iteration 0 whose
# update takes no step, so its evaluation and RM accuracy are those of the warm start). Then
# the tables: per setting with bootstrap 95% intervals over the seeds and the settings paired
# per seed
# (pipelines/sql/ablation.sql → benches/ablation.py), the per-iteration curves, the reports (all
# runs; seed 0 of each setting, also as SVG figures), and the fingerprint of the first
# iteration (pipelines/sql/ablation_fingerprint.sql → REPORT_DIR/fingerprint.csv on an AVX-512
# CPU, fingerprint-<class>.csv on another class, with the commit in REPORT_DIR/measured.txt)
# that the test `ablation_tables_are_current` recomputes: a code change that moves the tables
# fails it. Runs resume: rerunning continues where it stopped.
#
# Also the learning curve (pipelines/sql/learning_curve.sql → benches/learning_curve.py): per
# setting and iteration held-out and OOD success with intervals over the seeds, after the warm
# start first, and the RL gain (last iteration minus the warm start, paired per seed).
#
# Also the learning curve's figure (REPORT_DIR/learning_curve.svg: held-out success per
# iteration and setting, with the intervals as a band).
#
# VARIANTS="name:k=v,k=v ...": more settings beside the three, each a branch of the full loop
# from iteration 0 with those overrides (run `abl-<name>-s<seed>`, on the first ABL_SEEDS seeds,
# as the two smaller settings): paired with the full loop on the same warm start and iteration
# 0, and in every table with the paired differences against the full loop and + reward model,
# named by its overrides ("nocand: reward.train_candidates=false") in the tables and the figure.
#   VARIANTS="nocand:reward.train_candidates=false" benches/ablation.sh ...
# VARIANT_SEEDS=N runs the variants on the first N seeds instead (e.g. a variant of a loop whose
# seeds run the full loop only: ABL_SEEDS=0 VARIANT_SEEDS=3).
# A variant added later to seeds already kept (KEEP below), on a machine whose store lacks their
# full loop (a kept run has no checkpoints to branch from), runs as a run of its own: the same
# rows a branch would commit (the branch shares only what it would compute alike), without
# running the kept full loop again.
#
# REEVAL=N: also evaluate each run again with N sampled episodes per held-out game
# (`eval.rollouts=N`): the warm start as `eN-pre-s<seed>` (a branch of `pre-s<seed>` at
# iteration 0) and each setting's last iteration as `eN-<setting>-s<seed>` (a branch from the
# last iteration: everything but the evaluation shared); kept with the seed's runs
# (pipelines/sql/reeval_gain.sql pairs them; benches/reeval_gain.py gives each setting's gain,
# and each variant's paired difference from the full loop, an interval). A run's re-evaluation
# needs its checkpoints, so a kept run whose `eN-` branch is not kept runs again first.
#
#   [SEEDS=5] [ABL_SEEDS=SEEDS] [VARIANT_SEEDS=ABL_SEEDS] [ONLY_SEEDS="1 3"] [SETS="k=v ..."] [VARIANTS="name:k=v,..."] [KEEP=DIR] [REEVAL=N] benches/ablation.sh [ITERATIONS] [STORE] [REPORT_DIR] [ENV]
#   benches/ablation.sh                      # household, 5 seeds, 8 iterations, ./runs-ablation/household, docs/src/ablation/household
#   benches/ablation.sh 8 ./runs-ablation/gridnav docs/src/ablation/gridnav gridnav
# ENV names pipelines/ablation/ENV.toml, or is a pipeline file itself (a path ending in .toml),
# e.g. a pretrained model's curve: the full loop over 5 seeds, the other two settings over the
# first 3, every run evaluated sampled and greedy:
#   ABL_SEEDS=3 SETS="eval.mode=both" benches/ablation.sh 10 ./runs-curve/household \
#     docs/src/ablation/household-smollm2 pipelines/household-smollm2.toml
set -euo pipefail
# The whole script is one compound command, read in full before any of it runs: bash reads a
# script as it goes, and a grid runs for hours, so an edit to this file meanwhile (a pull, a
# rebase) would change what the running grid does next.
{
cd "$(dirname "$0")/.."
iters=${1:-8}
env=${4:-household}
if [[ "$env" == *.toml ]]; then
  pipeline=$env
  env=$(basename "$env" .toml)
else
  pipeline=pipelines/ablation/$env.toml
fi
store=${2:-./runs-ablation/$env}
out=${3:-docs/src/ablation/$env}
extra=()
for kv in ${SETS:-}; do extra+=(--set "$kv"); done
variants=()
declare -A variant_sets=()
for v in ${VARIANTS:-}; do
  name=${v%%:*}
  if [[ ! "$name" =~ ^[a-z0-9]+$ || "$v" != *:?* || " policy rm rmadapt " == *" $name "* ]] \
    || [ -n "${variant_sets[$name]:-}" ]; then
    echo "error: VARIANTS: '$v' is not name:k=v[,k=v...] with a new name of lowercase letters and digits" >&2
    exit 2
  fi
  variants+=("$name")
  variant_sets[$name]=${v#*:}
done
seeds=${SEEDS:-5}
abl_seeds=${ABL_SEEDS:-$seeds}
variant_seeds=${VARIANT_SEEDS:-$abl_seeds}
for v in "$seeds" "$abl_seeds" "$variant_seeds"; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "error: SEEDS, ABL_SEEDS and VARIANT_SEEDS take a number of seeds, not '$v'" >&2; exit 2; }
done
reeval=${REEVAL:-}
[[ -z "$reeval" || "$reeval" =~ ^[1-9][0-9]*$ ]] || { echo "error: REEVAL takes a number of episodes per held-out game, not '$reeval'" >&2; exit 2; }
# RLA_PIPE_BIN: a prebuilt binary (e.g. a copy, so rebuilding the tree meanwhile cannot mix
# versions between runs).
. benches/common.sh
rla_bin
# KEEP=DIR: keep each seed's finished runs in DIR — their tables and manifests, not their
# checkpoints or assets (a few MB a seed; `rla-pipe sql`, `report` and `show` read it as a
# store) — skip the seeds DIR already holds, and compute the tables from DIR. DIR can be
# committed, so a grid longer than one machine's lifetime goes on elsewhere: a seed is the unit
# (its settings branch from its full loop and must finish on one machine).
# DIR/provenance.csv says which commit and CPU made each run (the checkout's commit, or
# RLA_PIPE_COMMIT: the commit an RLA_PIPE_BIN given with KEEP was built from, when that is not
# this checkout). Every kept run of a setting must
# be the same loop but for the seed (its resolved config, checked before a seed is kept).
keep=${KEEP:-}
# ONLY_SEEDS="1 3": run only these of the grid's seeds now (e.g. a full-loop-only seed that
# fits what is left of a machine's lifetime before a seed of three settings that does not);
# the tables still cover every seed KEEP holds.
only=" ${ONLY_SEEDS:-} "
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
commit=${RLA_PIPE_COMMIT:-$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src crates Cargo.lock || echo '+changes')}
# `finished DIR RUN ITERS`: RUN's last iteration committed in DIR.
finished() {
  [ -f "$1/$2/_commits/iter=$(printf '%06d' $(($3 - 1)))/_iteration.json" ]
}
# `kept RUN ITERS`: RUN finished in $keep, and its REEVAL branch too where one is asked for.
kept() {
  [ -n "$keep" ] && finished "$keep" "$1" "$2" \
    && { [ -z "$reeval" ] || finished "$keep" "e$reeval-${1#abl-}" "$2"; }
}
# `seed_kept`: every run of this seed ($seed, $settings) finished in $keep.
seed_kept() {
  kept "pre-s$seed" 1 || return 1
  for setting in "${settings[@]}"; do
    kept "abl-$setting-s$seed" "$iters" || return 1
  done
}
# `in_store RUN`: RUN exists in $store (finished or not); `branch RUN`: it is a branch.
in_store() { "$bin" show --store "$store" "$1" >/dev/null 2>&1; }
branch() { "$bin" show --store "$store" "$1" 2>/dev/null | grep -q "branch of"; }
# `same_loop RUN`: RUN's resolved config equals that of every run of its setting in $keep
# but for the seed (and the run's name): a grid is one loop over seeds. Commits may differ
# between seeds (provenance.csv), as CPUs do: the kernels round differently; the loop must not.
same_loop() {
  local setting=${1%-s*}
  for other in "$keep"/"$setting"-s*/run.json; do
    [ -f "$other" ] || continue
    python3 - "$store/$1/run.json" "$other" <<'PY' || return 1
import json, sys
def loop(path):
    c = json.load(open(path))["config"]
    c["run"] = {k: v for k, v in c["run"].items() if k not in ("seed", "name", "store", "iterations")}
    return c
a, b = loop(sys.argv[1]), loop(sys.argv[2])
diffs = [f"{s}.{k}: {b.get(s, {}).get(k)!r} kept, {a.get(s, {}).get(k)!r} now"
         for s in sorted(set(a) | set(b)) for k in sorted(set(a.get(s, {})) | set(b.get(s, {})))
         if a.get(s, {}).get(k) != b.get(s, {}).get(k)]
if diffs:
    print(f"error: {sys.argv[1]} is not the loop of the kept {sys.argv[2]} (other than the seed):", file=sys.stderr)
    print("\n".join("  " + d for d in diffs), file=sys.stderr)
    sys.exit(1)
PY
  done
}
# `keep_runs RUN...`: copy the runs' tables and manifests from the store into $keep.
keep_runs() {
  for r in "$@"; do
    same_loop "$r" || {
      echo "error: not kept: seed $seed's runs would mix two loops in $keep (move it away to start over)" >&2
      exit 1
    }
  done
  mkdir -p "$keep"
  [ -f "$keep/provenance.csv" ] || echo "run_id,commit,cpu,kept" >"$keep/provenance.csv"
  for r in "$@"; do
    # Kept already with the same commits (a seed's full loop, kept again when its other
    # settings finish): its files and its provenance row, the commit that made it, stay.
    if grep -q "^$r," "$keep/provenance.csv" && diff -rq "$store/$r/_commits" "$keep/$r/_commits" >/dev/null 2>&1; then
      continue
    fi
    rm -rf "$keep/$r.tmp"
    mkdir -p "$keep/$r.tmp"
    cp "$store/$r/run.json" "$keep/$r.tmp/"
    cp -r "$store/$r/_commits" "$store/$r/data" "$keep/$r.tmp/"
    rm -rf "$keep/$r"
    mv "$keep/$r.tmp" "$keep/$r"
    grep -v "^$r," "$keep/provenance.csv" >"$keep/provenance.tmp" || true
    echo "$r,$commit,\"$cpu\",$(date -u +%Y-%m-%dT%H:%MZ)" >>"$keep/provenance.tmp"
    mv "$keep/provenance.tmp" "$keep/provenance.csv"
  done
}
started=$(date +%s)
runs=()
for ((seed = 0; seed < seeds; seed++)); do
  settings=(rmadapt)   # the full loop first: every seed runs it
  if ((seed < abl_seeds)); then settings+=(rm policy); fi
  if ((seed < variant_seeds)); then settings+=("${variants[@]}"); fi
  if [ -n "$keep" ] && seed_kept; then
    for setting in "${settings[@]}"; do runs+=("abl-$setting-s$seed"); done
    echo "== seed $seed: kept in $keep ($(grep "^abl-rmadapt-s$seed," "$keep/provenance.csv" | cut -d, -f2-3))" >&2
    continue
  fi
  if [ -n "${ONLY_SEEDS:-}" ] && [[ "$only" != *" $seed "* ]]; then
    echo "== seed $seed: not run now (ONLY_SEEDS=\"$ONLY_SEEDS\")" >&2
    continue
  fi
  for setting in "${settings[@]}"; do
    case "$setting" in
      policy) sets=(--set reward_model.enabled=false --set adapt.enabled=false) ;;
      rm) sets=(--set adapt.enabled=false) ;;
      rmadapt) sets=() ;;
      *)
        sets=()
        IFS=, read -ra kvs <<<"${variant_sets[$setting]}"
        for kv in "${kvs[@]}"; do sets+=(--set "$kv"); done
        ;;
    esac
    run="abl-$setting-s$seed"
    runs+=("$run")
    full="abl-rmadapt-s$seed"
    if ! in_store "$run" && kept "$run" "$iters"; then
      echo "== $run: kept in $keep" >&2
      continue
    fi
    echo "== $run" >&2
    if [ "$setting" = rmadapt ] || { in_store "$run" && ! branch "$run"; } \
      || { ! in_store "$run" && ! in_store "$full"; }; then
      # The full loop; a run an earlier version of this script started; or a setting whose
      # full loop is kept but not in this store: run (or resumed) on its own.
      "$bin" run "$pipeline" --store "$store" --run-id "$run" --iterations "$iters" "${extra[@]}" \
        --set "run.seed=$seed" "${sets[@]}"
    else
      # The other settings branch from the full loop at iteration 0: the stages their
      # overrides do not reach (the warm start, the rollout, ...) are shared, not executed
      # again; the rows are those a run of their own would commit.
      "$bin" replay --store "$store" --run "$full" --from 0 --into "$run" --iterations "$iters" \
        "${sets[@]}"
    fi
  done
  # The warm start alone: a branch of the full loop at iteration 0 whose update takes no step
  # (the pool, rollout and RM scoring shared; the warm start reads the update's settings, so
  # it runs again, to the same bits; the evaluation is the warm-started models'). A `pre-s<seed>`
  # an earlier version of this script ran on its own is resumed; with the full loop only kept,
  # it runs on its own.
  if ! in_store "pre-s$seed" && kept "pre-s$seed" 1; then
    echo "== pre-s$seed: kept in $keep" >&2
  elif { in_store "pre-s$seed" && ! branch "pre-s$seed"; } \
    || { ! in_store "pre-s$seed" && ! in_store "abl-rmadapt-s$seed"; }; then
    echo "== pre-s$seed" >&2
    "$bin" run "$pipeline" --store "$store" --run-id "pre-s$seed" --iterations 1 "${extra[@]}" \
      --set "run.seed=$seed" --set update.policy_steps=0 --set update.rm_steps=0 --set adapt.enabled=false
  else
    echo "== pre-s$seed" >&2
    "$bin" replay --store "$store" --run "abl-rmadapt-s$seed" --from 0 --into "pre-s$seed" \
      --iterations 1 --set update.policy_steps=0 --set update.rm_steps=0 --set adapt.enabled=false
  fi
  # This seed's runs in this store (those only kept are not run again) and their re-evaluations.
  here=()
  seed_runs=("pre-s$seed")
  for setting in "${settings[@]}"; do seed_runs+=("abl-$setting-s$seed"); done
  for r in "${seed_runs[@]}"; do
    in_store "$r" || continue
    here+=("$r")
    [ -n "$reeval" ] || continue
    e="e$reeval-${r#abl-}"
    if [ "$r" = "pre-s$seed" ]; then last=0 n=1; else last=$((iters - 1)) n=$iters; fi
    if ! in_store "$e" && finished "$keep" "$e" "$n"; then continue; fi
    echo "== $e" >&2
    "$bin" replay --store "$store" --run "$r" --from "$last" --set "eval.rollouts=$reeval" \
      --into "$e" --iterations "$n"
    here+=("$e")
  done
  if [ -n "$keep" ]; then
    keep_runs "${here[@]}"
    echo "== seed $seed kept in $keep" >&2
  fi
done
# The tables come from the kept runs where there are any (every seed, whichever machine ran it).
csv=$store
if [ -n "$keep" ]; then store=$keep csv=$out; mkdir -p "$out"; fi
echo "== wall time of this invocation: $(( $(date +%s) - started )) s" >&2
echo "== the ablation ($env, $iters iterations)"
"$bin" sql --store "$store" --format csv --file pipelines/sql/ablation.sql >"$csv/ablation.csv"
python3 benches/ablation.py "$csv/ablation.csv" ${VARIANTS:+--variants "$VARIANTS"}
echo "== the warm start alone (pretrain, before any update)"
"$bin" sql --store "$store" --file pipelines/sql/pretrain_alone.sql
echo "== held-out success and RM process accuracy per iteration"
"$bin" sql --store "$store" --file pipelines/sql/ablation_curves.sql
echo "== the learning curve: after the warm start, then every iteration; the RL gain"
"$bin" sql --store "$store" --format csv --file pipelines/sql/learning_curve.sql >"$csv/learning_curve.csv"
mkdir -p "$out"
python3 benches/learning_curve.py "$csv/learning_curve.csv" --svg "$out/learning_curve.svg" \
  ${VARIANTS:+--variants "$VARIANTS"}
if [ -n "$reeval" ]; then
  echo "== the RL gain on the re-evaluations (REEVAL=$reeval), per setting and seed"
  reeval_sql=$(sed -e '/^--/d' -e "s/'e4-/'e$reeval-/g" pipelines/sql/reeval_gain.sql)
  "$bin" sql --store "$store" "$reeval_sql"
  "$bin" sql --store "$store" --format csv "$reeval_sql" >"$csv/reeval_gain.csv"
  python3 benches/reeval_gain.py "$csv/reeval_gain.csv"
fi
# The fingerprint of this class of CPU: fingerprint.csv on avx512, whose numbers the book's
# tables are, else fingerprint-<class>.csv (so a grid re-measured on another class cannot
# overwrite the avx512 one; the test compares each class with its own).
class=$(numerics_class)
fingerprint=fingerprint.csv
[ "$class" = avx512 ] || fingerprint=fingerprint-$class.csv
"$bin" sql --store "$store" --format csv --file pipelines/sql/ablation_fingerprint.sql >"$out/$fingerprint"
if [ -n "$keep" ]; then
  held=$(cd "$keep" && for r in abl-*-s*; do [ -d "$r" ] && echo "$r"; done | tr '\n' ' ')
  echo "measured with $iters iterations; the runs kept: ${held% }; each run's commit and CPU: $keep/provenance.csv" >"$out/measured.txt"
else
  echo "measured on commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' + uncommitted changes to src/') with $iters iterations and $seeds seeds" >"$out/measured.txt"
fi
# Every run in one report; the figures (SVG) from seed 0 of each setting it ran, readable
# overlaid.
"$bin" report --store "$store" "${runs[@]}" --out "$out/report-all.html"
first=()
for setting in policy rm rmadapt "${variants[@]}"; do
  [[ " ${runs[*]} " == *" abl-$setting-s0 "* ]] && first+=("abl-$setting-s0")
done
"$bin" report --store "$store" "${first[@]}" --out "$out/report.html" --svg-dir "$out"
exit
}
