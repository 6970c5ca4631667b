#!/bin/sh
# dsim explore's tests: test_explore.sh CASE DSIM SCENARIO_DIR PLUGIN_DIR
#   planted_bug       a strategy that ignores a failed all-reduce passes without
#                     faults; explore finds a failing schedule, shrinks it to at
#                     most two faults, and `dsim run` of the written file fails
#                     the same check
#   matrix_left_out   a scenario with a matrix: explore explores its own shape,
#                     and the written file holds no matrix (with it, `dsim run`
#                     ran every combination, and a drawn link fault out of
#                     range in one was refused)
#   correct_strategy  multi_worker_mirrored under recovery: restart survives
#                     every drawn schedule
#   bad_input         no scenario, --runs 0, an unknown kind: exit 2, a message
#   deterministic     the same --seed draws and shrinks the same way twice
#   run_timeout       a run that never ends (a strategy that sleeps for ever)
#                     is stopped at --timeout and reported, never a hang
#   shapes_found      a strategy whose all-reduce drops the n % N tail passes
#                     at its scenario's sizes; explore --shapes finds a size
#                     where it fails, shrinks it to one whose parameter count
#                     the replicas do not divide, and the written file fails
#                     `dsim run` the same way
#   shapes_builtin    explore --shapes finds nothing on the built-in
#                     strategies and the worked-example plugin (a bounded
#                     number of runs each)
#   shapes_input_fn   --shapes on a strategy with its own input_fn: the sizes
#                     it refuses are skipped and said, its planted bug found
#   shapes_bad_input  --shapes: no scenario, a timing-only model, --runs 0
#   node_loss_expected  a scenario that expects node_loss (the catalogue's
#                     fault files) is explored: its run without faults is
#                     not judged by node_loss, which has no fault to judge
#                     there; a planted bug is still found with it expected
#   shapes_tpu        --shapes on a TPU job: the shapes are its generation's
#                     slices (cluster.tpu; the file could not load with
#                     cluster.hosts written in); the correct TPUStrategy
#                     passes on every slice drawn, and a planted bug (padding
#                     rows left unmasked) is found, shrunk to a smaller
#                     slice, and written as a file that names its slice
#   shrink_keeps_shape  shrinking takes no host away when the smaller
#                     cluster fails without any fault (input_fn.yaml's global
#                     batch of 30 on 4 replicas): the found scenario fails by
#                     its faults, not by its shape; a shrink run refused by
#                     its shape reads otherwise than the faults' timeout (the
#                     run's error is in the way it fails), and no change is
#                     tried twice in a row
set -u
case_=$1 dsim=$2 scen=$3 plugins=$4
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
fail() { echo "FAIL: $*"; [ -f out.txt ] && cat out.txt; exit 1; }

case $case_ in
matrix_left_out)
    { cat "$scen/ignore_abort.yaml"; printf '\nmatrix:\n  cluster.devices_per_host: [1, 2]\n'; } \
        > withmatrix.yaml
    "$dsim" explore withmatrix.yaml --runs 30 --seed 1 --plugin-dir "$plugins" \
        -o found.yaml > out.txt 2>&1
    rc=$?
    cat out.txt
    [ $rc -eq 1 ] || fail "dsim explore exited $rc, wanted 1 (a failure found)"
    grep -q '^ignore_abort: 3 hosts x 2 devices' out.txt || fail "not the file's own shape"
    ! grep -q '^matrix:' found.yaml || fail "found.yaml keeps the matrix"
    "$dsim" run found.yaml --plugin-dir "$plugins" --db found.db > run.txt 2>&1
    rc=$?
    cat run.txt
    [ $rc -eq 1 ] || fail "dsim run found.yaml exited $rc, wanted 1"
    grep -q 'gradient_consistency' run.txt || fail "dsim run does not name gradient_consistency"
    ;;
planted_bug)
    # the bug does not show without a fault
    "$dsim" run "$scen/ignore_abort.yaml" --engine sim --plugin-dir "$plugins" --db plain.db \
        > plain.txt 2>&1 || { cat plain.txt; fail "ignore_abort fails without faults"; }
    "$dsim" explore "$scen/ignore_abort.yaml" --runs 30 --seed 1 --plugin-dir "$plugins" \
        -o found.yaml > out.txt 2>&1
    rc=$?
    cat out.txt
    [ $rc -eq 1 ] || fail "dsim explore exited $rc, wanted 1 (a failure found)"
    line=$(grep '^FAILED: run ' out.txt) || fail "no FAILED line"
    run=$(echo "$line" | sed -n 's/^FAILED: run \([0-9]*\) of.*/\1/p')
    final=$(echo "$line" | sed -n 's/.*shrunk from [0-9]* faults to \([0-9]*\).*/\1/p')
    [ -n "$run" ] && [ "$run" -le 30 ] || fail "first failure at run '$run'"
    [ -n "$final" ] && [ "$final" -ge 1 ] && [ "$final" -le 2 ] ||
        fail "shrunk to '$final' faults, wanted 1 or 2"
    echo "$line" | grep -q 'failed with gradient_consistency' || fail "not a gradient_consistency failure"
    grep -q '^shrink [0-9]*: .*kept$' out.txt || fail "no shrink step was kept"
    grep -q 'verified: it fails the same way' out.txt || fail "the written file was not verified"
    grep -q "^reproduce with: dsim run found.yaml --plugin-dir $plugins\$" out.txt ||
        fail "no reproduce command"
    [ -f found.yaml ] || fail "found.yaml not written"
    grep -q '^engine: sim$' found.yaml || fail "found.yaml has no engine: sim"
    grep -q '^seed: 5$' found.yaml || fail "found.yaml has not the scenario's seed"
    n=$(grep -c '^  - {what: ' found.yaml)
    [ "$n" -eq "$final" ] || fail "found.yaml holds $n faults, the output said $final"
    "$dsim" validate --plugin-dir "$plugins" found.yaml > val.txt 2>&1 || { cat val.txt; fail "found.yaml does not validate"; }
    "$dsim" run found.yaml --plugin-dir "$plugins" --db found.db > run.txt 2>&1
    rc=$?
    cat run.txt
    [ $rc -eq 1 ] || fail "dsim run found.yaml exited $rc, wanted 1"
    grep -q 'gradient_consistency' run.txt || fail "dsim run does not name gradient_consistency"
    ;;
correct_strategy)
    "$dsim" explore "$scen/mwm_restart.yaml" --runs 60 --seed 3 -o none.yaml > out.txt 2>&1
    rc=$?
    cat out.txt
    [ $rc -eq 0 ] || fail "dsim explore exited $rc on a correct strategy, wanted 0"
    grep -q '^60 runs, no failure$' out.txt || fail "no summary of 60 runs"
    grep -q '^run 60/60: passed' out.txt || fail "no progress line for the last run"
    [ ! -f none.yaml ] || fail "a scenario was written though nothing failed"
    ;;
bad_input)
    expect2() { # MESSAGE ARGS...: exit 2 and MESSAGE on stderr
        msg=$1; shift
        "$dsim" explore "$@" > out.txt 2> err.txt
        rc=$?
        [ $rc -eq 2 ] || { cat err.txt; fail "dsim explore $* exited $rc, wanted 2"; }
        grep -q -- "$msg" err.txt || { cat err.txt; fail "dsim explore $*: no '$msg'"; }
    }
    expect2 'which scenario?' --runs 5
    expect2 "--runs is '0'" "$scen/mwm_restart.yaml" --runs 0
    expect2 "--runs is 'x'" "$scen/mwm_restart.yaml" --runs x
    expect2 "unknown fault kind 'meteor'" "$scen/mwm_restart.yaml" --kinds kill,meteor
    expect2 "--max-faults is '9'" "$scen/mwm_restart.yaml" --max-faults 9
    expect2 'needs a value' "$scen/mwm_restart.yaml" --runs
    expect2 'no_such.yaml' "$tmp/no_such.yaml"
    ;;
deterministic)
    for i in 1 2; do
        "$dsim" explore "$scen/ignore_abort.yaml" --runs 30 --seed 11 --plugin-dir "$plugins" \
            --kinds drop,delay,corrupt,pause -o f$i.yaml | sed 's/ ([0-9.]* s)$//; s/f[12]\.yaml/F/g' > o$i.txt
    done
    cat o1.txt
    grep -q '^FAILED: run ' o1.txt || fail "no failure found with drop, delay, corrupt, pause"
    cmp o1.txt o2.txt || { diff o1.txt o2.txt; fail "two searches with the same seed differ"; }
    grep -v '^#' f1.yaml > a.txt; grep -v '^#' f2.yaml > b.txt
    cmp a.txt b.txt || fail "the written scenarios differ"
    ;;
run_timeout)
    # the hang_sleep fixture of tests/harness hangs with or without faults
    DSIM_SIM_STALL_S=100 "$dsim" explore "$scen/../../harness/scenarios/hang_sleep.yaml" --runs 3 \
        --timeout 2 --plugin-dir "$plugins/../harness" > out.txt 2>&1
    rc=$?
    cat out.txt
    [ $rc -eq 1 ] || fail "dsim explore exited $rc, wanted 1"
    grep -q '^FAILED without faults: timeout: the run took longer than 2 s' out.txt ||
        fail "the hung run was not reported as a timeout"
    # what failed is written, as it ran, for dsim run
    grep -q '^wrote hang_sleep.explore.yaml (the scenario without its faults)$' out.txt ||
        fail "the run without faults was not written"
    grep -q '^reproduce with: dsim run hang_sleep.explore.yaml --plugin-dir ' out.txt ||
        fail "no command to reproduce it"
    grep -q '^# Written by dsim explore .*without its faults' hang_sleep.explore.yaml ||
        fail "the written file does not say what it is"
    ! grep -q '{what:' hang_sleep.explore.yaml || fail "the written file has faults"
    "$dsim" validate hang_sleep.explore.yaml --plugin-dir "$plugins/../harness" > v.txt 2>&1 ||
        { cat v.txt; fail "the written file does not validate"; }
    ;;
shapes_found)
    "$dsim" run "$scen/tail_drop.yaml" --plugin-dir "$plugins" --db plain.db > plain.txt 2>&1 ||
        { cat plain.txt; fail "tail_drop fails at its own sizes"; }
    "$dsim" explore --shapes "$scen/tail_drop.yaml" --runs 20 --seed 1 --plugin-dir "$plugins" \
        -o found.yaml > out.txt 2>&1
    rc=$?
    cat out.txt
    [ $rc -eq 1 ] || fail "dsim explore --shapes exited $rc, wanted 1 (a failure found)"
    grep -q '^FAILED: run [0-9]* of 20 failed with gradient_consistency at ' out.txt ||
        fail "no FAILED line naming gradient_consistency"
    grep -q '^shrink [0-9]*: .*kept$' out.txt || fail "no shrink step was kept"
    final=$(sed -n 's/^shrunk to \(.*\) ([0-9]* kept changes, [0-9]* shrink runs):$/\1/p' out.txt)
    [ -n "$final" ] || fail "no 'shrunk to' line"
    h=$(echo "$final" | sed -n 's/^\([0-9]*\) hosts\{0,1\} x .*/\1/p')
    d=$(echo "$final" | sed -n 's/^[0-9]* hosts\{0,1\} x \([0-9]*\) device.*/\1/p')
    p=$(echo "$final" | sed -n 's/.*devices\{0,1\}, \([0-9]*\) parameters.*/\1/p')
    [ -n "$h" ] && [ -n "$d" ] && [ -n "$p" ] || fail "cannot read the shrunk shape '$final'"
    r=$((h * d))
    [ $((p % r)) -ne 0 ] || fail "shrunk to $p parameters over $r replicas: no tail"
    [ "$r" -le 3 ] || fail "shrunk to $r replicas: 2 or 3 already fail"
    [ "$h" -eq 1 ] || fail "shrunk to $h hosts: 1 host already fails"
    grep -q 'verified: it fails the same way' out.txt || fail "the written file was not verified"
    grep -q "^reproduce with: dsim run found.yaml --plugin-dir $plugins\$" out.txt ||
        fail "no reproduce command"
    grep -q '^# Reproduce: dsim run found.yaml' found.yaml || fail "found.yaml has no header"
    grep -q "^cluster: {hosts: $h, devices_per_host: $d}\$" found.yaml ||
        fail "found.yaml has not the shrunk cluster"
    grep -q '^engine: sim$' found.yaml || fail "found.yaml has no engine: sim"
    grep -q '^seed: 9$' found.yaml || fail "found.yaml has not the scenario's seed"
    "$dsim" validate --plugin-dir "$plugins" found.yaml > val.txt 2>&1 ||
        { cat val.txt; fail "found.yaml does not validate"; }
    "$dsim" run found.yaml --plugin-dir "$plugins" --db found.db > run.txt 2>&1
    rc=$?
    cat run.txt
    [ $rc -eq 1 ] || fail "dsim run found.yaml exited $rc, wanted 1"
    grep -q 'gradient_consistency .*FAIL' run.txt || fail "dsim run does not fail gradient_consistency"
    # failing at its own sizes (27 parameters over 4 replicas): that run is
    # written as it ran, for dsim run
    sed 's/^  classes: 4$/  classes: 3/' "$scen/tail_drop.yaml" > own.yaml
    "$dsim" explore --shapes own.yaml --runs 5 --seed 1 --plugin-dir "$plugins" -o own_found.yaml \
        > out.txt 2>&1
    rc=$?
    cat out.txt
    [ $rc -eq 1 ] || fail "dsim explore --shapes own.yaml exited $rc, wanted 1"
    grep -q '^FAILED at its own sizes' out.txt || fail "no FAILED at its own sizes"
    grep -q '^wrote own_found.yaml (the scenario as it ran)$' out.txt || fail "not written"
    "$dsim" run own_found.yaml --plugin-dir "$plugins" --db own.db > run.txt 2>&1
    rc=$?
    cat run.txt
    [ $rc -eq 1 ] || fail "dsim run own_found.yaml exited $rc, wanted 1"
    grep -q 'gradient_consistency .*FAIL' run.txt || fail "own_found.yaml does not fail the same"
    ;;
shapes_builtin)
    cat_dir=$scen/../../../scenarios
    for f in "$scen/mwm_restart.yaml" "$cat_dir/mirrored.yaml" "$cat_dir/central_storage.yaml" \
        "$cat_dir/one_device.yaml" "$cat_dir/parameter_server_sync.yaml" \
        "$cat_dir/parameter_server_async.yaml" "$cat_dir/checkpoint_roundtrip.yaml" \
        "$cat_dir/custom_strategy.yaml"; do
        "$dsim" explore --shapes "$f" --runs 12 --seed 4 -o none.yaml \
            --plugin-dir "$plugins/../../examples/custom_strategy" > out.txt 2>&1
        rc=$?
        [ $rc -eq 0 ] || fail "dsim explore --shapes $f exited $rc on a correct strategy"
        grep -q '^12 runs, no failure$' out.txt || fail "$f: no summary of 12 runs"
        [ "$(grep -c '^run [0-9]*/12: passed at ' out.txt)" -eq 12 ] || fail "$f: not 12 runs passed"
        [ ! -f none.yaml ] || fail "$f: a scenario was written though nothing failed"
    done
    ;;
shapes_tpu)
    cat_dir=$scen/../../../scenarios
    "$dsim" explore --shapes "$cat_dir/tpu/v3.yaml" --runs 8 --seed 4 -o none.yaml > out.txt 2>&1
    rc=$?
    cat out.txt
    [ $rc -eq 0 ] || fail "dsim explore --shapes tpu/v3.yaml exited $rc on the TPUStrategy"
    grep -q '^tpu_v3: v3-32: 4 hosts x 8 devices, .* passes; exploring 8 other sizes' out.txt ||
        fail "the file's own slice is not run first"
    grep -q '^8 runs, no failure$' out.txt || fail "no summary of 8 runs"
    grep -q '^run [0-9]*/8: passed at v3-8: 1 host x 8 devices' out.txt ||
        fail "no run on another slice of the generation (v3-8)"
    ! grep -q 'passed at v[^3]' out.txt || fail "a slice of another generation was drawn"
    [ ! -f none.yaml ] || fail "a scenario was written though nothing failed"
    # the planted bug at a global batch the cores divide (no padding) and
    # expected to pass, as a user who does not know of it would write it
    tpu_plugins=$plugins/../strategy
    sed -e 's/global_batch: 20/global_batch: 32/' \
        -e 's/gradient_consistency: {expect: fail}/gradient_consistency: {}/' \
        "$cat_dir/tpu/unmasked_padding_bug.yaml" > unmasked.yaml
    "$dsim" run unmasked.yaml --plugin-dir "$tpu_plugins" --db plain.db > plain.txt 2>&1 ||
        { cat plain.txt; fail "the planted bug shows at a global batch of 32 on 8 cores"; }
    "$dsim" explore --shapes unmasked.yaml --runs 12 --seed 4 --plugin-dir "$tpu_plugins" \
        -o found.yaml > out.txt 2>&1
    rc=$?
    cat out.txt
    [ $rc -eq 1 ] || fail "the planted TPU bug was not found (exit $rc)"
    grep -q 'the padding is not masked out of the loss' out.txt || fail "not the padding bug"
    grep -q '^shrunk to v3-8: 1 host x 8 devices' out.txt || fail "not shrunk to a v3-8"
    grep -q '^cluster: {tpu: v3-8}$' found.yaml || fail "found.yaml does not name its slice"
    "$dsim" run found.yaml --plugin-dir "$tpu_plugins" --db found.db > run.txt 2>&1
    rc=$?
    cat run.txt
    [ $rc -eq 1 ] || fail "dsim run found.yaml exited $rc, wanted 1 (the bug)"
    ;;
shapes_input_fn)
    # a strategy whose input_fn refuses sizes (a global batch the replicas
    # do not divide) is not reported as failing at them; its planted bug
    # (the uneven split's remainder dropped) is still found
    cat_dir=$scen/../../../scenarios
    ifn=$plugins/../../examples/input_fn_strategy
    "$dsim" explore --shapes "$cat_dir/input_fn.yaml" --runs 20 --seed 1 -o none.yaml \
        --plugin-dir "$ifn" > out.txt 2>&1
    rc=$?
    cat out.txt
    [ $rc -eq 0 ] || fail "dsim explore --shapes input_fn.yaml exited $rc on a correct strategy"
    grep -q '^20 runs, no failure$' out.txt || fail "no summary of 20 runs"
    grep -q "drawn sizes not run: the strategy's input_fn refuses them" out.txt ||
        fail "the refused sizes are not said"
    grep -q 'first: get_per_replica_batch_size: the global batch size' out.txt ||
        fail "the first refusal is not named"
    [ ! -f none.yaml ] || fail "a scenario was written though nothing failed"
    sed -e 's/libinput_fn_strategy.so/libinput_fn_drop_last_strategy.so/' \
        -e 's/name: sharded_input$/name: sharded_input_drop_last/' \
        -e 's/examples: 256/examples: 255/' "$cat_dir/input_fn.yaml" > drop.yaml
    "$dsim" explore --shapes drop.yaml --runs 20 --seed 1 -o found.yaml \
        --plugin-dir "$ifn" > out.txt 2>&1
    rc=$?
    cat out.txt
    [ $rc -eq 1 ] || fail "dsim explore --shapes on the planted bug exited $rc, wanted 1"
    grep -q 'failed with shard_coverage' out.txt || fail "the planted bug is not found"
    grep -q 'verified: it fails the same way' out.txt || fail "not verified"
    ;;
node_loss_expected)
    cat_dir=$scen/../../../scenarios
    "$dsim" explore "$cat_dir/faults/worker_dies_mid_allreduce.yaml" --runs 8 --seed 7 \
        -o none.yaml > out.txt 2>&1
    rc=$?
    cat out.txt
    [ $rc -eq 0 ] || fail "dsim explore worker_dies_mid_allreduce.yaml exited $rc, wanted 0"
    grep -q 'not judged by node_loss' out.txt || fail "leaving node_loss out is not said"
    grep -q '^8 runs, no failure$' out.txt || fail "no summary of 8 runs"
    sed 's/^  gradient_consistency: {}$/  gradient_consistency: {}\n  node_loss: {max_detect_s: 5}/' \
        "$scen/ignore_abort.yaml" > nl.yaml
    grep -q 'node_loss' nl.yaml || fail "the test did not add node_loss"
    "$dsim" explore nl.yaml --runs 30 --seed 1 --plugin-dir "$plugins" -o found.yaml \
        > out.txt 2>&1
    rc=$?
    cat out.txt
    [ $rc -eq 1 ] || fail "dsim explore on the planted bug with node_loss exited $rc, wanted 1"
    ! grep -q 'without any fault' out.txt || fail "the run without faults failed"
    grep -q 'verified: it fails the same way' out.txt || fail "not verified"
    grep -q 'node_loss' found.yaml || fail "found.yaml lost node_loss"
    ;;
shrink_keeps_shape)
    cat_dir=$scen/../../../scenarios
    ifn=$plugins/../../examples/input_fn_strategy
    "$dsim" explore "$cat_dir/input_fn.yaml" --runs 3 --seed 5 --max-faults 3 -o found.yaml \
        --plugin-dir "$ifn" > out.txt 2>&1
    rc=$?
    cat out.txt
    [ $rc -eq 1 ] || fail "dsim explore input_fn.yaml exited $rc, wanted 1 (run 2's faults fail it)"
    grep -q '2 hosts instead of 3: fails without any fault' out.txt ||
        fail "the smaller cluster's own failure is not said"
    grep -q 'still fails the same way, kept' out.txt || fail "nothing was shrunk"
    # a refused shape reads otherwise than the faults' timeout
    grep -q 'failed with gradient_consistency (not judged: the run failed);' out.txt ||
        fail "not the faults' failure"
    grep -q 'fails without any fault (gradient_consistency (not judged: the run failed: invalid arg' \
        out.txt || fail "the smaller cluster's refusal does not read otherwise"
    twice=$(sed -n 's/^shrink [0-9]*: //p' out.txt | uniq -d)
    [ -z "$twice" ] || fail "tried twice in a row: $twice"
    grep -q '^  hosts: 3$' found.yaml || fail "found.yaml lost a host"
    "$dsim" run found.yaml --plugin-dir "$ifn" --db found.db > run.txt 2>&1
    rc=$?
    cat run.txt
    [ $rc -eq 1 ] || fail "dsim run found.yaml exited $rc, wanted 1"
    ! grep -q 'not divisible' run.txt || fail "found.yaml fails by its shape, not its faults"
    ;;
shapes_bad_input)
    expect2() { # MESSAGE ARGS...: exit 2 and MESSAGE on stderr
        msg=$1; shift
        "$dsim" explore --shapes "$@" > out.txt 2> err.txt
        rc=$?
        [ $rc -eq 2 ] || { cat err.txt; fail "dsim explore --shapes $* exited $rc, wanted 2"; }
        grep -q -- "$msg" err.txt || { cat err.txt; fail "dsim explore --shapes $*: no '$msg'"; }
    }
    expect2 'which scenario?' --runs 5
    expect2 "--runs is '0'" "$scen/mwm_restart.yaml" --runs 0
    expect2 'timing-only model' "$scen/../../../scenarios/whatif/allreduce_4096_timing.yaml"
    expect2 'no_such.yaml' "$tmp/no_such.yaml"
    ;;
*)
    fail "unknown case $case_"
    ;;
esac
echo "ok: $case_"
