#!/bin/sh
# dsim worker under a real Slurm: this test starts munged, slurmctld and
# slurmd on this machine as a one-node cluster (the node is `hostname -s`,
# 8 CPUs declared so that four single-CPU tasks fit on a 2-core machine),
# everything in a temporary folder with its own slurm.conf (SLURM_CONF), and
# then, through srun:
#   - SLURM_PROCID/NTASKS/NNODES against `scontrol show hostnames`: each
#     task's --print-tf-config, with --hosts @FILE and without, names the
#     node scontrol gives (or loopback: one node) in rank order; a wrong
#     task count is refused naming srun -n; a job that spans nodes without
#     --hosts is refused;
#   - srun -n 2 dsim worker quickstart.yaml --hosts @FILE, and srun -n 4 of
#     parameter_server_sync.yaml (2 workers, 2 parameter servers): one
#     passed run in the store, bit-identical to dsim run of the same file;
#   - srun -n 4 dsim worker partition.yaml (4 hosts x 1 device, a long job
#     made to be cut): once the group formed, task 3 is frozen, the dsim
#     worker and the replica process it forked (SIGSTOP: its peers hear
#     nothing from it, as when its link is cut; the link itself needs
#     network namespaces, netns.sh). The chief must store a failed run
#     naming rank 3 within a bound, tasks 1 and 2 end on their own, and
#     task 3, thawed, ends too.
# Everything it starts is stopped and removed on exit. Skips (77) saying why
# where it is not root, the packages are absent (apt-get install slurm-wlm
# munge) or a daemon cannot start.
#   slurm.sh DSIM QUICKSTART PARTITION PARAMETER_SERVER_SYNC
set -u
abs() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
dsim=$(abs "$1")
quickstart=$(abs "$2")
partition=$(abs "$3")
ps_sync=$(abs "$4")
skip() {
    echo "SKIP: $*"
    exit 77
}
[ "$(id -u)" = 0 ] || skip "starting munged, slurmctld and slurmd needs root"
for c in munged slurmctld slurmd srun scontrol sinfo squeue scancel; do
    command -v "$c" >/dev/null 2>&1 ||
        skip "$c is not installed (apt-get install slurm-wlm munge)"
done
if command -v mungekey >/dev/null 2>&1; then
    mkkey="mungekey --create --force --keyfile"
elif command -v create-munge-key >/dev/null 2>&1; then
    mkkey="create-munge-key -f -k"
else
    skip "neither mungekey nor create-munge-key is installed (apt-get install munge)"
fi
node=$(hostname -s)
getent hosts "$node" >/dev/null 2>&1 ||
    skip "this host's name '$node' does not resolve (Slurm and --hosts need it)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsim-slurm.XXXXXX") || exit 99
chmod 755 "$tmp"
munged_pid="" ctld_pid="" slurmd_pid="" jobs=""
export SLURM_CONF="$tmp/slurm.conf"
cleanup() {
    for q in $jobs; do kill -CONT "$q" 2>/dev/null; kill -9 "$q" 2>/dev/null; done
    if [ -n "$ctld_pid" ]; then
        ids=$(squeue -h -o %i 2>/dev/null)
        [ -n "$ids" ] && scancel $ids 2>/dev/null
        i=0
        while [ -n "$(squeue -h -o %i 2>/dev/null)" ] && [ $i -lt 50 ]; do
            sleep 0.2; i=$((i + 1))
        done
    fi
    for q in $slurmd_pid $ctld_pid $munged_pid; do kill "$q" 2>/dev/null; done
    for q in $slurmd_pid $ctld_pid $munged_pid; do
        i=0
        while kill -0 "$q" 2>/dev/null && [ $i -lt 25 ]; do sleep 0.2; i=$((i + 1)); done
        kill -9 "$q" 2>/dev/null
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fail() {
    echo "FAIL: $*"
    exit 1
}
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# munge: a fresh key, the daemon's socket in the temporary folder. --force:
# munged otherwise refuses folders that a TMPDIR may have (a group- or
# world-writable parent without the sticky bit).
mkdir -p "$tmp/munge" "$tmp/state" "$tmp/spool" "$tmp/log" || exit 99
chmod 700 "$tmp/munge"
$mkkey "$tmp/munge/munge.key" >"$tmp/log/mungekey.txt" 2>&1 ||
    skip "cannot create a munge key: $(cat "$tmp/log/mungekey.txt")"
chmod 755 "$tmp/munge"
munged -F --force --key-file="$tmp/munge/munge.key" --socket="$tmp/munge/munge.sock" \
    --pid-file="$tmp/munge/munged.pid" --log-file="$tmp/log/munged.log" \
    --seed-file="$tmp/munge/munged.seed" >"$tmp/log/munged.out" 2>&1 &
munged_pid=$!
i=0
while [ ! -S "$tmp/munge/munge.sock" ] && [ $i -lt 50 ]; do
    kill -0 "$munged_pid" 2>/dev/null || break
    sleep 0.1; i=$((i + 1))
done
[ -S "$tmp/munge/munge.sock" ] || skip "munged did not start: $(tail -3 "$tmp/log/munged.out")"

# Slurm: one node, ports away from the defaults (another cluster may run).
base=$((21000 + ($$ % 200) * 20))
cat >"$SLURM_CONF" <<EOF
ClusterName=dsimtest
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$base
SlurmdPort=$((base + 1))
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
NodeName=$node CPUs=8 State=UNKNOWN
PartitionName=dsim Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
t_up=$(now_ms)
slurmctld -D -f "$SLURM_CONF" >"$tmp/log/slurmctld.out" 2>&1 &
ctld_pid=$!
i=0
while ! scontrol ping 2>/dev/null | grep -q "is UP" && [ $i -lt 100 ]; do
    kill -0 "$ctld_pid" 2>/dev/null || break
    sleep 0.2; i=$((i + 1))
done
scontrol ping 2>/dev/null | grep -q "is UP" ||
    skip "slurmctld did not start: $(tail -3 "$tmp/log/slurmctld.out")"
slurmd -D -f "$SLURM_CONF" >"$tmp/log/slurmd.out" 2>&1 &
slurmd_pid=$!
i=0
while [ "$(sinfo -h -n "$node" -o %T 2>/dev/null)" != idle ] && [ $i -lt 100 ]; do
    kill -0 "$slurmd_pid" 2>/dev/null || break
    sleep 0.2; i=$((i + 1))
done
[ "$(sinfo -h -n "$node" -o %T 2>/dev/null)" = idle ] ||
    skip "slurmd did not bring node $node to idle: $(tail -3 "$tmp/log/slurmd.out")"
echo "one-node Slurm cluster ($node, $(slurmctld -V)) up in $(($(now_ms) - t_up)) ms"
cd "$tmp" || exit 99
export DSIM_CLUSTER_SECRET="slurm job $$"
port=$((base + 2))

# 1. SLURM_* against scontrol show hostnames. The node list of the job is
# what scontrol expands; each task also writes the node it ran on.
timeout 60 srun -Q -n 2 sh -c 'echo "$SLURM_PROCID $SLURM_NTASKS $SLURM_NNODES $SLURM_JOB_NODELIST \
$SLURMD_NODENAME"' >env.txt 2>&1 || { cat env.txt; fail "srun -n 2 did not run"; }
nodelist=$(awk 'NR == 1 {print $4}' env.txt)
scontrol show hostnames "$nodelist" >hosts.txt || fail "scontrol show hostnames $nodelist"
[ "$(cat hosts.txt)" = "$node" ] || fail "scontrol gives '$(cat hosts.txt)', not $node"
sort env.txt | awk '{print $5}' >tasks.txt # one line a task, in rank order
[ "$(sort env.txt | awk '{printf "%s %s %s;", $1, $2, $3}')" = "0 2 1;1 2 1;" ] ||
    { cat env.txt; fail "srun's SLURM_PROCID/NTASKS/NNODES are not 0,1 of 2 on 1 node"; }
tf_check() { # FILE HOST: two tasks, worker 0 and 1, at HOST:port and :port+3
    want="{\"cluster\":{\"worker\":[\"$2:$port\",\"$2:$((port + 3))\"]},"
    want="$want\"task\":{\"type\":\"worker\",\"index\":"
    for k in 0 1; do
        grep -qxF "$want$k}}" "$1" || { cat "$1"; fail "no TF_CONFIG of worker $k at $2"; }
    done
    [ "$(wc -l <"$1")" = 2 ] || { cat "$1"; fail "not two TF_CONFIGs in $1"; }
}
for f in hosts.txt tasks.txt; do
    timeout 60 srun -Q -n 2 "$dsim" worker "$quickstart" --port "$port" --hosts "@$tmp/$f" \
        --print-tf-config >tf.txt 2>tf.err ||
        { cat tf.txt tf.err; fail "--print-tf-config --hosts @$f"; }
    tf_check tf.txt "$node"
done
timeout 60 srun -Q -n 2 "$dsim" worker "$quickstart" --port "$port" --print-tf-config \
    >tf.txt 2>tf.err ||
    { cat tf.txt tf.err; fail "--print-tf-config without --hosts"; }
tf_check tf.txt 127.0.0.1
timeout 60 srun -Q -n 3 "$dsim" worker "$quickstart" --port "$port" --print-tf-config \
    >bad.txt 2>&1 &&
    fail "three tasks for a 2-host scenario were accepted"
grep -q "srun (Slurm) has 3 worker task(s).*so start 2 task(s): srun -n 2 dsim worker" bad.txt ||
    { cat bad.txt; fail "a wrong task count is not refused with the srun line"; }
timeout 60 srun -Q -n 2 env SLURM_NNODES=2 "$dsim" worker "$quickstart" --port "$port" \
    --print-tf-config >bad.txt 2>&1 && fail "tasks on two nodes without --hosts were accepted"
grep -q "more than one node.*give --hosts" bad.txt ||
    { cat bad.txt; fail "tasks on two nodes without --hosts are not refused"; }
echo "ok: SLURM_PROCID/NTASKS/NNODES resolve to scontrol's hosts ($node) in rank order"

# 2. Whole jobs: the quickstart as srun -n 2 (a task is one TF worker of 2
# devices) and parameter_server_sync as srun -n 4 (2 workers, then 2
# parameter servers in rank order), each against dsim run of the same file:
# one passed run stored, and (with sqlite3) every step's loss and parameter
# checksum bit-identical.
rows="SELECT step, replica, checksum, printf('%.9g', loss) FROM steps ORDER BY step, replica"
job() { # NAME SCENARIO TASKS
    rm -f one.db many.db
    "$dsim" run "$2" --db one.db >one.txt 2>&1 || { cat one.txt; fail "$1: dsim run exited $?"; }
    t0=$(now_ms)
    timeout 90 srun -Q -n "$3" "$dsim" worker "$2" --port "$port" --hosts "@$tmp/hosts.txt" \
        --db many.db >"$1.txt" 2>&1
    rc=$?
    ms=$(($(now_ms) - t0))
    [ $rc -eq 0 ] || { cat "$1.txt"; fail "srun -n $3 dsim worker $1 exited $rc"; }
    grep -q "^$1: passed" "$1.txt" || { cat "$1.txt"; fail "$1: no passed run"; }
    [ "$(grep -c 'the job is over' "$1.txt")" = $(($3 - 1)) ] ||
        { cat "$1.txt"; fail "$1: not every other task saw the end"; }
    a=$(grep -o "final loss [0-9.e+-]*" one.txt)
    [ -n "$a" ] && [ "$a" = "$(grep -o "final loss [0-9.e+-]*" "$1.txt")" ] ||
        { cat "$1.txt"; fail "$1: not dsim run's $a"; }
    same="$a as dsim run"
    if command -v sqlite3 >/dev/null 2>&1; then
        [ "$(sqlite3 many.db 'select count(*) from runs where status = "passed"')" = 1 ] ||
            fail "$1: the store does not hold one passed run"
        ra=$(sqlite3 one.db "$rows") && rb=$(sqlite3 many.db "$rows") && [ -n "$ra" ] ||
            fail "$1: cannot read the stores"
        [ "$ra" = "$rb" ] || fail "$1: srun -n $3 did not end bit-identical to dsim run"
        same="$(echo "$ra" | wc -l) step rows bit-identical to dsim run, $a"
    fi
    echo "ok: srun -n $3 dsim worker $1: one stored run, passed, $same ($ms ms)"
    port=$((port + 20))
}
job quickstart "$quickstart" 2
job parameter_server_sync "$ps_sync" 4

# 3. The partition scenario, four tasks; task 3 frozen once the group formed.
# Every line the tasks print is kept with the milliseconds since srun started
# (p.txt), so that a failure below says when each thing happened.
t0=$(now_ms)
mkfifo p.fifo || exit 99
(while IFS= read -r line; do echo "$(($(now_ms) - t0)) ms: $line"; done <p.fifo >p.txt) &
stamp_pid=$!
timeout 120 srun -Q -n 4 sh -c 'echo $$ > "pid.$SLURM_PROCID"; exec "$0" "$@"' \
    "$dsim" worker "$partition" --port "$port" --db "$tmp/p.db" >p.fifo 2>&1 &
srun_pid=$!
# what the chief was doing, should it still run 20 s after the freeze
chief_stacks() {
    echo "the chief (pid $p0) 20 s after task 3 froze:"
    for t in /proc/"$p0"/task/*; do
        [ -r "$t/stat" ] && echo "  thread ${t##*/}: $(cut -d' ' -f3 "$t/stat") $(cat "$t/wchan" 2>/dev/null)"
    done
    command -v gdb >/dev/null 2>&1 &&
        timeout 20 gdb -p "$p0" -batch -ex "thread apply all bt 12" 2>/dev/null | grep '^#\|^Thread'
}
partition_fail() {
    for q in $p0 $p1 $p2 $p3; do kill -CONT "$q" 2>/dev/null; kill -9 "$q" 2>/dev/null; done
    wait "$srun_pid" 2>/dev/null
    wait "$stamp_pid" 2>/dev/null
    echo "what the tasks printed (ms since srun started; task 3 frozen at $((tcut - t0)) ms):"
    cat p.txt
    [ -s stacks.txt ] && cat stacks.txt
    fail "$@"
}
jobs="$srun_pid $stamp_pid"
i=0
while [ "$(grep -c 'group of 4 task(s) formed' p.txt)" != 4 ] && [ $i -lt 300 ]; do
    sleep 0.1; i=$((i + 1))
done
[ "$(grep -c 'group of 4 task(s) formed' p.txt)" = 4 ] ||
    { cat p.txt; fail "the group never formed"; }
sleep 1.5
for k in 0 1 2 3; do [ -s "pid.$k" ] || fail "task $k wrote no pid"; done
p0=$(cat pid.0) p1=$(cat pid.1) p2=$(cat pid.2) p3=$(cat pid.3)
# The task's dsim worker first (it forks no more), then the replica process
# it forked: frozen alone, the worker would leave its replica training until
# the records it cannot pass on fill their pipe, as long as the machine's
# speed makes that.
kill -STOP "$p3" || fail "cannot freeze task 3"
p3=$(echo "$p3" $(pgrep -P "$p3"))
for q in $p3; do kill -STOP "$q"; done
jobs="$srun_pid $stamp_pid $p0 $p1 $p2 $p3"
tcut=$(now_ms)
echo "task 3 frozen $((tcut - t0)) ms after srun started"
stacks=0
while kill -0 "$p0" 2>/dev/null && [ $(($(now_ms) - tcut)) -lt 40000 ]; do
    if [ $stacks = 0 ] && [ $(($(now_ms) - tcut)) -ge 20000 ]; then
        chief_stacks >stacks.txt 2>&1
        stacks=1
    fi
    sleep 0.1
done
tchief=$(($(now_ms) - tcut))
kill -0 "$p0" 2>/dev/null && partition_fail "the chief still runs 40 s after task 3 froze"
# detection (the health check's 0.6 s), the watchdog's bound (0.64 s) and
# 5 s grace, then the silent task given up after 3 s: 9-10 s here; 25 s is
# the bound
[ $tchief -lt 25000 ] || partition_fail "the chief took $tchief ms after task 3 froze to end"
i=0
while { kill -0 "$p1" 2>/dev/null || kill -0 "$p2" 2>/dev/null; } && [ $i -lt 100 ]; do
    sleep 0.1; i=$((i + 1))
done
kill -0 "$p1" 2>/dev/null && partition_fail "task 1 still runs 10 s after the chief ended"
kill -0 "$p2" 2>/dev/null && partition_fail "task 2 still runs 10 s after the chief ended"
for q in $p3; do kill -CONT "$q"; done
wait "$srun_pid"
rc=$?
wait "$stamp_pid"
tall=$(($(now_ms) - tcut))
jobs=""
[ $rc -ne 124 ] && [ $rc -ne 137 ] || { cat p.txt; fail "srun did not end: a task hung"; }
[ $rc -ne 0 ] || { cat p.txt; fail "srun exited 0 for a job that lost a task"; }
grep -q "partition: failed" p.txt || { cat p.txt; fail "the chief did not report a failed run"; }
grep -q "ranks 3\.\.3\|peer 3" p.txt ||
    { cat p.txt; fail "the report does not name rank 3"; }
if command -v sqlite3 >/dev/null 2>&1; then
    st=$(sqlite3 p.db "select status from runs")
    [ "$st" = failed ] || [ "$st" = error ] || fail "the stored run is '$st', not failed"
fi
echo "ok: srun -n 4 partition: task 3 frozen; the chief stored a failed run naming it" \
    "$tchief ms later; every task ended ($tall ms, srun exit $rc)"
exit 0
