/* Coverage builds (meson -Db_coverage=true, which defines DSIM_COVERAGE):
 * gcov writes a process's counters when it exits normally, but not on
 * _exit() or a death by signal, which is how the processes engine's
 * children, dsim run's supervisor and interrupt, the crash guard and the
 * sim engine's refusal of a misused runtime (abort) end.
 * DSIM_COV_DUMP() writes them first there, so that what those processes
 * ran is counted; elsewhere it is nothing. */
#ifndef DSIM_SIM_COV_H
#define DSIM_SIM_COV_H

#if defined(DSIM_COVERAGE) && DSIM_COVERAGE
void __gcov_dump(void);
#define DSIM_COV_DUMP() __gcov_dump()
#else
#define DSIM_COV_DUMP() ((void)0)
#endif

#endif
