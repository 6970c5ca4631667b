#!/bin/sh
# Runs one catalogue scenario the way a user does, in a directory of its own
# (relative checkpoint paths land there) with a results store of its own:
#   run_scenario.sh DSIM SCENARIO [dsim run options...]
# The exit status is dsim's: 0 when every expectation of the scenario is met.
set -u
dsim=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
case $2 in /*) scenario=$2 ;; *) scenario=$(pwd)/$2 ;; esac
shift 2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsim-scenario.XXXXXX") || exit 99
cd "$tmp" || exit 99
"$dsim" run "$scenario" --db "$tmp/dsim.db" "$@"
rc=$?
cd / && rm -rf "$tmp"
exit $rc
