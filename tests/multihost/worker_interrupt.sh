#!/bin/sh
# Interrupts on any dsim worker task end the job as dsim run's Ctrl-C does:
#   1. SIGINT to the chief mid-job: it exits 130, the run is stored as
#      unfinished (not crashed), the other task is told and gone in bounded
#      time;
#   2. SIGTERM to the other task mid-job: it tells the chief, which ends the
#      job the same way and exits 143; the task exits 143 too;
#   3. SIGINT to a task still forming the group: it exits 130 at once.
#   worker_interrupt.sh DSIM SCENARIO (2 hosts x 1 device, a long job)
set -u
dsim=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
scenario=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsim-int.XXXXXX") || exit 99
pids=""
trap 'for p in $pids; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT INT TERM
cd "$tmp" || exit 99
fail() {
    echo "FAIL: $*"
    for f in "$tmp"/*.txt; do echo "---- $f"; cat "$f"; done
    exit 1
}
base=$((21000 + ($$ % 300) * 10))
cluster="\"cluster\":{\"worker\":[\"127.0.0.1:$base\",\"127.0.0.1:$((base + 3))\"]}"
tf() { echo "{$cluster,\"task\":{\"type\":\"worker\",\"index\":$1}}"; }
# wait until the job has stored some steps (the run is in progress)
wait_running() {
    i=0
    while [ $i -lt 300 ]; do
        n=$(sqlite3 "$1" "select count(*) from steps" 2>/dev/null || echo 0)
        [ "${n:-0}" -gt 20 ] && return 0
        sleep 0.1
        i=$((i + 1))
    done
    fail "the job did not start within 30 s"
}
# wait for pid $1 at most $2 seconds; its exit status in $st (124 if it did not end)
wait_bounded() {
    i=0
    while kill -0 "$1" 2>/dev/null && [ $i -lt $(($2 * 10)) ]; do sleep 0.1; i=$((i + 1)); done
    if kill -0 "$1" 2>/dev/null; then st=124; kill -9 "$1"; wait "$1" 2>/dev/null; return; fi
    wait "$1"; st=$?
}
command -v sqlite3 >/dev/null || { echo "SKIP: needs sqlite3"; exit 77; }

for victim in chief other; do
    rm -f j.db ./*.txt
    TF_CONFIG=$(tf 1) "$dsim" worker "$scenario" > w1.out.txt 2> w1.txt &
    w1=$!
    TF_CONFIG=$(tf 0) "$dsim" worker "$scenario" --db j.db > w0.out.txt 2> w0.txt &
    w0=$!
    pids="$w0 $w1"
    wait_running j.db
    if [ $victim = chief ]; then
        kill -INT $w0
        want=130 sig=SIGINT
    else
        kill -TERM $w1
        want=143 sig=SIGTERM
    fi
    wait_bounded $w0 15
    [ $st -eq $want ] || fail "$victim interrupted ($sig): the chief exited $st, not $want"
    wait_bounded $w1 15
    if [ $victim = chief ]; then
        [ $st -eq 0 ] || fail "chief interrupted: the other task exited $st, not 0 (told, gone)"
    else
        [ $st -eq $want ] || fail "other interrupted: it exited $st, not $want"
        grep -q "interrupted (SIGTERM); telling the chief" w1.txt || fail "the task did not say it told the chief"
    fi
    grep -q "interrupted ($sig); every task told to stop; run 1 stored as unfinished" w0.txt ||
        fail "$victim interrupted: the chief did not say the run was stored as unfinished"
    status=$(sqlite3 j.db "select coalesce(status, 'NULL') from runs")
    ended=$(sqlite3 j.db "select count(*) from runs where status in ('crashed', 'failed', 'passed')")
    [ "$ended" = 0 ] || fail "$victim interrupted: the run is stored as '$status'"
    "$dsim" list runs --db j.db > list.txt 2>&1
    grep -q "unfinished" list.txt || fail "$victim interrupted: dsim list runs does not say unfinished"
    echo "ok: $sig to the $victim task mid-job: chief exit $want, the run unfinished, every task gone"
done

# 3. a task still forming the group
TF_CONFIG=$(tf 1) "$dsim" worker "$scenario" --timeout 30 > w1.out.txt 2> w1.txt &
w1=$!
pids="$w1"
i=0
while ! grep -q "waiting for the chief" w1.txt 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
kill -INT $w1
wait_bounded $w1 5
[ $st -eq 130 ] || fail "a forming task interrupted exited $st, not 130"
echo "ok: SIGINT to a task forming the group: exit 130 at once"
