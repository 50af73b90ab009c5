#!/usr/bin/env bash
# Runs every fuzz target for a bounded time: CAIRN_FUZZ_SECONDS each (default 20), or the
# targets named as arguments. Used by .ci/run; also the way to fuzz longer by hand:
#   CAIRN_FUZZ_SECONDS=600 fuzz/run.sh tree_structured
#
# Built with the stable toolchain and no cargo-fuzz: the flags below are the coverage
# instrumentation cargo-fuzz passes (all stable codegen options), plus debug assertions
# and overflow checks, which are what find arithmetic bugs in safe Rust. cargo-fuzz's
# only nightly-only part, -Zsanitizer=address, is left out: cairn is safe Rust, and a
# memory error in a C dependency (zstd) would still crash the target. Findings land in
# fuzz/artifacts/TARGET/; replay one with `fuzz/target/HOST/release/TARGET FILE`.
set -euo pipefail
cd "$(dirname "$0")"

seconds=${CAIRN_FUZZ_SECONDS:-20}
# libfuzzer-sys compiles libFuzzer from its C++ source.
if ! command -v c++ >/dev/null; then
  (apt-get update && apt-get install -y g++) >/dev/null
fi
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# An explicit --target keeps RUSTFLAGS off build scripts and proc macros, which are not
# linked with libFuzzer (as cargo-fuzz does).
host=$(rustc -vV | sed -n 's/^host: //p')
cargo build --release --locked --bins --target "$host"
bin="target/$host/release"

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(sed -n 's/^name = "\(.*\)"/\1/p' Cargo.toml | grep -v '^cairn-fuzz$')
fi
failed=()
for t in "${targets[@]}"; do
  corpus="corpus/$t"
  mkdir -p "$corpus" "artifacts/$t"
  seeds=()
  [ -d "seeds/$t" ] && seeds=("seeds/$t")
  echo "== fuzz $t (${seconds}s)"
  if ! "$bin/$t" "$corpus" "${seeds[@]}" -max_total_time="$seconds" \
    -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 -artifact_prefix="artifacts/$t/" \
    2>"artifacts/$t.log"; then
    tail -n 30 "artifacts/$t.log"
    failed+=("$t")
  else
    grep -E '^stat::number_of_executed_units|^Done' "artifacts/$t.log" | tr '\n' ' '
    echo
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz targets failed: ${failed[*]} (inputs in fuzz/artifacts/)"
  exit 1
fi
echo "fuzz: ${#targets[@]} passed, 0 failed"
