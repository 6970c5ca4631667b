#!/bin/sh
# What dsim says about a run, checked line by line: runs a scenario the way a
# user does (a directory of its own, a results store of its own), then holds
# the exit status, the output and the store to what the test expects.
#   verdict.sh DSIM SCENARIO WANT_RC [dsim run options...]
# $VERDICT_SAYS   lines the output must hold (fixed strings, one a line)
# $VERDICT_NEVER  lines it must not hold
# $VERDICT_SQL    lines "QUERY => VALUE": each query on the store gives VALUE
# $VERDICT_ECHO   lines "QUERY": what each query gives must be in the output
#                 (one number shown two ways must be shown the same)
set -u
dsim=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
case $2 in /*) scenario=$2 ;; *) scenario=$(pwd)/$2 ;; esac
want_rc=$3
shift 3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsim-verdict.XXXXXX") || exit 99
cd "$tmp" || exit 99
"$dsim" run "$scenario" --db "$tmp/dsim.db" "$@" > out.txt 2>&1
rc=$?
fail=0
[ "$rc" -eq "$want_rc" ] || { echo "exit status $rc, expected $want_rc"; fail=1; }
while IFS= read -r w; do
  [ -z "$w" ] && continue
  grep -qF -- "$w" out.txt || { echo "the output lacks: $w"; fail=1; }
done <<END
${VERDICT_SAYS:-}
END
while IFS= read -r w; do
  [ -z "$w" ] && continue
  ! grep -qF -- "$w" out.txt || { echo "the output holds: $w"; fail=1; }
done <<END
${VERDICT_NEVER:-}
END
if command -v sqlite3 >/dev/null 2>&1; then
  while IFS= read -r line; do
    [ -z "$line" ] && continue
    q=${line%% => *}
    want=${line#* => }
    got=$(sqlite3 "$tmp/dsim.db" "$q" 2>&1)
    [ "$got" = "$want" ] || { echo "the store: $q gave '$got', expected '$want'"; fail=1; }
  done <<END
${VERDICT_SQL:-}
END
  while IFS= read -r q; do
    [ -z "$q" ] && continue
    got=$(sqlite3 "$tmp/dsim.db" "$q" 2>&1)
    { [ -n "$got" ] && grep -qF -- "$got" out.txt; } ||
      { echo "the store says '$got' ($q), the output does not"; fail=1; }
  done <<END
${VERDICT_ECHO:-}
END
else
  echo "# sqlite3 not found: the store's side is not checked"
fi
[ "$fail" -eq 0 ] || cat out.txt
cd / && rm -rf "$tmp"
exit $fail
