/* What the strategy tests share: the dataset and job they train, the
 * tolerance against the single-device reference, and an observer that
 * records every replica's checksum after every step. */
#ifndef DSIM_TESTS_STRAT_COMMON_H
#define DSIM_TESTS_STRAT_COMMON_H

#include <stdatomic.h>
#include <stdint.h>

#include "dsim/dataset.h"
#include "dsim/strategy.h"

/* The softmax task every test trains: 256 examples of 8 features, 4
 * classes, 8 record files. Made once per process. */
const dsim_dataset *sc_dataset(void);

/* A job on sc_dataset: sgd lr 0.1, global batch 32 (8 steps per epoch),
 * 2 epochs, shuffled, seed 11, replica 0's variables recorded per step. */
void sc_cfg(dsim_train_cfg *cfg, const char *strategy, int hosts, int devices_per_host);

/* The bound on |run - reference| after `steps` steps with n_replicas
 * replicas (see the derivation in strat_common.c). */
double sc_tolerance(const dsim_train_cfg *cfg, const dsim_train_result *ref,
                    const dsim_train_result *run, uint64_t steps, int n_replicas);

/* The largest, over every step, of |run - reference| divided by that step's
 * tolerance (<= 1 passes), and the largest absolute difference. */
void sc_distance(const dsim_train_cfg *cfg, const dsim_train_result *ref,
                 const dsim_train_result *run, double *worst_ratio, double *worst_abs);

/* Records checksums[global_step * N + replica] from the observer. */
typedef struct sc_observer {
    int n_replicas;
    uint64_t steps;
    uint64_t *checksum;
    atomic_int calls;
    atomic_int bad; /* calls with a step or replica out of range */
} sc_observer;

void sc_observer_init(sc_observer *o, int n_replicas, uint64_t steps);
void sc_observer_free(sc_observer *o);
void sc_observe(const dsim_train_step_info *info, void *user);
/* 1 if every replica reported the same checksum at every step. */
int sc_observer_in_sync(const sc_observer *o);

/* $name, or NULL (the caller skips). */
const char *sc_plugin(const char *env);

#endif
