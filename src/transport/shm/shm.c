/* shm: the ranks of a job in processes of one host, or threads of one
 * process, through one shared mapping (dsim/spi/shm.h says what it offers,
 * shm_int.h how the mapping is laid out).
 *
 * This file: options, making and opening the mapping, the ops table (open,
 * close, send, cancel, abort) and the counters. shm_ring.c holds the rings
 * and the progress thread, shm_rndv.c large messages (cross-memory attach
 * and the bounce buffer), shm_live.c the watch on peer processes.
 *
 * Threads. Each fabric runs one progress thread, which reads every ring
 * into this process's ranks and hands the frames over in order, reads large
 * messages, and moves sends that found their ring full; it sleeps on its
 * process's futex when there is nothing to do. A fabric whose peers live in
 * other processes also runs a watcher, which polls their pidfds. Senders
 * write into the rings from their own threads and never wait for a peer: a
 * send that finds no room is queued, and the progress thread moves it when
 * the consumer rings. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "dsim/log.h"
#include "dsim/spi/rt.h"
#include "shm_int.h"

#define SHM_RING_DEF     ((size_t)512 << 10)
#define SHM_RING_MIN     ((size_t)16 << 10)
#define SHM_RING_MAX     ((size_t)64 << 20)
#define SHM_BOUNCE_DEF   ((size_t)1 << 20)
#define SHM_BOUNCE_MIN   ((size_t)64 << 10)
#define SHM_BOUNCE_MAX   ((size_t)1 << 30)
#define SHM_EAGER_DEF    ((size_t)64 << 10)
#define SHM_MAP_MAX      ((uint64_t)256 << 30)
#define SHM_PREFAULT_MAX ((size_t)64 << 20)
#define SHM_PAGE         4096
#define SHM_SPIN_MAX_NS  (1000LL * 1000 * 1000)
/* how long a waiting worker reads the rings itself before it sleeps: 200 us
 * (50 us before; 4 processes' all-reduce of 256 KiB to 4 MiB, whose steps'
 * waits run past 50 us while a peer copies and then slept, took 7-12 % less
 * at 200 us, 7 alternating rounds, and 8 B to 64 KiB, 16 and 64 MiB and the
 * quickstart's step were within noise either way) */
#define SHM_ASSIST_DEF_NS (200LL * 1000)
/* the pieces a reducing receive reads straight from the sender in
 * (piece=): by default an eighth of a core's L2 (the piece, the receiver's
 * partial result and the output of its reduction stay there while the other
 * rank on the core runs too), within these bounds */
#define SHM_PIECE_MIN    ((size_t)16 << 10)
#define SHM_PIECE_MAX    ((size_t)4 << 20)
#define SHM_PIECE_DEF_LO ((size_t)32 << 10)
#define SHM_PIECE_DEF_HI ((size_t)256 << 10)
#define SHM_PIECE_DEF    ((size_t)128 << 10)

typedef struct shm_opts {
    int fd;
    int have_local, lo, hi;
    size_t ring, bounce, eager_max, piece;
    int have_ring, have_bounce, have_eager;
    int cma_off;
    int cma_staged;  /* cma=staged: never straight into the receive */
    int park_off;    /* park=off: a large message no receive waits for is read at once */
    int rings_local; /* direct=off: ranks of this process talk through the rings too */
    int64_t spin_ns, assist_ns;
} shm_opts;

/* ---- options ---- */

static int shm_parse_rank(const char *s, const char **end, int *out)
{
    if (*s < '0' || *s > '9')
        return -1;
    long v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        v = v * 10 + (*s - '0');
        if (v > INT32_MAX)
            return -1;
    }
    *out = (int)v;
    *end = s;
    return 0;
}

static dsim_err shm_opt_local(int nranks, const char *val, shm_opts *o)
{
    const char *p = val;
    int a, b;
    if (shm_parse_rank(p, &p, &a) != 0)
        goto bad;
    b = a;
    if (*p == '-' && shm_parse_rank(p + 1, &p, &b) != 0)
        goto bad;
    if (*p || a > b || b >= nranks)
        goto bad;
    o->have_local = 1;
    o->lo = a;
    o->hi = b;
    return DSIM_OK;
bad:
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "shm option local=%s: expected the ranks this process hosts, as a rank or a "
                    "range A-B with A <= B, within 0..%d",
                    val, nranks - 1);
}

static dsim_err shm_opt_spin(const char *key, const char *val, int64_t *out)
{
    char *end = NULL;
    if (*val < '0' || *val > '9')
        goto bad;
    errno = 0;
    long long v = strtoll(val, &end, 10);
    if (errno == ERANGE || end == val)
        goto bad;
    int64_t unit;
    if (strcmp(end, "us") == 0 || *end == '\0')
        unit = 1000;
    else if (strcmp(end, "ms") == 0)
        unit = 1000 * 1000;
    else if (strcmp(end, "s") == 0)
        unit = 1000 * 1000 * 1000;
    else
        goto bad;
    if (v < 0 || v > SHM_SPIN_MAX_NS / unit)
        goto bad;
    *out = (int64_t)v * unit;
    return DSIM_OK;
bad:
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "shm option %s=%s: expected a duration from 0 to 1 s such as 0, 50us or "
                    "2ms (a bare number is microseconds)",
                    key, val);
}

static int shm_pow2(size_t v)
{
    return v && !(v & (v - 1));
}

/* A piece size shm takes: a multiple of 4 KiB within its bounds. */
static int shm_piece_ok(size_t v)
{
    return v % SHM_PAGE == 0 && v >= SHM_PIECE_MIN && v <= SHM_PIECE_MAX;
}

static dsim_err shm_opt_sizes(const shm_opts *o)
{
    if (o->have_ring && (!shm_pow2(o->ring) || o->ring < SHM_RING_MIN || o->ring > SHM_RING_MAX))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "shm option ring=%zu: a ring is a power of two from 16k to 64m bytes",
                        o->ring);
    if (o->have_bounce &&
        (o->bounce % SHM_PAGE || o->bounce < SHM_BOUNCE_MIN || o->bounce > SHM_BOUNCE_MAX))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "shm option bounce=%zu: a bounce buffer is a multiple of 4k from 64k to "
                        "1g bytes",
                        o->bounce);
    if (!shm_piece_ok(o->piece))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "shm option piece=%zu: a piece is a multiple of 4k from 16k to 4m bytes",
                        o->piece);
    return DSIM_OK;
}

/* An eighth of the L2 cache, a multiple of 4 KiB within [32 KiB, 256 KiB];
 * 128 KiB where the C library does not say. Measured on Zen 3 (512 KiB of
 * L2), 4 ranks on 2 CPUs: 64 KiB pieces against 128 KiB made the 4-64 MiB
 * all-reduce 21-37 % faster and left 256 KiB-1 MiB even
 * (docs/performance.md). */
static size_t shm_piece_default(void)
{
    long l2 = -1;
#ifdef _SC_LEVEL2_CACHE_SIZE
    l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    if (l2 <= 0)
        return SHM_PIECE_DEF;
    size_t p = ((size_t)l2 / 8) & ~(size_t)(SHM_PAGE - 1);
    return p < SHM_PIECE_DEF_LO ? SHM_PIECE_DEF_LO : p > SHM_PIECE_DEF_HI ? SHM_PIECE_DEF_HI : p;
}

static atomic_int shm_piece_warned;

static void shm_opts_default(shm_opts *o)
{
    memset(o, 0, sizeof *o);
    o->fd = -1;
    o->ring = SHM_RING_DEF;
    o->bounce = SHM_BOUNCE_DEF;
    o->eager_max = SHM_EAGER_DEF;
    o->piece = shm_piece_default();
    const char *piece = getenv("DSIM_SHM_PIECE");
    if (piece && *piece) {
        size_t v = 0;
        if (dsim_tp_opt_size("shm", "piece", piece, &v) == DSIM_OK && shm_piece_ok(v))
            o->piece = v;
        else if (!atomic_exchange(&shm_piece_warned, 1))
            dsim_warn("DSIM_SHM_PIECE=%s is not a size from 16k to 4m in 4k steps; using %zu "
                      "bytes",
                      piece, o->piece);
    }
    const char *env = getenv("DSIM_SHM_CMA");
    o->cma_off = env && strcmp(env, "off") == 0;
    o->cma_staged = env && strcmp(env, "staged") == 0;
    env = getenv("DSIM_SHM_PARK");
    o->park_off = env && strcmp(env, "off") == 0;
    env = getenv("DSIM_SHM_DIRECT");
    o->rings_local = env && strcmp(env, "off") == 0;
    o->assist_ns = SHM_ASSIST_DEF_NS;
    const char *assist = getenv("DSIM_SHM_ASSIST");
    if (assist && *assist && shm_opt_spin("assist", assist, &o->assist_ns) != DSIM_OK)
        dsim_warn("DSIM_SHM_ASSIST=%s is not a duration such as 0, 20us or 1ms; using %lld us",
                  assist, (long long)(o->assist_ns = SHM_ASSIST_DEF_NS) / 1000);
}

static dsim_err shm_opt_one(int nranks, const char *key, const char *val, shm_opts *o)
{
    if (strcmp(key, "fd") == 0) {
        const char *end;
        int fd;
        if (shm_parse_rank(val, &end, &fd) != 0 || *end)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "shm option fd=%s: expected the descriptor (a number) that "
                            "dsim_shm_create returned",
                            val);
        o->fd = fd;
        return DSIM_OK;
    }
    if (strcmp(key, "local") == 0)
        return shm_opt_local(nranks, val, o);
    if (strcmp(key, "ring") == 0) {
        o->have_ring = 1;
        return dsim_tp_opt_size("shm", key, val, &o->ring);
    }
    if (strcmp(key, "bounce") == 0) {
        o->have_bounce = 1;
        return dsim_tp_opt_size("shm", key, val, &o->bounce);
    }
    if (strcmp(key, "eager_max") == 0) {
        o->have_eager = 1;
        return dsim_tp_opt_size("shm", key, val, &o->eager_max);
    }
    if (strcmp(key, "piece") == 0)
        return dsim_tp_opt_size("shm", key, val, &o->piece);
    if (strcmp(key, "cma") == 0) {
        if (strcmp(val, "auto") != 0 && strcmp(val, "off") != 0 && strcmp(val, "staged") != 0)
            return DSIM_ERR(DSIM_EINVAL, -1, "shm option cma=%s: expected auto, staged or off",
                            val);
        o->cma_off = strcmp(val, "off") == 0;
        o->cma_staged = strcmp(val, "staged") == 0;
        return DSIM_OK;
    }
    if (strcmp(key, "park") == 0) {
        if (strcmp(val, "on") != 0 && strcmp(val, "off") != 0)
            return DSIM_ERR(DSIM_EINVAL, -1, "shm option park=%s: expected on or off", val);
        o->park_off = strcmp(val, "off") == 0;
        return DSIM_OK;
    }
    if (strcmp(key, "direct") == 0) {
        if (strcmp(val, "on") != 0 && strcmp(val, "off") != 0)
            return DSIM_ERR(DSIM_EINVAL, -1, "shm option direct=%s: expected on or off", val);
        o->rings_local = strcmp(val, "off") == 0;
        return DSIM_OK;
    }
    if (strcmp(key, "spin") == 0)
        return shm_opt_spin(key, val, &o->spin_ns);
    if (strcmp(key, "assist") == 0)
        return shm_opt_spin(key, val, &o->assist_ns);
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "unknown shm option '%s'; the known options are fd=, local=, ring=, bounce=, "
                    "eager_max=, piece=, cma=, park=, direct=, spin= and assist=",
                    key);
}

/* ---- the mapping ---- */

static size_t shm_page_up(size_t n)
{
    return (n + SHM_PAGE - 1) & ~(size_t)(SHM_PAGE - 1);
}

/* The mapping's layout; its size in h->total, whatever it comes to. */
static void shm_layout_of(int nranks, size_t ring, size_t bounce, shm_hdr *h)
{
    memset(h, 0, sizeof *h);
    uint64_t n2 = (uint64_t)nranks * (uint64_t)nranks;
    h->nranks = (uint32_t)nranks;
    h->rndv_slots = SHM_RNDV_SLOTS;
    h->ring_bytes = ring;
    h->bounce_bytes = bounce;
    h->off_ranks = SHM_PAGE;
    h->off_pairs = shm_page_up(h->off_ranks + (uint64_t)nranks * sizeof(shm_rank));
    h->off_rings = shm_page_up(h->off_pairs + n2 * sizeof(shm_pair));
    h->off_bounce = h->off_rings + n2 * ring;
    h->total = h->off_bounce + n2 * bounce;
}

/* A job of many ranks: the sizes not given as options are halved, the
 * larger share first (ring and bounce down to their least, 16k and 64k),
 * until the mapping fits in SHM_MAP_MAX; 1.5 MiB a pair at the defaults
 * would stop a job at 418 ranks, the least sizes at 1,832. Sizes given as
 * options stay as given (too large a mapping is then the error below). */
static void shm_fit_sizes(int nranks, shm_opts *o)
{
    shm_hdr h;
    for (;;) {
        shm_layout_of(nranks, o->ring, o->bounce, &h);
        if (h.total <= SHM_MAP_MAX)
            return;
        int can_ring = !o->have_ring && o->ring > SHM_RING_MIN;
        int can_bounce = !o->have_bounce && o->bounce > SHM_BOUNCE_MIN;
        if (can_bounce && (!can_ring || o->bounce >= o->ring))
            o->bounce /= 2;
        else if (can_ring)
            o->ring /= 2;
        else
            return;
    }
}

static dsim_err shm_parse_opts(int nranks, const char *options, shm_opts *o)
{
    shm_opts_default(o);
    const char *cur = options;
    char key[32], val[256];
    int rc;
    while ((rc = dsim_tp_opt_next("shm", &cur, key, sizeof key, val, sizeof val)) > 0)
        DSIM_CHECK(shm_opt_one(nranks, key, val, o));
    if (rc < 0)
        return DSIM_EINVAL;
    return shm_opt_sizes(o);
}

static dsim_err shm_layout(int nranks, size_t ring, size_t bounce, shm_hdr *h)
{
    shm_layout_of(nranks, ring, bounce, h);
    if (h->total > SHM_MAP_MAX)
        return DSIM_ERR(
            DSIM_EINVAL, -1,
            "an shm mapping for %d ranks with ring=%zu and bounce=%zu would take %" PRIu64
            " GiB of address space, over the %" PRIu64 " GiB allowed; %s",
            nranks, ring, bounce, h->total >> 30, SHM_MAP_MAX >> 30,
            ring > SHM_RING_MIN || bounce > SHM_BOUNCE_MIN
                ? "give smaller ring= and bounce= (or use tcp)"
                : "that is too many ranks for one mapping even at the least sizes (ring=16k, "
                  "bounce=64k): use tcp");
    return DSIM_OK;
}

/* Makes and initialises the mapping, its sizes as o gives them or fitted
 * (shm_fit_sizes); returns its descriptor. */
static dsim_err shm_make(int nranks, shm_opts *o, int *fd_out)
{
    shm_fit_sizes(nranks, o);
    shm_hdr h;
    DSIM_CHECK(shm_layout(nranks, o->ring, o->bounce, &h));
    int fd = memfd_create("dsim-shm", MFD_CLOEXEC);
    if (fd < 0)
        return DSIM_ERR(DSIM_EIO, -1, "shm: memfd_create failed: %s", strerror(errno));
    if (ftruncate(fd, (off_t)h.total) != 0) {
        int err = errno;
        close(fd);
        return DSIM_ERR(DSIM_EIO, -1, "shm: cannot size the mapping to %" PRIu64 " bytes: %s",
                        h.total, strerror(err));
    }
    size_t head = shm_page_up(h.off_pairs);
    uint8_t *p = mmap(NULL, head, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int err = errno;
        close(fd);
        return DSIM_ERR(DSIM_EIO, -1, "shm: cannot map the new mapping: %s", strerror(err));
    }
    shm_hdr *hp = (shm_hdr *)p;
    *hp = h;
    shm_rank *ranks = (shm_rank *)(p + h.off_ranks);
    for (int r = 0; r < nranks; r++)
        atomic_init(&ranks[r].leader, -1);
    hp->magic = SHM_MAGIC;
    hp->version = SHM_VERSION;
    munmap(p, head);
    *fd_out = fd;
    return DSIM_OK;
}

dsim_err dsim_shm_create(int nranks, const char *options, int *fd)
{
    if (!fd)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_shm_create: fd is NULL");
    *fd = -1;
    if (nranks < 1 || nranks > (1 << 20))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_shm_create: nranks is %d; it must be between 1 and %d", nranks,
                        1 << 20);
    shm_opts o;
    DSIM_CHECK(shm_parse_opts(nranks, options, &o));
    if (o.fd >= 0 || o.have_local || o.have_eager)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_shm_create takes only ring= and bounce=; give fd=, local= and "
                        "eager_max= to each process's fabric");
    return shm_make(nranks, &o, fd);
}

static dsim_err shm_map(shm_fabric *sf, int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "shm option fd=%d: not an open descriptor (%s); pass the one "
                        "dsim_shm_create returned",
                        fd, strerror(errno));
    if ((size_t)st.st_size < sizeof(shm_hdr))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "shm option fd=%d: it holds %lld bytes, not a mapping made by "
                        "dsim_shm_create",
                        fd, (long long)st.st_size);
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return DSIM_ERR(DSIM_EIO, -1, "shm: cannot map fd %d: %s", fd, strerror(errno));
    sf->base = p;
    sf->map_len = (size_t)st.st_size;
    sf->hdr = p;
    const shm_hdr *h = sf->hdr;
    if (h->magic != SHM_MAGIC || h->version != SHM_VERSION || h->total != (uint64_t)st.st_size)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "shm option fd=%d: not a mapping made by dsim_shm_create of this "
                        "version (magic %#x, version %u, %" PRIu64 " of %lld bytes)",
                        fd, h->magic, h->version, h->total, (long long)st.st_size);
    if ((int)h->nranks != sf->nranks)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "shm option fd=%d: the mapping was made for %u ranks, the fabric has %d; "
                        "make it with dsim_shm_create(%d, ...)",
                        fd, h->nranks, sf->nranks, sf->nranks);
    sf->ranks = (shm_rank *)(sf->base + h->off_ranks);
    sf->pairs = (shm_pair *)(sf->base + h->off_pairs);
    return DSIM_OK;
}

/* Hosts ranks lo..hi in this process: each rank once per mapping. */
static dsim_err shm_claim(shm_fabric *sf)
{
    for (int r = sf->lo; r <= sf->hi; r++) {
        int32_t exp = 0;
        shm_rank *k = &sf->ranks[r];
        if (!atomic_compare_exchange_strong(&k->pid, &exp, (int32_t)sf->pid)) {
            for (int q = sf->lo; q < r; q++)
                atomic_store(&sf->ranks[q].pid, 0);
            return DSIM_ERR(DSIM_ESTATE, -1,
                            "shm: rank %d is already hosted by process %d in this mapping; each "
                            "rank is hosted by one process once per mapping (check local=, and "
                            "make a new mapping for a restarted job)",
                            r, (int)exp);
        }
        k->start = sf->start;
        k->gen = sf->gen;
    }
    for (int r = sf->lo; r <= sf->hi; r++)
        for (int p = 0; p < sf->nranks; p++)
            atomic_store_explicit(&shm_pair_of(sf, r, p)->gen, sf->gen, memory_order_release);
    for (int r = sf->lo; r <= sf->hi; r++) {
        atomic_store(&sf->ranks[r].state, SHM_RANK_OPEN);
        atomic_store(&sf->ranks[r].leader, sf->lo);
    }
    return DSIM_OK;
}

/* ---- fabric ---- */

static dsim_err shm_locals_init(shm_fabric *sf)
{
    int nlocal = sf->hi - sf->lo + 1;
    sf->locals = calloc((size_t)nlocal, sizeof *sf->locals);
    sf->dead = calloc((size_t)sf->nranks, sizeof *sf->dead);
    if (!sf->locals || !sf->dead)
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory opening a %d-rank shm fabric", sf->nranks);
    for (int i = 0; i < nlocal; i++) {
        shm_local *L = &sf->locals[i];
        int l = sf->lo + i;
        L->rank = l;
        atomic_init(&L->closed, 0);
        atomic_init(&L->busy, 0);
        L->out = calloc((size_t)sf->nranks, sizeof *L->out);
        L->in = calloc((size_t)sf->nranks, sizeof *L->in);
        if (!L->out || !L->in)
            return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory opening a %d-rank shm fabric",
                            sf->nranks);
        DSIM_CHECK(dsim_waitq_create(sf->rt, &L->sq));
        for (int p = 0; p < sf->nranks; p++) {
            shm_out *o = &L->out[p];
            o->pair = shm_pair_of(sf, l, p);
            o->ring = shm_ring_of(sf, l, p);
            o->bounce = shm_bounce_of(sf, l, p);
            o->tail = atomic_load(&o->pair->tail);
            shm_in *in = &L->in[p];
            in->pair = shm_pair_of(sf, p, l);
            in->ring = shm_ring_of(sf, p, l);
            in->bounce = shm_bounce_of(sf, p, l);
            in->head = atomic_load(&in->pair->head);
        }
    }
    return DSIM_OK;
}

static void shm_teardown(shm_fabric *sf)
{
    if (sf->prog_started) {
        atomic_store(&sf->stop, 1);
        shm_bell_ring(sf, sf->lo);
        pthread_join(sf->prog, NULL);
        sf->prog_started = 0;
        dsim_debug("shm: ranks %d-%d: %llu eager, %llu cma (%llu direct), %llu bounce; "
                   "progress thread slept %llu times, woken %llu; %llu waits ended assisting, "
                   "%llu send graces",
                   sf->lo, sf->hi, (unsigned long long)sf->st[SHM_ST(eager_msgs)],
                   (unsigned long long)sf->st[SHM_ST(cma_msgs)],
                   (unsigned long long)sf->st[SHM_ST(cma_direct)],
                   (unsigned long long)sf->st[SHM_ST(bounce_msgs)],
                   (unsigned long long)sf->st[SHM_ST(sleeps)],
                   (unsigned long long)sf->st[SHM_ST(wakes)],
                   (unsigned long long)sf->st[SHM_ST(assisted)],
                   (unsigned long long)sf->st[SHM_ST(graces)]);
    }
    shm_watch_stop(sf);
    if (sf->ranks)
        for (int r = sf->lo; r <= sf->hi; r++)
            if (atomic_load(&sf->ranks[r].pid) == (int32_t)sf->pid)
                atomic_store(&sf->ranks[r].state, SHM_RANK_GONE);
    if (sf->locals) {
        for (int i = 0; i <= sf->hi - sf->lo; i++) {
            shm_local *L = &sf->locals[i];
            for (int p = 0; L->out && p < sf->nranks; p++)
                while (L->out[p].qhead) {
                    shm_item *it = L->out[p].qhead;
                    L->out[p].qhead = it->next;
                    free(it);
                }
            free(L->out);
            for (int p = 0; L->in && p < sf->nranks; p++)
                free(L->in[p].stage);
            free(L->in);
            if (L->sq)
                dsim_waitq_destroy(L->sq);
        }
        free(sf->locals);
        sf->locals = NULL;
    }
    free(sf->dead);
    sf->dead = NULL;
    shm_stage_free(sf);
    if (sf->base)
        munmap(sf->base, sf->map_len);
    sf->base = NULL;
    if (sf->own_fd >= 0)
        close(sf->own_fd);
    sf->own_fd = -1;
    /* nothing polls any more: the progress thread is joined, and every
     * worker has finished its waits */
    pthread_mutex_destroy(&sf->poll_mu);
}

static uint32_t shm_new_gen(pid_t pid, uint64_t start)
{
    static atomic_uint counter;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t x = ((uint64_t)(uint32_t)pid << 32) ^ start ^ (uint64_t)ts.tv_nsec ^
                 ((uint64_t)atomic_fetch_add(&counter, 1) << 48);
    x *= 0x9E3779B97F4A7C15ULL;
    uint32_t g = (uint32_t)(x >> 32);
    return g ? g : 1;
}

/* The rings this process's ranks send into and read from, mapped in now:
 * else the first pass of small messages through each ring takes a page
 * fault per page on both sides (a new page of the memfd zeroed, then mapped
 * in the other process), which held a 4 KiB all-reduce of 4 ranks at about
 * twice its time for its first thousand or so calls. Only where the job's
 * rings are at most SHM_PREFAULT_MAX in all (every ring of the mapping is
 * some pair's), so that a job of many ranks does not take memory for rings
 * it may never fill; a kernel without MADV_POPULATE_WRITE skips it. The
 * rings between two ranks of this process stay out where they do not use
 * them (direct=on). */
static void shm_prefault(shm_fabric *sf)
{
#ifdef MADV_POPULATE_WRITE
    size_t ring = sf->hdr->ring_bytes, n = (size_t)sf->nranks;
    if (n * n * ring > SHM_PREFAULT_MAX)
        return;
    for (int me = sf->lo; me <= sf->hi; me++)
        for (int p = 0; p < sf->nranks; p++) {
            if (!sf->rings_local && shm_is_local(sf, p))
                continue;
            if (madvise(shm_ring_of(sf, me, p), ring, MADV_POPULATE_WRITE) != 0 ||
                (p != me && madvise(shm_ring_of(sf, p, me), ring, MADV_POPULATE_WRITE) != 0))
                return;
        }
#else
    (void)sf;
#endif
}

static dsim_err shm_setup(shm_fabric *sf, shm_opts *o)
{
    sf->lo = o->have_local ? o->lo : 0;
    sf->hi = o->have_local ? o->hi : sf->nranks - 1;
    sf->any_remote = sf->lo > 0 || sf->hi < sf->nranks - 1;
    sf->cma_off = o->cma_off;
    sf->cma_staged = o->cma_staged;
    sf->park_off = o->park_off;
    sf->rings_local = o->rings_local;
    sf->piece_len = o->piece;
    sf->spin_ns = o->spin_ns;
    sf->assist_ns = o->assist_ns;
    if (o->fd < 0 && sf->any_remote)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "shm option local=%d-%d leaves ranks of the %d-rank fabric in other "
                        "processes, and they must share one mapping: make it with "
                        "dsim_shm_create before forking and give each process fd=",
                        sf->lo, sf->hi, sf->nranks);
    if (o->fd >= 0 && (o->have_ring || o->have_bounce))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "shm options ring= and bounce= belong to dsim_shm_create, which makes "
                        "the mapping; a fabric opened with fd= uses its sizes");
    int fd = o->fd;
    if (fd < 0) {
        DSIM_CHECK(shm_make(sf->nranks, o, &sf->own_fd));
        fd = sf->own_fd;
    }
    DSIM_CHECK(shm_map(sf, fd));
    size_t ring = sf->hdr->ring_bytes;
    sf->eager_max = o->eager_max;
    if (!o->have_eager && sf->eager_max > ring / 4 - SHM_REC_HDR)
        sf->eager_max = ring / 4 - SHM_REC_HDR;
    if (sf->eager_max > ring / 4 - SHM_REC_HDR)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "shm option eager_max=%zu: a ring of %zu bytes takes messages of at most "
                        "%zu bytes; lower eager_max or make the mapping with a larger ring=",
                        sf->eager_max, ring, ring / 4 - SHM_REC_HDR);
    shm_prefault(sf);
    sf->pid = getpid();
    sf->start = shm_start_time(sf->pid);
    sf->gen = shm_new_gen(sf->pid, sf->start);
    DSIM_CHECK(shm_locals_init(sf));
    return shm_claim(sf);
}

static dsim_err shm_fabric_open(dsim_fabric *f, const char *options)
{
    shm_fabric *sf = dsim_tp_fabric_priv(f);
    memset(sf, 0, sizeof *sf);
    sf->f = f;
    sf->rt = dsim_tp_fabric_rt(f);
    sf->nranks = dsim_fabric_nranks(f);
    sf->own_fd = -1;
    sf->watch_evfd = -1;
    atomic_init(&sf->stop, 0);
    pthread_mutex_init(&sf->poll_mu, NULL);
    if (dsim_rt_engine_flags(dsim_rt_name(sf->rt)) & DSIM_RT_VIRTUAL_TIME)
        return DSIM_ERR(DSIM_ENOTSUP, -1,
                        "the shm transport needs a wall-clock engine (threads or processes); the "
                        "sim engine runs on virtual time: use inproc there");
    shm_opts o;
    dsim_err e = shm_parse_opts(sf->nranks, options, &o);
    if (e == DSIM_OK)
        e = shm_setup(sf, &o);
    if (e == DSIM_OK && sf->any_remote)
        e = shm_watch_start(sf);
#ifdef PR_SET_PTRACER
    /* Under Yama's ptrace_scope 1 (Ubuntu's default) a process may read
     * only its descendants' memory, and the ranks are siblings: let the
     * others read this one's, as Open MPI's vader does. EINVAL where Yama
     * is absent; a seccomp filter or scope 2 still refuses, and the bounce
     * buffer carries the large messages then. */
    if (e == DSIM_OK && sf->any_remote && !sf->cma_off)
        (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
#endif
    if (e == DSIM_OK) {
        /* Signals are for the workers: the progress thread never takes one. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int rc = pthread_create(&sf->prog, NULL, shm_progress_main, sf);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc != 0)
            e = DSIM_ERR(DSIM_ENOMEM, -1, "shm: cannot start the progress thread: %s",
                         strerror(rc));
        else
            sf->prog_started = 1;
    }
    if (e != DSIM_OK) {
        shm_teardown(sf);
        return e;
    }
    dsim_debug("shm: fabric of %d ranks, ranks %d-%d in process %d, ring %" PRIu64
               " B, eager up to %zu B, reducing reads in pieces of %zu B, large messages by %s",
               sf->nranks, sf->lo, sf->hi, (int)sf->pid, sf->hdr->ring_bytes, sf->eager_max,
               sf->piece_len, sf->cma_off ? "the bounce buffer (cma=off)" : "cross-memory attach");
    return DSIM_OK;
}

static void shm_fabric_close(dsim_fabric *f)
{
    shm_teardown(dsim_tp_fabric_priv(f));
}

static dsim_err shm_ep_open(dsim_ep *ep)
{
    shm_fabric *sf = dsim_tp_fabric_priv(dsim_tp_ep_fabric(ep));
    int r = dsim_ep_rank(ep);
    if (!shm_is_local(sf, r))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "rank %d is not hosted by this process (shm option local=%d-%d); open "
                        "it in the process that hosts it",
                        r, sf->lo, sf->hi);
    return DSIM_OK;
}

static void shm_ep_close(dsim_ep *ep)
{
    shm_fabric *sf = dsim_tp_fabric_priv(dsim_tp_ep_fabric(ep));
    int r = dsim_ep_rank(ep);
    if (!shm_is_local(sf, r))
        return;
    atomic_store(&shm_local_of(sf, r)->closed, 1);
    atomic_store(&sf->ranks[r].state, SHM_RANK_CLOSED);
}

/* ---- sending ---- */

void shm_out_update_locked(shm_local *L, shm_out *o)
{
    int now = o->qhead != NULL || o->outstanding > 0;
    if (now != o->active) {
        o->active = now;
        atomic_fetch_add(&L->busy, now ? 1 : -1);
    }
}

static dsim_err shm_take_abort(shm_fabric *sf, int to)
{
    char why[SHM_WHY_MAX];
    memcpy(why, sf->hdr->abort_why, sizeof why);
    why[sizeof why - 1] = '\0';
    int peer = sf->hdr->abort_peer;
    dsim_fabric_abort(sf->f, peer, why);
    return DSIM_ERR(DSIM_EABORTED, peer,
                    "transport aborted (failed rank %d: %s); sending to rank %d is refused", peer,
                    why, to);
}

static dsim_err shm_send(dsim_ep *ep, int to, const dsim_tp_hdr *hdr, const void *payload,
                         size_t len, dsim_req *req)
{
    shm_fabric *sf = dsim_tp_fabric_priv(dsim_tp_ep_fabric(ep));
    int from = dsim_ep_rank(ep);
    shm_local *L = shm_local_of(sf, from);
    shm_out *o = &L->out[to];
    uint32_t st = atomic_load_explicit(&sf->ranks[to].state, memory_order_acquire);
    /* Another process's abort notice: taken here and now, so that a send
     * never fails for a reason the notice explains (its sender may have
     * closed since). */
    if (atomic_load_explicit(&sf->hdr->abort_state, memory_order_acquire) == 2)
        return shm_take_abort(sf, to);
    int died = atomic_load_explicit(&sf->died_first, memory_order_acquire);
    if ((st == SHM_RANK_CLOSED || st == SHM_RANK_GONE) && died)
        return DSIM_ERR(DSIM_EPEER, died - 1,
                        "rank %d has closed its endpoint, after %s; rank %d cannot send to it "
                        "(comm %" PRIu32 ", tag %" PRIu32 ")",
                        to, sf->died_msg, from, hdr->comm_id, hdr->tag);
    if (st == SHM_RANK_CLOSED || st == SHM_RANK_GONE)
        return DSIM_ERR(DSIM_EPEER, to,
                        "rank %d has closed its endpoint; rank %d cannot send to it (comm %" PRIu32
                        ", tag %" PRIu32 ")",
                        to, from, hdr->comm_id, hdr->tag);
    if (!sf->rings_local && shm_is_local(sf, to)) {
        /* a rank of this process (direct=on): straight to its endpoint, as
         * inproc sends, with no ring, progress thread or wake-up between */
        dsim_err e = dsim_tp_hand_over(sf->f, to, hdr, payload, len, sf->eager_max, req);
        if (e == DSIM_OK) {
            shm_count(sf, SHM_ST(local_msgs), 1);
            shm_count(sf, SHM_ST(local_bytes), len);
        }
        return e;
    }
    dsim_rt_note_send(len);
    int large = len > sf->eager_max;
    int sent = 0;
    dsim_waitq_lock(L->sq);
    if (o->broken) {
        dsim_err e = DSIM_ERR(DSIM_EPEER, o->broken_blame, "%s", o->broken_msg);
        dsim_waitq_unlock(L->sq);
        return e;
    }
    if (!o->qhead) {
        if (large) {
            sent = shm_rndv_post(sf, from, to, o, hdr, payload, len, req);
        } else {
            shm_rec rec = {.kind = SHM_REC_DATA, .len = len, .hdr = *hdr};
            sent = shm_ring_put(sf, from, to, o, &rec, payload, len);
        }
    }
    if (!sent) {
        shm_item *it = malloc(sizeof *it);
        if (!it) {
            dsim_waitq_unlock(L->sq);
            return DSIM_ERR(DSIM_ENOMEM, to, "out of memory queueing a %zu-byte send to rank %d",
                            len, to);
        }
        *it = (shm_item){.kind = large ? SHM_ITEM_RTS : SHM_ITEM_DATA,
                         .req = req,
                         .hdr = *hdr,
                         .payload = payload,
                         .len = len};
        if (o->qtail)
            o->qtail->next = it;
        else
            o->qhead = it;
        o->qtail = it;
    }
    shm_out_update_locked(L, o);
    uint64_t tail = o->tail;
    dsim_waitq_unlock(L->sq);
    if (sent) {
        shm_bell_ring_send(sf, to, o, tail);
        if (!large)
            dsim_tp_complete(req, DSIM_OK);
    }
    return DSIM_OK;
}

static dsim_err shm_cancel_send(dsim_ep *ep, dsim_req *req)
{
    shm_fabric *sf = dsim_tp_fabric_priv(dsim_tp_ep_fabric(ep));
    shm_local *L = shm_local_of(sf, dsim_ep_rank(ep));
    shm_out *o = &L->out[dsim_req_peer(req)];
    dsim_err e = DSIM_ESTATE; /* in progress: the receiver has it */
    dsim_waitq_lock(L->sq);
    for (shm_item *it = o->qhead; it; it = it->next)
        if (it->req == req) {
            /* Nothing of it left: only its header goes, so the receiver's
             * sequence stays in step. */
            it->req = NULL;
            it->kind = SHM_ITEM_WITHDRAWN;
            it->payload = NULL;
            it->len = 0;
            e = DSIM_OK;
            break;
        }
    if (e != DSIM_OK && shm_rndv_cancel_locked(o, req))
        e = DSIM_OK;
    shm_out_update_locked(L, o);
    dsim_waitq_unlock(L->sq);
    return e;
}

/* Tells every process of the job: the notice in the mapping, then each
 * process's bell. The first notice stands. */
static void shm_abort(dsim_fabric *f, int failed_peer, const char *why)
{
    shm_fabric *sf = dsim_tp_fabric_priv(f);
    uint32_t exp = 0;
    if (!atomic_compare_exchange_strong(&sf->hdr->abort_state, &exp, 1))
        return;
    sf->hdr->abort_peer = failed_peer;
    snprintf(sf->hdr->abort_why, sizeof sf->hdr->abort_why, "%s", why ? why : "");
    atomic_store_explicit(&sf->hdr->abort_state, 2, memory_order_release);
    for (int r = 0; r < sf->nranks; r++)
        if (atomic_load(&sf->ranks[r].leader) == r)
            shm_bell_ring(sf, r);
}

dsim_err dsim_shm_get_stats(dsim_fabric *f, dsim_shm_stats *out)
{
    if (!f || !out || strcmp(dsim_fabric_backend(f), "shm") != 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_shm_get_stats: the fabric is not an shm fabric (or out is NULL)");
    shm_fabric *sf = dsim_tp_fabric_priv(f);
    uint64_t v[sizeof *out / sizeof(uint64_t)];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        v[i] = atomic_load_explicit(&sf->st[i], memory_order_relaxed);
    memcpy(out, v, sizeof *out);
    return DSIM_OK;
}

const struct dsim_tp_ops dsim_tp_shm_ops = {
    .size = sizeof(struct dsim_tp_ops),
    .name = "shm",
    .fabric_priv_size = sizeof(shm_fabric),
    .ep_priv_size = 0,
    .req_priv_size = 0,
    .fabric_open = shm_fabric_open,
    .fabric_close = shm_fabric_close,
    .ep_open = shm_ep_open,
    .ep_close = shm_ep_close,
    .send = shm_send,
    .cancel_send = shm_cancel_send,
    .abort = shm_abort,
    .conn_stats = NULL, /* a shared mapping: nothing to connect */
    .wait_assist = shm_wait_assist,
};
