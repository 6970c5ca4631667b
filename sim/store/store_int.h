/* Internal to sim/store: the schema's migrations. */
#ifndef DSIM_STORE_INT_H
#define DSIM_STORE_INT_H

#include "store.h"

/* store_migrations[k] is the SQL that takes user_version k to k + 1. */
extern const char *const store_migrations[DSIM_STORE_SCHEMA_VERSION];

#endif
