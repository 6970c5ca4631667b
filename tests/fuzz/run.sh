#!/bin/sh
# Runs every libFuzzer target of a -Dfuzz=true build for a bounded time:
#   tests/fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET] [NAME=SECONDS ...]
# (default 25 s per target; NAME=SECONDS gives one target its own time).
# Each target starts from its seeds (README.md) and a working corpus kept in
# BUILD_DIR/fuzz-corpus/NAME, so later runs go on where earlier ones ended.
# A crash leaves its input in BUILD_DIR/fuzz-crashes/ and fails the run;
# after the fix, copy the input to tests/fuzz/crashes/NAME/, where every
# build replays it (meson test --suite fuzz).
set -u
build=$1
secs=${2:-25}
shift
[ $# -gt 0 ] && shift
own=" $* "
src=$(cd "$(dirname "$0")/../.." && pwd)
# Every finding stops the target and counts: UBSan's reports included, which
# otherwise print and let the run go on (and end with status 0).
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
fail=0
mkdir -p "$build/fuzz-crashes"
for name in scenario tf_config tcp_frames; do
    exe=$build/tests/fuzz/fuzz_$name
    if [ ! -x "$exe" ]; then
        echo "fuzz: $exe is not built (meson setup with -Dfuzz=true, see tests/fuzz/README.md)"
        exit 2
    fi
    t=$secs
    case $own in
    *" $name="*) t=${own##* $name=}; t=${t%% *} ;;
    esac
    case $name in
    scenario) seeds="$src/scenarios $src/scenarios/faults" ;;
    *) seeds=$src/tests/fuzz/seeds/$name ;;
    esac
    corpus=$build/fuzz-corpus/$name
    mkdir -p "$corpus"
    log=$build/fuzz-crashes/$name.log
    # shellcheck disable=SC2086
    "$exe" -max_total_time="$t" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
        -artifact_prefix="$build/fuzz-crashes/$name-" "$corpus" $seeds \
        "$src/tests/fuzz/crashes/$name" >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    cov=$(sed -n 's/^#[0-9]*[[:space:]]*DONE[[:space:]]*cov: \([0-9]*\) ft: \([0-9]*\).*/cov \1, features \2/p' "$log")
    if [ "$rc" -eq 0 ]; then
        echo "fuzz $name: ${t}s, ${runs:-?} runs, ${rate:-?} exec/s, ${cov:-no coverage line}, corpus $(ls "$corpus" | wc -l) inputs"
    else
        fail=1
        echo "fuzz $name: FAILED (exit $rc); the input and log are in $build/fuzz-crashes/"
        grep -E "ERROR|SUMMARY|failed:|Test unit written" "$log" | head -8
    fi
done
exit $fail
