#!/bin/sh
# Closes the loop between dsim and another framework, with NumPy standing in
# for it: makes a dataset as .npy (and CSV) files, trains on it with dsim
# (data.source), exports the run (dsim export) and replays the same optimizer
# steps from the exported files alone (replay.py), which must land within
# 1e-6 of dsim's final parameters and reproduce its parameter checksums.
#
#   compare.sh DSIM REPLAY_PY [ENGINE]
#
# Exit 77 (skipped) when no python3 with NumPy is found ($PYTHON, python3,
# /usr/bin/python3: Debian's python3-numpy).
set -eu
dsim=$1
replay=$2
engine=${3:-threads}

py=
for c in "${PYTHON:-}" python3 /usr/bin/python3; do
    if [ -n "$c" ] && "$c" -c 'import numpy' 2>/dev/null; then
        py=$c
        break
    fi
done
if [ -z "$py" ]; then
    echo "compare.sh: no python3 with NumPy (apt-get install python3-numpy): skipped"
    exit 77
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/dsim-compare-XXXXXX")
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/data" "$dir/scenarios"

# a classification set (float64 features, int64 labels: converted on load),
# a regression set as CSV
"$py" - "$dir/data" <<'PY'
import sys
import numpy as np
d = sys.argv[1]
r = np.random.default_rng(7)
x = r.standard_normal((300, 6))
w = r.standard_normal((6, 4))
np.save(d + "/x.npy", x)
np.save(d + "/y.npy", np.argmax(x @ w, axis=1).astype(np.int64))
xr = r.standard_normal((200, 3)).astype(np.float32)
yr = xr @ np.array([0.5, -1.0, 2.0], np.float32) + 0.25
with open(d + "/reg.csv", "w") as f:
    f.write("a,b,c,target\n")
    for row, t in zip(xr, yr):
        f.write("%r,%r,%r,%r\n" % (float(row[0]), float(row[1]), float(row[2]), float(t)))
PY

n=0
one() { # NAME MODEL OPTIMIZER DATA [RUN_ARG [EXPORT_ARG]]
    n=$((n + 1))
    cat >"$dir/scenarios/$1.yaml" <<YAML
name: $1
seed: 11
cluster: {hosts: 2, devices_per_host: 2}
strategy: {name: multi_worker_mirrored}
model: $2
optimizer: $3
data: $4
expect: {gradient_consistency: {}, shard_coverage: {}}
YAML
    "$dsim" run "$dir/scenarios/$1.yaml" --engine "$engine" --db "$dir/runs.db" ${5:-} >"$dir/out" 2>&1 ||
        { cat "$dir/out"; echo "compare.sh: dsim run $1 failed"; exit 1; }
    "$dsim" export "$n" --db "$dir/runs.db" --to "$dir/export-$1" ${6:-} ||
        { echo "compare.sh: dsim export $n ($1) failed"; exit 1; }
    "$py" "$replay" "$dir/export-$1" --tol 1e-6 >"$dir/replay" ||
        { cat "$dir/replay"; echo "compare.sh: $1: the NumPy replay does not match dsim's run"; exit 1; }
    cat "$dir/replay"
}

npy='{source: {x: ../data/x.npy, y: ../data/y.npy}, files: 4, global_batch: 40, epochs: 2}'
one softmax_sgd '{kind: softmax}' '{kind: sgd, learning_rate: 0.5}' "$npy"
one mlp_momentum '{kind: mlp, hidden: [8]}' '{kind: momentum, learning_rate: 0.1, momentum: 0.9}' "$npy"
one mlp2_adam '{kind: mlp, hidden: [7, 5]}' '{kind: adam, learning_rate: 0.01}' \
    '{source: {x: ../data/x.npy, y: ../data/y.npy}, global_batch: 32, shuffle: true}'
one linear_csv '{kind: linear}' '{kind: sgd, learning_rate: 0.05}' \
    '{source: {csv: ../data/reg.csv, label_column: target}, files: 2, global_batch: 20}'
# Keras's gradient clipping: the all-reduced gradient clipped by its global
# norm (small enough here to clip every step), and element by element
one mlp_adam_clipnorm '{kind: mlp, hidden: [8]}' \
    '{kind: adam, learning_rate: 0.05, global_clipnorm: 0.05}' "$npy"
one softmax_momentum_clipvalue '{kind: softmax}' \
    '{kind: momentum, learning_rate: 0.2, momentum: 0.9, clipvalue: 0.01}' "$npy"
# AdamW: Keras's decoupled weight decay, with the clip LLM training uses
one mlp_adamw '{kind: mlp, hidden: [8]}' \
    '{kind: adam, learning_rate: 0.05, weight_decay: 0.1, global_clipnorm: 1.0}' "$npy"
# Keras's learning-rate schedules: the rate of each step from the
# optimizer's step counter, in float32
one softmax_sgd_piecewise '{kind: softmax}' \
    '{kind: sgd, schedule: {kind: piecewise_constant, boundaries: [3, 9], values: [0.5, 0.2, 0.05]}}' "$npy"
one mlp_momentum_exponential '{kind: mlp, hidden: [8]}' \
    '{kind: momentum, learning_rate: 0.1, schedule: {kind: exponential_decay, decay_steps: 4, decay_rate: 0.8, staircase: true}}' "$npy"
# Keras's SGD(momentum=0.9, nesterov=True) under the same schedule: its
# velocity keeps each step's own rate (TF1's momentum kind rescales it)
one mlp_sgd_momentum_exponential '{kind: mlp, hidden: [8]}' \
    '{kind: sgd, learning_rate: 0.1, momentum: 0.9, nesterov: true, schedule: {kind: exponential_decay, decay_steps: 4, decay_rate: 0.5, staircase: true}}' "$npy"
# Keras's CosineDecayRestarts (SGDR): periods of 3, 6, 12 steps, each
# restart at 0.7 times the last one's rate
one mlp_sgd_cosine_restarts '{kind: mlp, hidden: [8]}' \
    '{kind: sgd, learning_rate: 0.2, momentum: 0.5, schedule: {kind: cosine_decay_restarts, first_decay_steps: 3, m_mul: 0.7, alpha: 0.05}}' "$npy"
one mlp_adamw_cosine_warmup '{kind: mlp, hidden: [8]}' \
    '{kind: adam, learning_rate: 0.001, weight_decay: 0.1, schedule: {kind: cosine_decay, decay_steps: 10, alpha: 0.1, warmup_target: 0.05, warmup_steps: 4}}' "$npy"
one linear_csv_polynomial '{kind: linear}' \
    '{kind: sgd, learning_rate: 0.05, schedule: {kind: polynomial_decay, decay_steps: 7, end_learning_rate: 0.01, power: 2, cycle: true}}' \
    '{source: {csv: ../data/reg.csv, label_column: target}, files: 2, global_batch: 20}'
one softmax_adam_inverse_time '{kind: softmax}' \
    '{kind: adam, learning_rate: 0.05, schedule: {kind: inverse_time_decay, decay_steps: 2, decay_rate: 0.5}}' "$npy"
# Keras 3's gradient_accumulation_steps: the variables move every 3rd
# step by the average of 3 steps' gradients, clipped by its global norm
one mlp_adamw_accumulated '{kind: mlp, hidden: [8]}' \
    '{kind: adam, learning_rate: 0.05, weight_decay: 0.1, global_clipnorm: 0.5, gradient_accumulation_steps: 3}' "$npy"
# Keras 3's RMSprop (epsilon inside the root; centered, with momentum:
# three slots) and Adagrad (its accumulator starting at 0.1)
one mlp_rmsprop '{kind: mlp, hidden: [8]}' '{kind: rmsprop, learning_rate: 0.01, epsilon: 0.001}' "$npy"
one mlp_rmsprop_centered '{kind: mlp, hidden: [8]}' \
    '{kind: rmsprop, learning_rate: 0.01, momentum: 0.5, centered: true, weight_decay: 0.1}' "$npy"
one softmax_adagrad '{kind: softmax}' '{kind: adagrad, learning_rate: 0.2}' "$npy"
# Keras 3's Lion: the sign of an interpolated momentum, each step a whole lr
one mlp_lion '{kind: mlp, hidden: [8]}' '{kind: lion, learning_rate: 0.001, beta2: 0.95}' "$npy"
# Keras 3's Adamax (a running maximum of |g|) and Adam with amsgrad (the
# running maximum of v in the denominator), with AdamW's decay
one mlp_adamax '{kind: mlp, hidden: [8]}' '{kind: adamax, learning_rate: 0.01}' "$npy"
one mlp_amsgrad '{kind: mlp, hidden: [8]}' \
    '{kind: adam, learning_rate: 0.02, amsgrad: true, weight_decay: 0.1}' "$npy"
# Keras 3's Lamb: Adam's update scaled per variable (kernel, bias) by the
# ratio of the variable's norm to the update's
one mlp_lamb '{kind: mlp, hidden: [8]}' '{kind: lamb, learning_rate: 0.01, weight_decay: 0.01}' "$npy"
# Keras's clipnorm: each variable's gradient clipped by its own norm
one mlp_clipnorm '{kind: mlp, hidden: [8]}' '{kind: adam, learning_rate: 0.01, clipnorm: 0.05}' "$npy"
# Keras 3's Nadam: Adam with Nesterov momentum on a schedule of its own
# (u_product), under gradient accumulation (u_product over the update steps)
one mlp_nadam '{kind: mlp, hidden: [8]}' \
    '{kind: nadam, learning_rate: 0.01, gradient_accumulation_steps: 3}' "$npy"
# Keras 3's Adadelta: each step's size from running averages of the squared
# gradients and of the squared steps (a unit-free rule: a rate of 1 trains)
one mlp_adadelta '{kind: mlp, hidden: [8]}' '{kind: adadelta, learning_rate: 1.0}' "$npy"
# 2,400 steps of a ReLU MLP with Adam: float rounding (float32 sums in
# dsim's order against NumPy's float64) is amplified until the two
# trajectories part, and the ends differ by far more than 1e-6; with every
# step's variables exported, each step replayed from dsim's own variables
# is within 1e-6, and replay.py says so
one mlp_long_adam '{kind: mlp, hidden: [32, 32]}' '{kind: adam, learning_rate: 0.05}' \
    '{source: {x: ../data/x.npy, y: ../data/y.npy}, files: 4, global_batch: 40, epochs: 300}' \
    --keep-params --per-step
grep -q 'largest difference of one step' "$dir/replay" ||
    { echo "compare.sh: mlp_long_adam: replay.py did not replay step by step"; exit 1; }
# run and exported without every step's variables, dsim export says how to
# get them
"$dsim" run "$dir/scenarios/mlp_long_adam.yaml" --engine "$engine" --db "$dir/runs.db" \
    >"$dir/out" 2>&1 || { cat "$dir/out"; echo "compare.sh: dsim run (plain) failed"; exit 1; }
"$dsim" export "$((n + 1))" --db "$dir/runs.db" --to "$dir/export-plain" >"$dir/out" ||
    { cat "$dir/out"; echo "compare.sh: dsim export $((n + 1)) (plain) failed"; exit 1; }
grep -q 'export with --per-step' "$dir/out" ||
    { cat "$dir/out"; echo "compare.sh: dsim export does not say how to replay a parted run"; exit 1; }
echo "compare.sh: $n runs exported and replayed by NumPy within 1e-6"
