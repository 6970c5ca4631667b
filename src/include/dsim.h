/* libdsim: everything a user links against. */
#ifndef DSIM_H
#define DSIM_H
#include "dsim/err.h"
#include "dsim/log.h"
#include "dsim/dtype.h"
#include "dsim/reduce.h"
#include "dsim/device.h"
#include "dsim/rng.h"
#include "dsim/rt.h"
#include "dsim/transport.h"
#include "dsim/comm.h"
#include "dsim/health.h"
#include "dsim/cluster.h"
#include "dsim/tpu.h"
#include "dsim/model.h"
#include "dsim/optim.h"
#include "dsim/precision.h"
#include "dsim/dataset.h"
#include "dsim/data.h"
#include "dsim/strategy.h"
#endif
