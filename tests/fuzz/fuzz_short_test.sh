#!/usr/bin/env bash
# CI's short fuzzing run: builds the libFuzzer targets with clang
# (scripts/build-fuzz.sh, into build-fuzz/) and runs each for a fixed time
# from its checked-in corpus. Fails on any crash, leak, sanitizer report,
# timeout or memory limit, and when clang or libFuzzer is missing.
#   tests/fuzz/fuzz_short_test.sh [SOURCE_DIR]
#   GPIPE_FUZZ_SECONDS=N   seconds per target (default 20)
set -euo pipefail
src=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
seconds=${GPIPE_FUZZ_SECONDS:-20}
cd "$src"

start=$SECONDS
scripts/build-fuzz.sh
echo "fuzz_short_test: build took $((SECONDS - start)) s"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for target in frame job_spec checkpoint data_file; do
  bin=build-fuzz/fuzz/${target}_fuzzer
  # New inputs go to a scratch directory; the checked-in corpus only seeds.
  mkdir -p "$work/$target"
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=3072
        -malloc_limit_mb=2560 -print_final_stats=1
        -artifact_prefix="$work/$target-")
  if [[ -f tests/fuzz/$target.dict ]]; then
    args+=(-dict="tests/fuzz/$target.dict")
  fi
  echo "fuzz_short_test: $target for ${seconds} s"
  if ! "$bin" "${args[@]}" "$work/$target" "tests/fuzz/corpus/$target" \
      >"$work/$target.log" 2>&1; then
    echo "fuzz_short_test: $target FAILED; its log ends:" >&2
    tail -60 "$work/$target.log" >&2
    for crash in "$work/$target-"*; do
      [[ -e $crash ]] || continue
      echo "fuzz_short_test: input $crash (base64):" >&2
      base64 -w0 "$crash" | head -c 4000 >&2
      echo >&2
    done
    status=1
    continue
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$work/$target.log" |
    sed "s/^/fuzz_short_test: $target /"
done
echo "fuzz_short_test: total $((SECONDS - start)) s"
exit $status
