#!/bin/sh
# One answer: a scenario run as `dsim worker` tasks, one per TF worker (and
# parameter server) of the scenario, on loopback, ends bit-identical to
# `dsim run` of the same scenario on one machine: every replica's loss and
# parameter checksum at every step, as the two stores hold them. Then the
# same job started as more tasks than the scenario has hosts is refused with
# the launch line that gives the scenario's job.
#   worker_same_answer.sh DSIM SCENARIO:HOSTS:PS ...
set -u
dsim=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
shift
command -v sqlite3 >/dev/null || { echo "SKIP: needs sqlite3"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsim-same.XXXXXX") || exit 99
pids=""
trap 'for p in $pids; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT INT TERM
cd "$tmp" || exit 99
fail() {
    echo "FAIL: $*"
    for f in "$tmp"/*.txt; do echo "---- $f"; cat "$f"; done
    exit 1
}
base=$((18000 + ($$ % 300) * 20))
rows="SELECT step, replica, checksum, printf('%.9g', loss) FROM steps ORDER BY step, replica"
for spec in "$@"; do
    scenario=${spec%%:*}
    rest=${spec#*:}
    hosts=${rest%%:*}
    ps=${rest#*:}
    name=$(basename "$scenario" .yaml)
    rm -f one.db many.db ./*.txt ./*.ckpt
    "$dsim" run "$scenario" --db one.db > one.txt 2>&1 || fail "$name: dsim run exited $?"
    w="" p=""
    for i in $(seq 0 $((hosts - 1))); do w="$w${w:+,}\"127.0.0.1:$((base + i * 10))\""; done
    for i in $(seq 0 $((ps - 1))); do p="$p${p:+,}\"127.0.0.1:$((base + (hosts + i) * 10))\""; done
    cluster="\"cluster\":{\"worker\":[$w]${p:+,\"ps\":[$p]}}"
    pids=""
    for i in $(seq $((ps - 1)) -1 0); do
        TF_CONFIG="{$cluster,\"task\":{\"type\":\"ps\",\"index\":$i}}" timeout 90 "$dsim" worker \
            "$scenario" > "ps$i.out.txt" 2> "ps$i.txt" &
        pids="$pids $!"
    done
    for i in $(seq $((hosts - 1)) -1 0); do
        TF_CONFIG="{$cluster,\"task\":{\"type\":\"worker\",\"index\":$i}}" timeout 90 "$dsim" worker \
            "$scenario" --db many.db > "w$i.out.txt" 2> "w$i.txt" &
        pids="$pids $!"
    done
    for q in $pids; do
        wait "$q" || fail "$name: a task exited $?"
    done
    pids=""
    a=$(sqlite3 one.db "$rows") || fail "$name: cannot read dsim run's store"
    b=$(sqlite3 many.db "$rows") || fail "$name: cannot read the workers' store"
    [ -n "$a" ] || fail "$name: dsim run stored no steps"
    if [ "$a" != "$b" ]; then
        printf '%s\n' "$a" > a.rows; printf '%s\n' "$b" > b.rows
        diff a.rows b.rows | head -20
        fail "$name: $((hosts + ps)) dsim worker tasks did not end bit-identical to dsim run"
    fi
    fa=$(sqlite3 one.db "SELECT printf('%.9g', value) FROM metrics WHERE name = 'final_loss'")
    echo "ok: $name as $hosts worker task(s)${ps:+ and $ps ps}: $(echo "$a" | wc -l) step rows bit-identical to dsim run (final loss $fa)"
    base=$((base + 200))
done
# more worker tasks than the scenario's hosts: refused, with the launch line
first=${1%%:*}
hosts=${1#*:}
hosts=${hosts%%:*}
n=$((hosts * 2))
out=$(env -u TF_CONFIG OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=$n OMPI_COMM_WORLD_LOCAL_SIZE=$n \
    timeout 30 "$dsim" worker "$first" 2>&1)
rc=$?
[ $rc -eq 2 ] || fail "$n tasks for $hosts hosts: exit $rc, not 2: $out"
echo "$out" | grep -q "so start $hosts task(s): mpirun -np $hosts dsim worker" ||
    fail "$n tasks for $hosts hosts: no launch line: $out"
echo "ok: $n tasks for a scenario of $hosts hosts refused with the launch line"
