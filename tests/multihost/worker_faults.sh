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

# Each task in a working directory of its own, as on machines without shared
# storage: the checkpoint (a relative path) is not the same file for both,
# so the chief refuses to start, naming the task and the path, and the other
# task says what it could not read. Nothing runs, nothing is stored.
mkdir -p "$tmp/a" "$tmp/b"
base=$((base + 6))
cluster="\"cluster\":{\"worker\":[\"127.0.0.1:$base\",\"127.0.0.1:$((base + 3))\"]}"
(cd "$tmp/b" && TF_CONFIG="{$cluster,\"task\":{\"type\":\"worker\",\"index\":1}}" timeout 60 \
    "$dsim" worker "$scenario" > w1.out 2> w1.err) &
w1=$!
pids="$w1"
(cd "$tmp/a" && TF_CONFIG="{$cluster,\"task\":{\"type\":\"worker\",\"index\":0}}" timeout 60 \
    "$dsim" worker "$scenario" --db "$tmp/g.db" > w0.out 2> w0.err)
rc=$?
wait "$w1"
if [ $rc -ne 2 ] || ! grep -q "task 1 (127.0.0.1:$((base + 3))) does not see the chief's checkpoint folder" "$tmp/a/w0.err" ||
    ! grep -q "must be on storage every task reads at the same path" "$tmp/a/w0.err" ||
    ! grep -q "the chief's checkpoint folder is not here: cannot read" "$tmp/b/w1.err"; then
    cat "$tmp/a/w0.out" "$tmp/a/w0.err" "$tmp/b/w1.err"
    echo "FAIL: separate working directories: chief exit $rc (want 2, naming task 1 and the path)"
    exit 1
fi
[ -e "$tmp/g.db" ] && [ "$(sqlite3 "$tmp/g.db" 'select count(*) from runs' 2>/dev/null || echo 0)" != 0 ] &&
    { echo "FAIL: a run was stored although the check refused the job"; exit 1; }
ls "$tmp/a"/.dsim-shared-* >/dev/null 2>&1 && { echo "FAIL: the token was left behind"; exit 1; }
echo "ok: tasks that do not share the checkpoint's folder are refused before the job: $(grep -o 'task 1 (.*) does not see[^:]*' "$tmp/a/w0.err")"
