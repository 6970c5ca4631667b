/* The writers' fork gate (store_int.h).
 *
 * The processes engine, dsim worker and the supervisor fork children that
 * go on running code without exec. A child has only the forking thread;
 * every lock another thread held at the fork stays held in it for ever. A
 * store's writer is the one thread of ours that works while a run forks:
 * it is inside SQLite (its mutexes), the allocator (GCC 12's AddressSanitizer
 * takes no lock around fork(), so a child can find an allocator lock held
 * and hang on its first malloc) and stdio most of the time it is awake.
 *
 * So a writer does its work inside the gate (store_gate_enter/leave: a
 * batch's commit and the frees of its records) and sleeps outside it, and
 * a pthread_atfork prepare handler closes the gate and waits until no
 * writer is inside before fork() proceeds; the parent's and the child's
 * handlers open it again. A fork waits at most one batch (or the busy
 * timeout of a database that another program holds locked).
 *
 * The other threads a run may have at a fork hold no lock while they wait:
 * the crash guard's watcher (blocked in read(2) until a crash), dsim run's
 * interrupt thread (in sigwait until a signal). What either does once woken
 * ends in the death of the process, which takes every child with it (each
 * child is set to die with its parent). */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdbool.h>

#include "store.h"
#include "store_int.h"

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_inside;  /* writers between enter and leave */
static bool gate_closed; /* a fork is under way */
static pthread_once_t gate_once = PTHREAD_ONCE_INIT;

/* Before fork(): close the gate and wait for the writers inside. gate_mu
 * stays held through the fork, so the child inherits it from this thread
 * (and unlocks it) rather than from a writer. */
static void gate_prepare(void)
{
    pthread_mutex_lock(&gate_mu);
    gate_closed = true;
    while (gate_inside > 0)
        pthread_cond_wait(&gate_cv, &gate_mu);
}

static void gate_parent(void)
{
    gate_closed = false;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

/* The child has no writer: no store of the parent may be used in it
 * (store.h). */
static void gate_child(void)
{
    gate_closed = false;
    gate_inside = 0;
    pthread_cond_init(&gate_cv, NULL);
    pthread_mutex_unlock(&gate_mu);
}

static void gate_install(void)
{
    pthread_atfork(gate_prepare, gate_parent, gate_child);
}

void store_gate_install(void)
{
    pthread_once(&gate_once, gate_install);
}

void store_gate_enter(void)
{
    pthread_mutex_lock(&gate_mu);
    while (gate_closed)
        pthread_cond_wait(&gate_cv, &gate_mu);
    gate_inside++;
    pthread_mutex_unlock(&gate_mu);
}

void store_gate_leave(void)
{
    pthread_mutex_lock(&gate_mu);
    if (--gate_inside == 0 && gate_closed)
        pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

/* dsim_thread_start: the new thread says it runs, then runs fn. */
typedef struct ts_arg {
    void *(*fn)(void *);
    void *arg;
    sem_t running;
} ts_arg;

static void *ts_main(void *p)
{
    ts_arg *a = p;
    void *(*fn)(void *) = a->fn;
    void *arg = a->arg;
    sem_post(&a->running); /* a is the creator's: not touched after this */
    return fn(arg);
}

int dsim_thread_start(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    ts_arg a = {.fn = fn, .arg = arg};
    if (sem_init(&a.running, 0, 0) != 0)
        return errno;
    int rc = pthread_create(t, attr, ts_main, &a);
    if (rc == 0)
        while (sem_wait(&a.running) != 0 && errno == EINTR)
            ;
    sem_destroy(&a.running);
    return rc;
}
