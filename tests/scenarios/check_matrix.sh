#!/bin/sh
# Checks that a scenario file's matrix makes exactly N runs, as
# tests/scenarios/meson.build lists them:  check_matrix.sh DSIM FILE N
set -u
out=$("$1" validate "$2") || { echo "$out"; exit 1; }
echo "$out"
case $out in
  *"(a matrix of $3 runs)"*) exit 0 ;;
  *) echo "expected a matrix of $3 runs: update scenario_matrix in tests/scenarios/meson.build"; exit 1 ;;
esac
