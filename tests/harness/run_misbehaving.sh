#!/bin/sh
# A misbehaving strategy on the processes engine (or ENGINE): the run must
# end, within the time given, exit 1 (or RC: a process that dies of a
# signal exits 128 + the signal), store the run with the expected status and
# print the expected words.
#   run_misbehaving.sh DSIM SCENARIO STATUS WORDS SECONDS [ENGINE [RC]]
# $MISBEHAVE_ALSO: more lines the output must hold (one per line);
# $MISBEHAVE_NEVER: lines it must not hold.
set -u
dsim=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
scenario=$2 status=$3 words=$4 limit=$5 engine=${6:-processes} want_rc=${7:-1}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsim-misbehave.XXXXXX") || exit 99
cd "$tmp" || exit 99
timeout "$limit" "$dsim" run "$scenario" --engine "$engine" --db "$tmp/dsim.db" > out.txt 2>&1
rc=$?
fail=0
[ "$rc" -eq "$want_rc" ] || { echo "exit status $rc, expected $want_rc"; fail=1; }
grep -q -- "$words" out.txt || { echo "the output lacks '$words'"; fail=1; }
while IFS= read -r w; do
  [ -z "$w" ] && continue
  grep -qF -- "$w" out.txt || { echo "the output lacks '$w'"; fail=1; }
done <<END
${MISBEHAVE_ALSO:-}
END
while IFS= read -r w; do
  [ -z "$w" ] && continue
  ! grep -qF -- "$w" out.txt || { echo "the output holds '$w'"; fail=1; }
done <<END
${MISBEHAVE_NEVER:-}
END
if command -v sqlite3 >/dev/null 2>&1; then
  got=$(sqlite3 "$tmp/dsim.db" "SELECT status FROM runs ORDER BY id DESC LIMIT 1" 2>/dev/null)
  [ "$got" = "$status" ] || { echo "stored as '$got', expected '$status'"; fail=1; }
fi
[ "$fail" -eq 0 ] || cat out.txt
cd / && rm -rf "$tmp"
exit $fail
