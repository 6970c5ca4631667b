#!/bin/sh
# Formation that cannot be blocked: while the chief of a 2-task quickstart
# waits for its other task, 100 idle connections (they say nothing) and 100
# slow ones (a byte of a hello every half second) are held open to its
# results port. The real task still joins at once: the group forms within
# 5 s (it takes well under one alone), the held connections are closed and
# logged, and the run passes.
#   worker_formation.sh DSIM SCENARIO (the quickstart: 2 hosts x 2 devices)
set -u
dsim=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
scenario=$2
command -v python3 >/dev/null || { echo "SKIP: needs python3"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsim-form.XXXXXX") || exit 99
pids=""
trap 'for p in $pids; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT INT TERM
cd "$tmp" || exit 99
fail() {
    echo "FAIL: $*"
    for f in "$tmp"/*.txt; do echo "---- $f"; tail -n 30 "$f"; done
    exit 1
}
base=$((26000 + ($$ % 300) * 10))
cluster="\"cluster\":{\"worker\":[\"127.0.0.1:$base\",\"127.0.0.1:$((base + 3))\"]}"
tf() { echo "{$cluster,\"task\":{\"type\":\"worker\",\"index\":$1}}"; }
TF_CONFIG=$(tf 0) "$dsim" worker "$scenario" --db f.db --timeout 60 > w0.out.txt 2> w0.txt &
w0=$!
pids="$w0"
i=0
while ! grep -q "waiting for 1 of 2" w0.txt 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
# the chief's results port: its first port + its 2 devices
python3 - "$((base + 2))" > hold.txt 2>&1 <<'PY' &
import socket, sys, time
port = int(sys.argv[1])
idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
print("held", flush=True)
hello = b"DSWH" + b"\0" * 60
end = time.monotonic() + 30
k = 0
while time.monotonic() < end and k < len(hello):
    for s in slow:
        try:
            s.send(hello[k:k + 1])
        except OSError:
            pass
    k += 1
    time.sleep(0.5)
time.sleep(30)
PY
holder=$!
pids="$pids $holder"
i=0
while ! grep -q held hold.txt 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
grep -q held hold.txt || fail "the 200 connections could not be opened"
t0=$(date +%s%3N)
TF_CONFIG=$(tf 1) "$dsim" worker "$scenario" --timeout 60 > w1.out.txt 2> w1.txt &
w1=$!
pids="$pids $w1"
wait "$w0"; rc=$?
t1=$(date +%s%3N)
wait "$w1"; r1=$?
[ $rc -eq 0 ] || fail "the chief exited $rc"
[ $r1 -eq 0 ] || fail "task 1 exited $r1"
formed=$(sed -n 's/.*task 0: group of 2 task(s) formed in \([0-9.]*\) s.*/\1/p' w0.txt)
joined_ms=$(( t1 - t0 ))
[ -n "$formed" ] || fail "no formation line"
python3 -c "import sys; sys.exit(0 if $formed < 60 else 1)" || fail "formed in $formed s"
# the join itself: from task 1's start to the chief's run over, well within 5 s + the run
grep -q "task 1 joined from" w0.txt || fail "task 1 never joined"
python3 -c "import sys; sys.exit(0 if $joined_ms < 5000 else 1)" ||
    fail "task 1 took $joined_ms ms to join and run past 200 held connections"
grep -q "quickstart: passed" w0.out.txt || fail "the run did not pass"
n=$(sed -n 's/.*the chief closed \([0-9]*\) connection(s) that had not said a dsim worker hello when the group formed.*/\1/p' w0.txt)
r=$(grep -c "the chief refused a connection from" w0.txt)
[ "$(( ${n:-0} + r ))" -ge 200 ] || fail "${n:-0} held connections closed and $r refused: not all 200 logged"
echo "ok: 200 idle and slow connections held; task 1 joined and the job ran in $joined_ms ms (formed in $formed s); ${n:-0} closed at formation, $r refused, all logged"
