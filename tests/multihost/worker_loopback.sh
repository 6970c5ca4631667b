#!/bin/sh
# dsim worker on one machine, over loopback: the quickstart scenario (2 hosts
# x 2 devices) as two dsim worker processes (one per TF_CONFIG task, the
# other started first so that it waits for the chief), with a cluster secret. Meanwhile:
#   - a stray dsim worker with another secret tries to join as task 1: the
#     chief refuses it and logs why, and the stray fails with the reason;
#   - bytes that are not the protocol reach the chief's results port and a
#     rank's port: both refused and logged, nothing crashes.
# Then: every task exits 0, one run is stored, passed, with its checks.
#   worker_loopback.sh DSIM SCENARIO
set -u
# Ports below the ephemeral range (32768+), each script a range of its own.
dsim=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
scenario=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsim-mh.XXXXXX") || exit 99
pids=""
cleanup() {
    for p in $pids; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
fail() {
    echo "FAIL: $*"
    for f in "$tmp"/*.txt; do echo "---- $f"; cat "$f"; done
    exit 1
}
cd "$tmp" || exit 99
base=$((10000 + ($$ % 500) * 10))
printf 'the same secret on every task\n' > secret
printf 'a guess\n' > wrong
chmod 600 secret wrong
cluster="\"cluster\":{\"worker\":[\"127.0.0.1:$base\",\"127.0.0.1:$((base + 3))\"]}"
tf() { echo "{$cluster,\"task\":{\"type\":\"worker\",\"index\":$1}}"; }

# the stray first, so that it meets the chief before task 1 does
TF_CONFIG=$(tf 1) timeout 60 "$dsim" worker "$scenario" --secret-file wrong --timeout 20 \
    > stray.out.txt 2> stray.txt &
stray=$!
pids="$pids $stray"
TF_CONFIG=$(tf 0) timeout 60 "$dsim" worker "$scenario" --secret-file secret --db "$tmp/mh.db" \
    > chief.out.txt 2> chief.txt &
chief=$!
pids="$pids $chief"
# wait for the stray's refusal before the real task 1 starts
i=0
while ! grep -q "refused" stray.txt 2>/dev/null && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
# not the protocol, at the chief's results port (base + D) and at rank 0's port
if command -v python3 >/dev/null; then
    for port in $((base + 2)) $base; do
        python3 -c "
import socket, sys
s = socket.create_connection(('127.0.0.1', $port), timeout=5)
s.sendall(b'GET / HTTP/1.0\r\n\r\n' + b'\xff' * 200)
try:
    s.recv(100)
except Exception:
    pass
" 2>/dev/null
    done
fi
for t in 1; do
    TF_CONFIG=$(tf $t) timeout 60 "$dsim" worker "$scenario" --secret-file secret \
        > "w$t.out.txt" 2> "w$t.txt" &
    eval "w$t=\$!"
    pids="$pids $!"
done
wait "$chief"; rc=$?
[ $rc -eq 0 ] || fail "the chief exited $rc"
for t in 1; do
    eval "p=\$w$t"
    wait "$p"; r=$?
    [ $r -eq 0 ] || fail "task $t exited $r"
    grep -q "the job is over" "w$t.txt" || fail "task $t did not see the job end"
done
wait "$stray"; r=$?
[ $r -ne 0 ] || fail "the stray worker with another secret exited 0"
grep -q "proof of the cluster secret is wrong" chief.txt || fail "the chief did not log the stray's refusal"
grep -q "refused task 1" stray.txt || fail "the stray was not told it was refused"
if command -v python3 >/dev/null; then
    grep -q "not a dsim worker hello" chief.txt || fail "garbage at the results port was not logged"
    grep -q "not a dsim tcp handshake" chief.txt || fail "garbage at a rank's port was not logged"
fi
grep -q "quickstart: passed (3 of 3" chief.out.txt || fail "the chief's run did not pass"
if command -v sqlite3 >/dev/null; then
    n=$(sqlite3 mh.db "select count(*) from runs") || fail "cannot read the store"
    [ "$n" = 1 ] || fail "$n runs stored, not 1"
    st=$(sqlite3 mh.db "select status from runs")
    [ "$st" = passed ] || fail "the stored run is '$st', not passed"
    nc=$(sqlite3 mh.db "select count(*) from checks where passed = 1")
    [ "$nc" = 3 ] || fail "$nc checks passed in the store, not 3"
    nr=$(sqlite3 mh.db "select count(distinct replica) from steps")
    [ "$nr" = 4 ] || fail "steps of $nr replicas stored, not 4"
fi
echo "ok: 2 dsim worker tasks, one stored run, passed; stray peer and garbage refused"
exit 0
