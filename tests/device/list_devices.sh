#!/bin/sh
# `dsim list devices`, run as a user does: list_devices.sh DSIM MODE
#   host  the host backend's line and the closing verdict: "no GPU found:
#         CPU" when CUDA finds nothing (with the reason on the cuda line),
#         "GPUs found: N (cuda)" when it finds N; DSIM_HOST_DEVICES shows;
#         `dsim list` names devices among what it lists
#   gpu   the same on a machine with GPUs: every GPU listed with its memory,
#         compute capability and bandwidth; exits 77 ("no CUDA device")
#         where there is none
set -u
dsim=$1 mode=$2
fail() { echo "FAIL: $*"; exit 1; }

out=$("$dsim" list devices) || fail "dsim list devices exited $?"
echo "$out"
json=$("$dsim" list devices --json) || fail "dsim list devices --json exited $?"
gpus=$(echo "$json" | sed -n 's/^  "gpus": \([0-9]*\),$/\1/p')
[ -n "$gpus" ] || fail "no \"gpus\" count in the JSON: $json"
echo "$out" | grep -q '^host     0  ' || fail "no line for host device 0"

if [ "$gpus" -eq 0 ]; then
    [ "$mode" = gpu ] && { echo "no CUDA device: $(echo "$out" | grep '^cuda')"; exit 77; }
    echo "$out" | tail -n 1 | grep -qx 'no GPU found: CPU' || fail "last line is not 'no GPU found: CPU'"
    echo "$out" | grep -Eq '^cuda +- +(no CUDA device: .+|not in this build .+)$' ||
        fail "the cuda line does not say why there is no GPU"
    echo "$json" | grep -q '"summary": "no GPU found: CPU"' || fail "JSON summary"
else
    echo "$out" | tail -n 1 | grep -qx "GPUs found: $gpus (cuda)" || fail "last line is not 'GPUs found: $gpus (cuda)'"
    n=$(echo "$out" | grep -Ec '^cuda +[0-9]+ +.+ GiB +[0-9]+\.[0-9]+ +[0-9]+ +[0-9]+ GB/s ')
    [ "$n" -eq "$gpus" ] || fail "$gpus GPUs counted but $n listed with memory, CC, SMs and bandwidth"
fi

two=$(DSIM_HOST_DEVICES=2 "$dsim" list devices | grep -c '^host ')
[ "$two" -eq 2 ] || fail "DSIM_HOST_DEVICES=2 lists $two host devices"
bad=$(DSIM_HOST_DEVICES=lots "$dsim" list devices | grep '^host ')
echo "$bad" | grep -q "DSIM_HOST_DEVICES='lots'" || fail "a bad DSIM_HOST_DEVICES is not explained: $bad"
err=$("$dsim" list nothing 2>&1 >/dev/null)
echo "$err" | grep -q 'devices' || fail "'dsim list nothing' does not mention devices: $err"
echo "ok"
