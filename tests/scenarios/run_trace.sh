#!/bin/sh
# Runs a scenario that fails, then `dsim trace desync` on the run it stored,
# and checks that the analysis says each of the given texts:
#   run_trace.sh DSIM SCENARIO TEXT...
set -u
dsim=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
case $2 in /*) scenario=$2 ;; *) scenario=$(pwd)/$2 ;; esac
shift 2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsim-trace.XXXXXX") || exit 99
cd "$tmp" || exit 99
"$dsim" run "$scenario" --db "$tmp/dsim.db" > run.out 2>&1
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
cd / && rm -rf "$tmp"
exit $status
