/* Internal to sim/store: the schema's migrations and the writers' fork
 * gate. */
#ifndef DSIM_STORE_INT_H
#define DSIM_STORE_INT_H

#include "store.h"

/* store_migrations[k] is the SQL that takes user_version k to k + 1. */
extern const char *const store_migrations[DSIM_STORE_SCHEMA_VERSION];

/* fork_gate.c: a writer's work happens inside the gate, which a fork()
 * anywhere in the process closes (and waits for) first, so that no child
 * starts with a lock a writer held. store_gate_install registers the
 * pthread_atfork handlers, once per process. */
void store_gate_install(void);
void store_gate_enter(void);
void store_gate_leave(void);

#endif
