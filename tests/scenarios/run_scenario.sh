#!/bin/sh
# Runs one catalogue scenario the way a user does, with a results store of
# its own:  run_scenario.sh DSIM SCENARIO
# The exit status is dsim's: 0 when every expectation of the scenario is met.
set -u
dsim=$1
scenario=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsim-scenario.XXXXXX") || exit 99
"$dsim" run "$scenario" --db "$tmp/dsim.db"
rc=$?
rm -rf "$tmp"
exit $rc
