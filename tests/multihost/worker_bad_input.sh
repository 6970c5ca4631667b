#!/bin/sh
# dsim worker refuses what cannot work, quickly, with a message that names
# the place and the fix; nothing waits past its --timeout.
#   worker_bad_input.sh DSIM SCENARIO
set -u
dsim=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
scenario=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsim-mhb.XXXXXX") || exit 99
holder=
trap '[ -z "$holder" ] || kill $holder 2>/dev/null; rm -rf "$tmp"' EXIT INT TERM
cd "$tmp" || exit 99
base=$((25000 + ($$ % 500) * 10))
n=0
expect() { # expect STATUS TEXT -- command...
    want=$1 text=$2
    shift 3
    out=$(timeout 30 "$@" 2>&1)
    rc=$?
    n=$((n + 1))
    if [ $rc -ne "$want" ] || ! printf '%s' "$out" | grep -q -- "$text"; then
        echo "FAIL (case $n): exit $rc (want $want), output:"
        echo "$out"
        echo "(wanted: $text)"
        exit 1
    fi
}
unset TF_CONFIG OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE SLURM_PROCID SLURM_NTASKS
expect 2 "TF_CONFIG is not set and no launcher" -- "$dsim" worker "$scenario"
expect 2 "give the scenario file" -- "$dsim" worker
expect 2 "unknown option" -- "$dsim" worker "$scenario" --frobnicate
expect 2 "--port is 'x'" -- "$dsim" worker "$scenario" --port x
w3="{\"cluster\":{\"worker\":[\"127.0.0.1:$base\",\"127.0.0.1:$((base + 3))\",\"127.0.0.1:$((base + 6))\"]},\"task\":{\"type\":\"worker\",\"index\":0}}"
expect 2 "so start 2 task(s): mpirun -np 2" -- env TF_CONFIG="$w3" "$dsim" worker "$scenario"
expect 2 "cannot be split evenly" -- env TF_CONFIG="$w3" "$dsim" worker "$scenario" --reshape
# a reshape the strategy cannot run (mirrored is one host): refused before
# any task starts, with the shape and the way out
mirrored=$(cd "$(dirname "$scenario")/.." && pwd)/scenarios/faults/only_worker_dies.yaml
w4="{\"cluster\":{\"worker\":[\"127.0.0.1:$base\",\"127.0.0.1:$((base + 3))\",\"127.0.0.1:$((base + 6))\",\"127.0.0.1:$((base + 9))\"]},\"task\":{\"type\":\"worker\",\"index\":1}}"
expect 2 "run as 4 x 1 cannot run: strategy.name: mirrored runs on one host" -- env TF_CONFIG="$w4" "$dsim" worker "$mirrored" --reshape
expect 2 '"task.index" is 5' -- env TF_CONFIG="{\"cluster\":{\"worker\":[\"127.0.0.1:$base\"]},\"task\":{\"type\":\"worker\",\"index\":5}}" "$dsim" worker "$scenario"
expect 2 "cluster secret file" -- env TF_CONFIG="{\"cluster\":{\"worker\":[\"127.0.0.1:$base\",\"127.0.0.1:$((base + 3))\"]},\"task\":{\"type\":\"worker\",\"index\":1}}" "$dsim" worker "$scenario" --secret-file "$tmp/none"
expect 2 "mpirun (Open MPI) has 3 worker task(s)" -- env OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=3 OMPI_COMM_WORLD_LOCAL_SIZE=3 "$dsim" worker "$scenario"
expect 2 "more than one node" -- env OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_SIZE=1 "$dsim" worker "$scenario"
two="{\"cluster\":{\"worker\":[\"127.0.0.1:$base\",\"127.0.0.1:$((base + 3))\"]},\"task\":{\"type\":\"worker\",\"index\":"
three="{\"cluster\":{\"worker\":[\"127.0.0.1:$((base + 8))\",\"127.0.0.1:$((base + 11))\"]},\"task\":{\"type\":\"worker\",\"index\":"
# nobody else comes: the chief names the missing task within --timeout
expect 1 "never joined the chief" -- env TF_CONFIG="${two}0}}" "$dsim" worker "$scenario" --timeout 1
# no chief: the other task says where it looked
expect 1 "could not reach the chief at 127.0.0.1:$((base + 2))" -- env TF_CONFIG="${two}1}}" "$dsim" worker "$scenario" --timeout 1
# a port already taken is named before anything waits
python3 -c "
import socket, time, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', $((base + 8)))); s.listen(1); open('$tmp/held', 'w').close(); time.sleep(10)" &
holder=$!
# wait until the port is really held (python may take seconds to start on a loaded machine)
i=0
while [ ! -e "$tmp/held" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
[ -e "$tmp/held" ] || { echo "FAIL: the port holder did not start"; exit 1; }
expect 1 "cannot listen on 127.0.0.1:$((base + 8))" -- env TF_CONFIG="${three}0}}" "$dsim" worker "$scenario" --timeout 1
kill $holder 2>/dev/null
echo "ok: $n bad inputs refused with their reasons"
