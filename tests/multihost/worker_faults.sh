#!/bin/sh
# The same faults: apply to dsim worker tasks: a catalogue fault scenario
# (a worker killed between collectives, BackupAndRestore recovery) run as
# one dsim worker per TF_CONFIG task on loopback must meet its expectations
# exactly as under `dsim run`: the kill fires in the task that hosts the
# rank, every survivor fails fast, the job restarts from the chief's
# checkpoint and ends bit-identical to a clean run.
#   worker_faults.sh DSIM SCENARIO   (a 2-host scenario)
set -u
dsim=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
scenario=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsim-mhf.XXXXXX") || exit 99
pids=""
trap 'for q in $pids; do kill -9 $q 2>/dev/null; done; rm -rf "$tmp"' EXIT INT TERM
cd "$tmp" || exit 99
base=$((20000 + ($$ % 500) * 10))
cluster="\"cluster\":{\"worker\":[\"127.0.0.1:$base\",\"127.0.0.1:$((base + 3))\"]}"
TF_CONFIG="{$cluster,\"task\":{\"type\":\"worker\",\"index\":1}}" timeout 60 "$dsim" worker \
    "$scenario" > w1.out 2> w1.err &
w1=$!
pids="$w1"
TF_CONFIG="{$cluster,\"task\":{\"type\":\"worker\",\"index\":0}}" timeout 60 "$dsim" worker \
    "$scenario" --db "$tmp/f.db" > w0.out 2> w0.err
rc=$?
wait "$w1"; r1=$?
if [ $rc -ne 0 ] || [ $r1 -ne 0 ] || ! grep -q "1 restart(s); the last attempt finished" w0.out ||
    ! grep -q "node_loss .* PASS" w0.out; then
    cat w0.out w0.err w1.err
    echo "FAIL: chief exit $rc, task 1 exit $r1"
    exit 1
fi
echo "ok: the kill fired in a dsim worker task, recovery restarted both tasks, checks passed"
