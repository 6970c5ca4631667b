#!/bin/sh
# dsim worker under Open MPI's mpirun: mpirun -np 2 starts the four tasks of
# the quickstart scenario on this machine; each reads its rank and size from
# the launcher's environment and builds its addresses from --port. The job
# must pass and store one run. Skips (77) where mpirun is absent.
#   worker_mpirun.sh DSIM SCENARIO
set -u
dsim=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
scenario=$2
if ! command -v mpirun >/dev/null 2>&1; then
    echo "SKIP: mpirun is not installed (apt-get install openmpi-bin)"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsim-mpi.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM
cd "$tmp" || exit 99
base=$((15000 + ($$ % 500) * 10))
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export DSIM_CLUSTER_SECRET="mpirun job $$"
# Each rank prints the TF_CONFIG it resolves to: rank 0 is worker 0.
timeout 60 mpirun --oversubscribe -np 2 "$dsim" worker "$scenario" --port "$base" \
    --print-tf-config > tf.txt 2>&1 || { cat tf.txt; echo "FAIL: --print-tf-config"; exit 1; }
[ "$(grep -c '"task":{"type":"worker"' tf.txt)" = 2 ] || { cat tf.txt; echo "FAIL: not 2 worker tasks"; exit 1; }
grep -q "127.0.0.1:$((base + 3))" tf.txt || { cat tf.txt; echo "FAIL: task 1's port is not base + 1 x 3"; exit 1; }
timeout 90 mpirun --oversubscribe -np 2 "$dsim" worker "$scenario" --port "$base" \
    --db "$tmp/mpi.db" > out.txt 2>&1
rc=$?
if [ $rc -ne 0 ]; then
    cat out.txt
    echo "FAIL: mpirun exited $rc"
    exit 1
fi
grep -q "quickstart: passed (3 of 3" out.txt || { cat out.txt; echo "FAIL: no passed run"; exit 1; }
[ "$(grep -c 'the job is over' out.txt)" = 1 ] || { cat out.txt; echo "FAIL: task 1 did not see the end"; exit 1; }
if command -v sqlite3 >/dev/null; then
    [ "$(sqlite3 mpi.db 'select count(*) from runs where status = "passed"')" = 1 ] ||
        { echo "FAIL: the store does not hold one passed run"; exit 1; }
fi
echo "ok: mpirun -np 2 dsim worker: one stored run, passed"
