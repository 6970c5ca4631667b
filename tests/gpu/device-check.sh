#!/bin/sh
# The device checks, in one bounded run on a machine with an NVIDIA GPU:
#
#   tests/gpu/device-check.sh            (from anywhere in the repository)
#
# configures and builds dsim with CUDA and NCCL (-Dcuda=enabled
# -Dnccl=enabled, kernels for this GPU's architecture), lists the devices
# dsim finds, runs `meson test --suite gpu` (the device layer on the cuda
# backend) and `--suite device` (the same on the host backend), and writes
# every log and figure under $OUT, ending with a summary (also in
# $OUT/summary.txt). Exit status: 0 when every step passed, 1 when one
# failed, 2 when the machine cannot run the checks (no GPU, no toolkit, a
# build prerequisite missing).
#
# Environment:
#   OUT                 where everything goes (default: a new temporary dir)
#   BUILD               the build directory (default: build-gpu in the repo)
#   DEVICE_CHECK_BUDGET seconds for the whole run (default 540, so that a
#                       10-minute limit leaves time to copy $OUT back)
#   GPU_ARCHS           -Dgpu_archs for the build (default: this GPU's compute
#                       capability, e.g. 90, which builds fastest; "auto" for
#                       the full list)
#
# Later checks plug in below (see "Checks still to come"): placement of
# replicas on GPUs, the model on the device, collectives on device buffers,
# the nccl algorithm with abort on a killed rank, and the benchmark. Each is
# a function writing under $OUT/<name>* and returning 0 (pass), 1 (fail) or
# 77 (skipped, with the reason on its first output line).
set -u

root=$(cd "$(dirname "$0")/../.." && pwd) || exit 2
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/dsim-device-check.XXXXXX")}
BUILD=${BUILD:-$root/build-gpu}
budget=${DEVICE_CHECK_BUDGET:-540}
mkdir -p "$OUT" || exit 2
start=$(date +%s)
summary="$OUT/summary.txt"
: >"$summary"
failed=0
unrunnable=0

say() { echo "$*" | tee -a "$summary"; }
left() { echo $((budget - ($(date +%s) - start))); }

# step NAME LIMIT_S CMD...: runs CMD with its output in $OUT/NAME.log, within
# LIMIT_S seconds and what is left of the budget; one summary line. A shell
# function runs as it is (timeout cannot run one): it bounds its own
# commands with $limit.
step() {
    name=$1 limit=$2
    shift 2
    remain=$(left)
    if [ "$remain" -le 5 ]; then
        say "$(printf '%-22s %-8s %6s  %s' "$name" SKIPPED - "no time left in the ${budget}s budget")"
        failed=1
        return 1
    fi
    [ "$limit" -gt "$remain" ] && limit=$remain
    t0=$(date +%s)
    case $(type "$1" 2>/dev/null) in
    *function*) "$@" >"$OUT/$name.log" 2>&1 ;;
    *) timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1 ;;
    esac
    rc=$?
    secs=$(($(date +%s) - t0))
    case $rc in
    0) verdict=PASS ;;
    77) verdict=SKIPPED ;;
    124 | 137) verdict=TIMEOUT failed=1 ;;
    *) verdict=FAIL failed=1 ;;
    esac
    note=$(tail -n 1 "$OUT/$name.log" | cut -c1-100)
    # meson test: its counts say more than its last line.
    if grep -q '^Ok: ' "$OUT/$name.log"; then
        note=$(awk '/^(Ok|Fail|Skipped|Timeout):/ { printf "%s%s %s", sep, tolower($1), $2; sep = ", " }' \
            "$OUT/$name.log")
    fi
    say "$(printf '%-22s %-8s %5ss  %s' "$name" "$verdict" "$secs" "$note")"
    return $rc
}

# ---- the machine ----

machine() {
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "host: $(uname -srm), $(nproc) CPUs"
    echo "commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=index,name,memory.total,compute_cap,driver_version,pci.bus_id \
        --format=csv 2>&1
    nvidia-smi topo -m 2>&1 || true
    command -v nvcc >/dev/null 2>&1 || PATH=$PATH:/usr/local/cuda/bin
    nvcc --version 2>&1 | tail -n 2
    grep -h NCCL_VERSION_CODE /usr/local/cuda/include/nccl.h /usr/include/nccl.h 2>/dev/null | head -n 1
}
machine >"$OUT/machine.txt" 2>&1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
say "dsim device checks: ${gpu:-no GPU}; output in $OUT"

prereq() {
    missing=""
    for p in meson ninja cc pkg-config timeout; do
        command -v "$p" >/dev/null 2>&1 || missing="$missing $p"
    done
    command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || missing="$missing nvcc"
    for m in jansson yaml-0.1 sqlite3 cmocka; do
        pkg-config --exists "$m" 2>/dev/null || missing="$missing $m(pkg-config)"
    done
    [ -z "$gpu" ] && missing="$missing an-NVIDIA-GPU(nvidia-smi)"
    if [ -n "$missing" ]; then
        echo "cannot run the device checks here; missing:$missing"
        return 2
    fi
    echo "prerequisites present"
}
if ! step prerequisites 30 prereq; then
    unrunnable=1
fi

# ---- build ----

arch=${GPU_ARCHS:-}
if [ -z "$arch" ]; then
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')
    [ -n "$arch" ] || arch=auto
fi
case ":$PATH:" in *:/usr/local/cuda/bin:*) ;; *) PATH=$PATH:/usr/local/cuda/bin ;; esac
export PATH

configure() {
    rm -rf "$BUILD"
    if timeout "$limit" meson setup "$BUILD" -Dcuda=enabled -Dnccl=enabled -Dgpu_archs="$arch"; then
        return 0
    fi
    echo "configure with -Dnccl=enabled failed; again with -Dnccl=auto (NCCL not found)"
    rm -rf "$BUILD"
    timeout "$limit" meson setup "$BUILD" -Dcuda=enabled -Dnccl=auto -Dgpu_archs="$arch"
}
built=0
if [ "$unrunnable" -eq 0 ] && step configure 120 configure &&
    step build 300 meson compile -C "$BUILD"; then
    built=1
    grep -A2 'CUDA kernels' "$OUT/configure.log" | sed 's/^ */  /' | tee -a "$summary"
fi

# ---- checks ----

if [ "$built" -eq 1 ]; then
    dsim="$BUILD/sim/cli/dsim"
    step list_devices 30 "$dsim" list devices
    "$dsim" list devices --json >"$OUT/devices.json" 2>&1
    step suite_gpu 240 meson test -C "$BUILD" --no-rebuild --print-errorlogs --suite gpu
    cp "$BUILD/meson-logs/testlog.json" "$OUT/suite_gpu.testlog.json" 2>/dev/null
    step suite_device 120 meson test -C "$BUILD" --no-rebuild --print-errorlogs --suite device
    cp "$BUILD/meson-logs/testlog.json" "$OUT/suite_device.testlog.json" 2>/dev/null
    # A gpu suite that skipped everything ran nothing on the GPU: say so.
    if grep -q '^Skipped: *[1-9]' "$OUT/suite_gpu.log" && grep -q '^Ok: *0' "$OUT/suite_gpu.log"; then
        say "suite_gpu ran nothing on a GPU (every test skipped: see $OUT/suite_gpu.log)"
        failed=1
    fi
fi

# ---- Checks still to come (later phases add a function and a step each) ----
#   placement    `dsim cluster` / `dsim plan` with cluster.devices: gpu|auto map
#                replicas onto the GPUs found (round-robin, CUDA_VISIBLE_DEVICES)
#   model        a GPU scenario of every built-in strategy passing its checks,
#                parameters in device memory, checksums compared
#   collectives  ring/rhd/tree/hierarchical on device buffers: the
#                verification matrix
#   nccl         the nccl algorithm: all-reduce verified, ncclCommInitRank
#                timed, ncclCommAbort on a killed rank with no survivor hung
#   bench        `dsim bench allreduce --device gpu`: busbw against the HBM
#                bound, nccl against dsim's algorithms; figures in $OUT/bench*
for later in placement model collectives nccl bench; do
    say "$(printf '%-22s %-8s %6s  %s' "$later" "-" "-" "not written yet")"
done

secs=$(($(date +%s) - start))
if [ "$unrunnable" -ne 0 ]; then
    say "device checks NOT RUN (${secs}s): the machine lacks what they need ($OUT/prerequisites.log)"
    exit 2
fi
if [ "$failed" -ne 0 ]; then
    say "device checks FAILED (${secs}s); logs in $OUT"
    exit 1
fi
say "device checks passed (${secs}s) on ${gpu}; logs in $OUT"
exit 0
