#!/bin/sh
# Emulated hosts: four network namespaces, one per machine, each joined to a
# switch namespace (a Linux bridge) by a veth pair, with its link shaped by
# tc tbf (10 Gbit/s) where the kernel has it. A dsim worker runs in each.
#   netns.sh DSIM SCENARIO quickstart   the quickstart passes, one stored run
#   netns.sh DSIM SCENARIO partition    host 3's link goes down mid-run: every
#                                       task ends in bounded time, the chief
#                                       stores a failed run naming the peer
#   netns.sh DSIM SCENARIO bench        prints figures (cold start)
#   netns.sh DSIM SCENARIO scenario     any scenario of 4 replicas passes
#   netns.sh DSIM SCENARIO allreduce    the exchange measured against the
#                                       cost model's prediction for 10 GbE
# Needs root and `ip netns`; skips (77) saying why where they are missing.
# Everything it creates is named dsim<pid>-* and removed on exit, even on
# failure or interruption. netem is not used: where the kernel lacks it (as
# here) delay and loss come from dsim's own fault transport instead.
set -u
dsim=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
scenario=$2
mode=${3:-quickstart}
if [ "$(id -u)" != 0 ]; then
    echo "SKIP: network namespaces need root"
    exit 77
fi
if ! command -v ip >/dev/null 2>&1; then
    echo "SKIP: the ip command (iproute2) is not installed"
    exit 77
fi
p=dsim$$
sw=$p-sw
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsim-netns.XXXXXX") || exit 99
pids=""
cleanup() {
    for q in $pids; do kill -9 "$q" 2>/dev/null; done
    for i in 0 1 2 3; do ip netns del "$p-h$i" 2>/dev/null; done
    ip netns del "$sw" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
if ! err=$(ip netns add "$sw" 2>&1); then
    echo "SKIP: cannot create a network namespace here: $err"
    exit 77
fi
if ! err=$(ip -n "$sw" link add br0 type bridge 2>&1); then
    echo "SKIP: cannot create a bridge in a namespace: $err"
    exit 77
fi
ip -n "$sw" link set br0 up
ip -n "$sw" link set lo up
shaped=0
for i in 0 1 2 3; do
    ns=$p-h$i
    ip netns add "$ns" || { echo "FAIL: ip netns add $ns"; exit 1; }
    ip link add "$p-a$i" type veth peer name "$p-b$i" || { echo "FAIL: veth"; exit 1; }
    ip link set "$p-a$i" netns "$ns"
    ip link set "$p-b$i" netns "$sw"
    ip -n "$ns" link set "$p-a$i" name eth0
    ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$sw" link set "$p-b$i" master br0
    ip -n "$sw" link set "$p-b$i" up
    if ip -n "$ns" link set eth0 qlen 1000 2>/dev/null &&
        ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate 10gbit burst 1mb latency 5ms 2>/dev/null; then
        shaped=$((shaped + 1))
    fi
done
if [ $shaped = 4 ]; then
    echo "links shaped with tc tbf: 10 Gbit/s each way out of every host"
else
    echo "note: tc tbf is not available here; the links run unshaped"
fi
if ip netns exec "$p-h0" tc qdisc add dev lo root netem delay 1ms 2>/dev/null; then
    echo "note: netem works here (not used: dsim's fault transport gives delay and loss)"
else
    echo "note: netem is absent from this kernel; delay and loss come from dsim's fault transport"
fi
cd "$tmp" || exit 99
base=2300
printf 'namespaces %s\n' "$p" > secret
cluster="\"cluster\":{\"worker\":[\"10.77.0.1:$base\",\"10.77.0.2:$base\",\"10.77.0.3:$base\",\"10.77.0.4:$base\"]}"
tf() { echo "{$cluster,\"task\":{\"type\":\"worker\",\"index\":$1}}"; }
fail() {
    echo "FAIL: $*"
    for f in "$tmp"/*.txt; do echo "---- $f"; cat "$f"; done
    exit 1
}
now_ms() { date +%s%3N; }

start_job() {
    t0=$(now_ms)
    for t in 3 2 1 0; do
        TF_CONFIG=$(tf $t) ip netns exec "$p-h$t" timeout 90 "$dsim" worker "$scenario" \
            --reshape --secret-file "$tmp/secret" --db "$tmp/ns.db" --timeout 30 > "w$t.out.txt" 2> "w$t.txt" &
        eval "w$t=\$!"
        pids="$pids $!"
    done
}

case $mode in
quickstart)
    start_job
    for t in 0 1 2 3; do
        eval "q=\$w$t"
        wait "$q"; r=$?
        [ $r -eq 0 ] || fail "task $t exited $r"
    done
    grep -q "passed (3 of 3" w0.out.txt || fail "the chief's run did not pass"
    if command -v sqlite3 >/dev/null; then
        [ "$(sqlite3 ns.db 'select count(*) from runs where status = "passed"')" = 1 ] ||
            fail "the store does not hold one passed run"
    fi
    grep -q "group of 4 task(s) formed" w0.txt || fail "no rendezvous line"
    echo "ok: quickstart as 4 dsim worker tasks in 4 namespaces, one stored run, passed ($(( $(now_ms) - t0 )) ms)"
    ;;
scenario)
    # Any catalogue scenario of four replicas (or a multiple): the chief's
    # run meets its expectations, one run is stored, and no task hangs.
    start_job
    wait "$w0"; r0=$?
    [ $r0 -eq 0 ] || fail "the chief exited $r0"
    for t in 1 2 3; do
        eval "q=\$w$t"
        wait "$q"; r=$?
        [ $r -ne 124 ] && [ $r -ne 137 ] || fail "task $t hung (exit $r)"
    done
    grep -q ": passed (" w0.out.txt || fail "the chief's run did not pass"
    if command -v sqlite3 >/dev/null; then
        [ "$(sqlite3 ns.db 'select count(*) from runs')" = 1 ] || fail "the store holds not one run"
    fi
    echo "ok: $(basename "$scenario") as 4 dsim worker tasks in 4 namespaces: $(grep ': passed (' w0.out.txt)"
    ;;
partition)
    start_job
    i=0
    while ! grep -q "group of 4 task(s) formed" w0.txt 2>/dev/null && [ $i -lt 300 ]; do
        sleep 0.1; i=$((i + 1))
    done
    sleep 1.5
    grep -q "group of 4 task(s) formed" w0.txt || fail "the group never formed"
    tcut=$(now_ms)
    ip -n "$sw" link set "$p-b3" down || fail "cannot take host 3's link down"
    echo "host 3's link cut $(( tcut - t0 )) ms after the start"
    wait "$w0"; r0=$?
    tend=$(now_ms)
    [ $r0 -eq 1 ] || fail "the chief exited $r0, not 1 (a failed run)"
    el=$(( tend - tcut ))
    # detection bound (2 s timeout + health check) + the watchdog's grace
    # (5 s) + 3 s for an unreachable task: 15 s is generous
    [ $el -lt 15000 ] || fail "the chief took $el ms after the cut to end"
    for t in 1 2 3; do
        eval "q=\$w$t"
        wait "$q"; r=$?
        [ $r -ne 124 ] && [ $r -ne 137 ] || fail "task $t hung (exit $r)"
    done
    if command -v sqlite3 >/dev/null; then
        st=$(sqlite3 ns.db "select status from runs")
        [ "$st" = failed ] || [ "$st" = error ] || fail "the stored run is '$st'"
    fi
    grep -q "ranks 3\.\.3\|peer 3" w0.out.txt || fail "the chief's report does not name host 3"
    echo "ok: the cut was detected; the chief ended $el ms after it with a failed run; no task hung"
    grep -i "error\|fail" w0.out.txt | head -3
    ;;
bench)
    # Cold start of a 4-task job: from launching the four dsim worker
    # processes (CLOCK_MONOTONIC, which the namespaces share) to the group
    # formed at the chief, the first step begun (connections up, initial
    # variables broadcast) and done on every replica. Three runs.
    command -v python3 >/dev/null && command -v sqlite3 >/dev/null ||
        { echo "SKIP: bench needs python3 and sqlite3"; exit 77; }
    for run in 1 2 3; do
        rm -f ns.db
        tl=$(python3 -c 'import time; print(time.monotonic_ns())')
        start_job
        for t in 0 1 2 3; do eval "q=\$w$t"; wait "$q" || fail "task $t failed"; done
        formed=$(sed -n 's/.*group of 4 task(s) formed in \([0-9.]*\) s.*/\1/p' w0.txt)
        sqlite3 ns.db "select printf('run $run: group formed %.1f ms; first step begun %.1f ms, done on every replica %.1f ms; whole job %.1f ms (from launch)',
            $formed * 1000.0, (min(t_start_ns) - $tl) / 1e6,
            (select max(t_end_ns) from steps s2 where s2.step = (select min(step) from steps) and s2.epoch = (select min(epoch) from steps)) / 1e6 - $tl / 1e6,
            (max(t_end_ns) - $tl) / 1e6) from steps"
    done
    ;;
allreduce)
    # The exchange between emulated hosts against the cost model: the
    # scenario's median step minus its median compute (the processes
    # engine's step timings, as the performance check reads them) next to
    # dsim whatif's alpha-beta time for the same ring over 10 GbE.
    command -v python3 >/dev/null && command -v sqlite3 >/dev/null ||
        { echo "SKIP: allreduce needs python3 and sqlite3"; exit 77; }
    [ $shaped = 4 ] || echo "note: unshaped links: the prediction is for 10 GbE"
    for run in 1 2 3; do
        rm -f ns.db
        start_job
        for t in 0 1 2 3; do eval "q=\$w$t"; wait "$q" || fail "task $t failed"; done
        sqlite3 ns.db "select printf('run $run: step %.2f ms, compute %.2f ms, exchange %.2f ms (all-reduce share %.0f %%)',
            1e3 * (select value from metrics where name = 'step_time_median'),
            1e3 * (select value from metrics where name = 'compute_time_median'),
            1e3 * ((select value from metrics where name = 'step_time_median') -
                   (select value from metrics where name = 'compute_time_median')),
            100 * (select value from metrics where name = 'allreduce_share'))"
    done
    "$dsim" whatif "$scenario" --network 10gbe --algo ring --device cpu |
        sed -n 's/^\(10gbe .*\)/predicted (dsim whatif, alpha-beta, 10gbe): \1/p'
    echo "(columns: network algorithm allreduce_ms compute_ms step_ms share speedup efficiency best)"
    ;;
*)
    echo "netns.sh: unknown mode '$mode' (accepted: quickstart, scenario, partition, bench, allreduce)"
    exit 99
    ;;
esac
exit 0
