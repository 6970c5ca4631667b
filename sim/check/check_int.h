/* The built-in checks' tables, each defined in its own file. */
#ifndef DSIM_CHECK_INT_H
#define DSIM_CHECK_INT_H

#include <stddef.h>

#include "check/check.h"

extern const dsim_check_ops dsim_check_gradient_consistency;
extern const dsim_check_ops dsim_check_shard_coverage;
extern const dsim_check_ops dsim_check_convergence;
extern const dsim_check_ops dsim_check_node_loss;
extern const dsim_check_ops dsim_check_checkpoint_roundtrip;
extern const dsim_check_ops dsim_check_performance;
extern const dsim_check_ops dsim_check_cold_start;

/* Writes (or appends) a message into msg[cap], truncating; always
 * terminated. Used instead of snprintf so that a long peer message is cut
 * rather than a compile-time truncation warning. */
void dsim_check_msg(char *msg, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void dsim_check_msg_append(char *msg, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- gradient_consistency.c ---- */

/* True, with a sentence in msg, when one device replaying the run step by
 * step from the run's own variables (dsim_train_reference_follow) finds
 * every step's update within gradient_consistency's default tolerance of
 * the run's: the run computed every step right, and where it ends far from
 * the reference it is float rounding that parted them. False when it does
 * not, or cannot tell (no trace kept, a restored or asynchronous run). */
bool gc_steps_right(const dsim_check_ctx *ctx, char *msg, size_t cap);

/* ---- ckpt_probe.c: save, restore and broadcast, each judged on its own ---- */

/* The worst of got[0..n) beyond tolerance against want: its index, or
 * SIZE_MAX when every value is within it; *n_out counts those beyond. */
size_t ck_worst(const float *got, const float *want, size_t n, double max_abs, double max_rel,
                size_t *n_out, double *rel_out);
/* How a saved optimizer's slots are held to a replay's: each value beyond
 * max_abs within max_rel of the larger of the two; where `scaled` (a
 * narrow dtype), each slot (Adam's m, v) as a whole, its distance from the
 * replay's within max_rel of its norm: an element of a gradient that
 * cancels between the replicas rounds at the size of the replicas' parts,
 * not its own, and a moment near zero moves by a large part of itself.
 * The values named then are measured against the root mean square of
 * their slot over their variable at least. */
typedef struct ck_tol {
    double max_abs, max_rel;
    bool scaled;
} ck_tol;
/* checkpoint_roundtrip's tolerances for run (v: the check's max_rel_error
 * and max_abs_error, NaN where unset): 1e-4 and 1e-6 for a float32 run; a
 * run that rounds its gradients to a narrow dtype (mixed precision,
 * gradients all-reduced in float16 or bfloat16) 16 u of the narrowest
 * (dsim_check_narrow_u), scaled. */
void ck_tolerances(const dsim_train_result *run, const double *v, ck_tol *t);
/* A one-device replay of cfg's first g global steps (the optimizer's
 * slots and step as they were after step g). */
dsim_err ck_replay_to(const dsim_train_cfg *cfg, uint64_t g, dsim_train_result *ref);
/* The same replay, following the variables attempt w kept (its trace:
 * dsim_train_reference_follow), so that each step's gradient is taken at
 * the run's own variables and the optimizer's slots after step g are where
 * the run's are, though float rounding parted the run from the plain
 * replay's trajectory. False when w kept none (or resumed from a
 * checkpoint) or the replay failed; free *ref either way. */
bool ck_follow_to(const dsim_train_cfg *cfg, const dsim_train_result *w, uint64_t g,
                  dsim_train_result *ref);
/* Restores ck in a job of no steps (threads engine, this process) with
 * cfg.probe_restore: out->restored is what the strategy holds right after
 * the restore, out->replicas[r].created_checksum every replica's variables
 * then. Release out with dsim_train_result_free either way. */
/* A probe's job: cfg's, in this process (threads, or sim for many ranks),
 * without faults, hooks, observers, checkpoints or preemption, stopped
 * after `steps` global steps (0: run to the end). */
void ck_probe_cfg(const dsim_train_cfg *cfg, uint64_t steps, dsim_train_cfg *c);
dsim_err ck_probe_restore(const dsim_train_cfg *cfg, const dsim_checkpoint *ck,
                          dsim_train_result *out);
/* True, with the sentence in msg, when some replicas but not all left
 * create_variables with other variables than ck's after restoring it. */
bool ck_judge_broadcast(const dsim_train_result *r, const dsim_checkpoint *ck, char *msg,
                        size_t cap);
/* True, with the sentence in msg and *which "parameters", "optimizer state"
 * or "step", when what the strategy holds after restoring ck differs. */
bool ck_judge_restore(const dsim_train_result *probe, const dsim_checkpoint *ck, double max_abs,
                      double max_rel, char *msg, size_t cap, const char **which);
/* Whether ck's Adagrad accumulators are ref's less initial_accumulator_value
 * at every parameter (within max_abs and 1e-5 relative): saved as they
 * were, but started at 0 instead of from init->optim_state. */
bool ck_slots_started0(const dsim_checkpoint *ck, const dsim_train_result *ref,
                       const dsim_optim_spec *os, double max_abs);
/* The unit roundoff of the narrowest dtype run rounds to: its policy's
 * compute dtype or its gradients' all-reduce dtype (float16 2^-11,
 * bfloat16 2^-8); 0 for a float32 run. */
double dsim_check_narrow_u(const dsim_train_result *run);
/* Keras's class name of the optimizer ("Adam", "RMSprop", "SGD with
 * momentum" for TF1's momentum kind, ...) */
const char *ck_optim_title(const dsim_optim_spec *os);
/* True, with the sentence in msg and *which "optimizer state" or "step",
 * when ck's optimizer slots or step differ from ref's (a replay to its
 * step); *measured: the worst relative difference, INFINITY for a step. */
bool ck_judge_saved_optimizer(const dsim_checkpoint *ck, const dsim_train_result *ref,
                              const dsim_optim_spec *os, const ck_tol *tol, char *msg, size_t cap,
                              const char **which, double *measured);

#endif
