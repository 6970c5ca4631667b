#!/bin/sh
# Runs a scenario that fails, then `dsim trace desync` on the run it stored,
# and checks that the analysis says each of the given texts:
#   run_trace.sh DSIM SCENARIO TEXT...
# DSIM_TRACE_RUN_ARGS: more arguments for dsim run (e.g. --engine processes).
# With SQLITE3_SHELL set, also that the store holds the same records: a
# flight_records row for every entry of the JSON file.
set -u
dsim=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
case $2 in /*) scenario=$2 ;; *) scenario=$(pwd)/$2 ;; esac
shift 2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsim-trace.XXXXXX") || exit 99
cd "$tmp" || exit 99
# shellcheck disable=SC2086 # the extra arguments are words
"$dsim" run "$scenario" --db "$tmp/dsim.db" ${DSIM_TRACE_RUN_ARGS:-} > run.out 2>&1
"$dsim" trace desync 1 --db "$tmp/dsim.db" > trace.out 2>&1
rc=$?
cat trace.out
status=0
if [ $rc -ne 0 ]; then
  echo "dsim trace desync exited $rc"; cat run.out; status=1
fi
for want in "$@"; do
  if ! grep -qF -- "$want" trace.out; then
    echo "MISSING from the analysis: $want"; status=1
  fi
done
if [ -n "${SQLITE3_SHELL:-}" ]; then
  rows=$("$SQLITE3_SHELL" "$tmp/dsim.db" "SELECT count(*) FROM flight_records WHERE run_id = 1")
  entries=$(grep -c '"collective_seq_id"' "$tmp/dsim-flight/run-1.json")
  if [ "${rows:-0}" -eq 0 ] || [ "$rows" != "$entries" ]; then
    echo "the store holds ${rows:-no} flight_records rows for run 1, the file $entries entries"
    status=1
  fi
fi
cd / && rm -rf "$tmp"
exit $status
