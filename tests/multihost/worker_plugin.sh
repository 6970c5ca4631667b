#!/bin/sh
# dsim worker --plugin-dir: the hierarchical example plugin
# (examples/hierarchical_strategy: reduce in a host, all-reduce among the
# hosts' leaders, broadcast back, on dsim_comm_split) under a file name only
# a folder of this test holds, named bare by a scenario in another folder.
# Two dsim worker tasks over loopback:
#   - without --plugin-dir the task refuses at once, naming the folders it
#     looked in and --plugin-dir;
#   - with it both tasks load the plugin, its sub-communicators span the two
#     processes, the run passes, and the store names the exchange it made
#     (the collectives on its sub-communicators, not an algorithm).
#   worker_plugin.sh DSIM SCENARIO PLUGIN
set -u
if [ -n "${DSIM_SANITIZED_BUILD:-}" ]; then
    echo "SKIP: built with sanitizers, whose allocator is not fork-safe in a threaded process"
    exit 77
fi
dsim=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
scenario=$2
plugin=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsim-mhp.XXXXXX") || exit 99
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
mkdir plugins scen || exit 99
cp "$plugin" plugins/libworker_plugin_hier.so || exit 99
# 2 hosts x 4, no checkpoint (the tasks share no folder in real life)
sed -e 's/plugin: libhierarchical_strategy.so/plugin: libworker_plugin_hier.so/' \
    -e 's/hosts: 3/hosts: 2/' -e '/^checkpoint:/,/every: /d' -e '/checkpoint_roundtrip/d' \
    "$scenario" > scen/hier.yaml || exit 99
grep -q "plugin: libworker_plugin_hier.so" scen/hier.yaml || fail "the scenario was not rewritten"
printf 'the same secret on every task\n' > secret
chmod 600 secret
# Ports below the ephemeral range, a range of this script's own; a task's
# ranks take devices_per_host + 1 ports.
base=$((16000 + ($$ % 500) * 12))
cluster="\"cluster\":{\"worker\":[\"127.0.0.1:$base\",\"127.0.0.1:$((base + 5))\"]}"
tf() { echo "{$cluster,\"task\":{\"type\":\"worker\",\"index\":$1}}"; }

# without the folder: refused before anything listens
TF_CONFIG=$(tf 0) timeout 30 "$dsim" worker scen/hier.yaml --secret-file secret \
    > none.out.txt 2> none.txt
rc=$?
[ $rc -eq 2 ] || fail "without --plugin-dir the task exited $rc, not 2"
grep -q "'libworker_plugin_hier.so' not found" none.txt || fail "the missing plugin is not named"
grep -q -- "--plugin-dir" none.txt || fail "the message does not say --plugin-dir"

TF_CONFIG=$(tf 0) timeout 60 "$dsim" worker scen/hier.yaml --secret-file secret \
    --plugin-dir plugins --db "$tmp/mh.db" > chief.out.txt 2> chief.txt &
chief=$!
pids="$pids $chief"
TF_CONFIG=$(tf 1) timeout 60 "$dsim" worker scen/hier.yaml --secret-file secret \
    --plugin-dir="$tmp/plugins" > w1.out.txt 2> w1.txt &
w1=$!
pids="$pids $w1"
wait "$chief"; rc=$?
[ $rc -eq 0 ] || fail "the chief exited $rc"
wait "$w1"; rc=$?
[ $rc -eq 0 ] || fail "task 1 exited $rc"
grep -q "hierarchical_strategy: passed (3 of 3" chief.out.txt || fail "the run did not pass"
grep -q "hierarchical_leaders, 2 hosts x 4 devices, 2 dsim worker task" chief.out.txt ||
    fail "the chief does not say it ran the plugin's strategy over 2 tasks"
if command -v sqlite3 >/dev/null; then
    x=$(sqlite3 mh.db "select unit from metrics where name = 'exchange'") || fail "cannot read the store"
    echo "stored exchange: $x"
    case $x in
    "reduce on sub-communicator "*" (4 ranks) + allreduce(ring) on sub-communicator "*" (2 ranks) + broadcast on sub-communicator "*" (4 ranks)") ;;
    *) fail "the stored exchange is '$x'" ;;
    esac
fi
echo "ok: dsim worker --plugin-dir loads the plugin on both tasks; its sub-communicators span them"
exit 0
