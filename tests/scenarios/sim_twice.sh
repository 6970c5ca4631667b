#!/bin/sh
# Determinism under engine sim: runs one scenario twice with the same seed
# and once with another, in a directory of its own, and asserts
#   - both runs end as the scenario expects (dsim run exits 0),
#   - they print the same, non-zero trace hash (events and final parameters),
#   - `dsim replay` of the first run matches it,
#   - another seed gives another hash (the hash does see the run).
# A scenario refused before its job starts (bad configuration, as some
# expect) has an empty trace: hash 0 and 0 events, twice; it is replayed but
# not run with another seed.
#   sim_twice.sh DSIM SCENARIO [dsim run options...]
set -u
dsim=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
case $2 in /*) scenario=$2 ;; *) scenario=$(pwd)/$2 ;; esac
shift 2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsim-simtwice.XXXXXX") || exit 99
trap 'cd / && rm -rf "$tmp"' EXIT
cd "$tmp" || exit 99
hashes_of() { sed -n 's/^trace \([0-9a-f]\{16\}\) .*/\1/p' "$1"; }
hash_of() { hashes_of "$1" | tail -n 1; }
for k in 1 2; do
    "$dsim" run "$scenario" --engine sim --db "$tmp/dsim.db" "$@" >"out$k" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
        cat "out$k"
        echo "FAIL: run $k under sim exited $rc"
        exit 1
    fi
done
h1=$(hash_of out1)
h2=$(hash_of out2)
echo "trace hashes: $h1 $h2"
empty=false
grep -q '^trace 0000000000000000 (0 events)$' out1 && empty=true
if [ -z "$h1" ] || { [ "$h1" = 0000000000000000 ] && [ $empty = false ]; }; then
    cat out1
    echo "FAIL: no trace hash printed"
    exit 1
fi
# A file with a matrix: section is one run per combination: every one's
# hash must repeat, and run 1 (the first combination) is the one replayed.
if [ "$h1" != "$h2" ] || [ "$(hashes_of out1)" != "$(hashes_of out2)" ]; then
    echo "FAIL: the same scenario and seed gave two traces"
    exit 1
fi
"$dsim" replay 1 --db "$tmp/dsim.db" >replay 2>&1
rc=$?
cat replay | grep -v '^step'
r1=$(hashes_of out1 | head -n 1)
if [ $rc -ne 0 ] || ! grep -q "^  replay trace $r1" replay; then
    echo "FAIL: dsim replay 1 exited $rc or did not reproduce $r1"
    exit 1
fi
if [ $empty = true ]; then
    echo "the job never started (an empty trace, as the scenario expects)"
    exit 0
fi
"$dsim" run "$scenario" --engine sim --seed 987654321 --db "$tmp/dsim.db" "$@" >out3 2>&1
h3=$(hash_of out3)
if [ "$h3" = "$h1" ]; then
    echo "FAIL: another seed gave the same trace hash $h3"
    exit 1
fi
exit 0
