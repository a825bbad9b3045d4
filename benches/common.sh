# Sourced by the benchmark scripts (not run on its own).

# `sets_from ARGS...`: the array `extra` of `--set key=value` pairs, from arguments given as
# `--set key=value` or as `key=value`.
sets_from() {
  extra=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --set) extra+=(--set "$2"); shift 2 ;;
      *) extra+=(--set "$1"); shift ;;
    esac
  done
}

# `rla_bin`: `bin`, the rla-pipe binary: $RLA_PIPE_BIN, or the dev build (built first).
rla_bin() {
  if [ -n "${RLA_PIPE_BIN:-}" ]; then
    bin=$RLA_PIPE_BIN
  else
    cargo build --quiet
    bin="${CARGO_TARGET_DIR:-target}/debug/rla-pipe"
  fi
}

# `bf16_kernel`: the bf16 product kernel this CPU gives rla-pipe (as `rla_amx::kernel()` picks
# it): AMX, else AVX512-BF16, else emulated (in f32).
bf16_kernel() {
  if [ "${RLA_AMX_KERNEL:-}" = emulated ]; then
    echo emulated
  elif [ "${RLA_AMX_KERNEL:-}" != avx512 ] && grep -qw amx_bf16 /proc/cpuinfo; then
    echo AMX
  elif grep -qw avx512_bf16 /proc/cpuinfo; then
    echo AVX512-BF16
  else
    echo emulated
  fi
}

# `numerics_class`: the class of CPU whose f32 rounding rla-pipe's results follow, as the tests
# name it (`numerics()` in tests/it/main.rs): avx512, avx2 (with FMA), else the architecture.
# The committed fingerprints are per class: `fingerprint.csv` for avx512 (the class that
# measured the book's tables), `fingerprint-<class>.csv` for another.
numerics_class() {
  local flags
  flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  if [[ "$flags" == *" avx512f "* ]]; then
    echo avx512
  elif [[ "$flags" == *" avx2 "* && "$flags" == *" fma "* ]]; then
    echo avx2
  else
    case "$(uname -m)" in
      arm64) echo aarch64 ;;
      *) uname -m ;;
    esac
  fi
}
