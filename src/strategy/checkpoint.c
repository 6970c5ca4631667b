/* Checkpoint files: written whole to a temporary name, fsync'ed, renamed
 * over the target and the directory fsync'ed, so that a crash leaves either
 * the previous checkpoint or the new one; read back with every field and a
 * checksum verified. The layout (version 2, and the version 1 it extends)
 * is in dsim/strategy.h. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fiu_int.h"
#include "strategy_int.h"

#define CKPT_VERSION   DSIM_CHECKPOINT_VERSION
#define CKPT_HEADER_V1 64u
#define CKPT_HEADER    128u
#define CKPT_SHUFFLE   1u
#define CKPT_DROP      2u
static const char ckpt_magic[8] = {'D', 'S', 'I', 'M', 'C', 'K', 'P', 'T'};
/* Far above any model dsim trains; keeps size arithmetic from overflowing. */
#define CKPT_MAX_FLOATS ((uint64_t)1 << 32)

static uint64_t ckpt_fnv(uint64_t h, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
#define CKPT_FNV_INIT 0xcbf29ce484222325ull

static void ckpt_put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void ckpt_put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t ckpt_get32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t ckpt_get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void ckpt_put_floats(unsigned char *p, const float *f, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &f[i], 4);
        ckpt_put32(p + 4 * i, b);
    }
}

static void ckpt_get_floats(float *f, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t b = ckpt_get32(p + 4 * i);
        memcpy(&f[i], &b, 4);
    }
}

/* The libfiu points (dsim/fiu.h): a point that fires stands for its system
 * call failing with errno set, so an injected failure takes the path, and
 * gets the message, of a real one. */
static int ckpt_fiu(const char *name)
{
    if (!DSIM_FIU(name))
        return 0;
    errno = DSIM_FIU_INFO(EIO);
    return 1;
}

static dsim_err ckpt_write_all(int fd, const unsigned char *p, size_t n, const char *tmp)
{
    while (n > 0) {
        ssize_t w = ckpt_fiu("dsim/ckpt/write") ? -1 : write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return DSIM_ERR(DSIM_EIO, -1, "checkpoint: writing %s failed: %s", tmp,
                            strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return DSIM_OK;
}

dsim_err dsim_checkpoint_write(const char *path, const dsim_checkpoint *ck)
{
    if (!path || !*path || !ck)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_checkpoint_write: path and checkpoint are needed");
    if (ck->n_params == 0 || !ck->params || (ck->optim_state_len && !ck->optim_state) ||
        ck->n_params > CKPT_MAX_FLOATS || ck->optim_state_len > CKPT_MAX_FLOATS)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_checkpoint_write(%s): %zu parameters and %zu optimizer floats "
                        "(parameters must be 1..2^32 and present)",
                        path, ck->n_params, ck->optim_state_len);
    size_t floats = ck->n_params + ck->optim_state_len;
    size_t len = CKPT_HEADER + 4 * floats + 8;
    unsigned char *buf = malloc(len);
    if (!buf)
        return DSIM_ERR(DSIM_ENOMEM, -1, "checkpoint %s: out of memory for %zu bytes", path, len);
    memcpy(buf, ckpt_magic, 8);
    ckpt_put32(buf + 8, CKPT_VERSION);
    ckpt_put32(buf + 12, (uint32_t)ck->optim_kind);
    ckpt_put32(buf + 16, ck->epoch);
    ckpt_put32(buf + 20, (ck->shuffle ? CKPT_SHUFFLE : 0) | (ck->drop_remainder ? CKPT_DROP : 0));
    ckpt_put64(buf + 24, ck->step);
    ckpt_put64(buf + 32, ck->global_step);
    ckpt_put64(buf + 40, ck->n_params);
    ckpt_put64(buf + 48, ck->optim_step);
    ckpt_put64(buf + 56, ck->optim_state_len);
    ckpt_put64(buf + 64, (uint64_t)ck->global_batch);
    ckpt_put32(buf + 72, ck->hosts);
    ckpt_put32(buf + 76, ck->devices_per_host);
    ckpt_put32(buf + 80, (uint32_t)ck->shard);
    ckpt_put32(buf + 84, ck->n_files);
    ckpt_put64(buf + 88, ck->n_examples);
    ckpt_put64(buf + 96, ck->seed);
    ckpt_put64(buf + 104, ck->steps_per_epoch);
    ckpt_put32(buf + 112, ck->epochs);
    uint32_t lsb = 0;
    if (ck->has_loss_scale)
        memcpy(&lsb, &ck->loss_scale, 4);
    ckpt_put32(buf + 116, lsb);
    ckpt_put32(buf + 120, ck->has_loss_scale ? ck->loss_scale_counter : 0);
    ckpt_put32(buf + 124, ck->has_loss_scale ? 1 : 0);
    ckpt_put_floats(buf + CKPT_HEADER, ck->params, ck->n_params);
    if (ck->optim_state_len)
        ckpt_put_floats(buf + CKPT_HEADER + 4 * ck->n_params, ck->optim_state, ck->optim_state_len);
    ckpt_put64(buf + len - 8, ckpt_fnv(CKPT_FNV_INIT, buf, len - 8));

    size_t tl = strlen(path) + 5;
    char *tmp = malloc(tl);
    char *dircopy = strdup(path);
    if (!tmp || !dircopy) {
        free(buf);
        free(tmp);
        free(dircopy);
        return DSIM_ERR(DSIM_ENOMEM, -1, "checkpoint %s: out of memory", path);
    }
    snprintf(tmp, tl, "%s.tmp", path);
    dsim_err e = DSIM_OK;
    int fd =
        ckpt_fiu("dsim/ckpt/open") ? -1 : open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int err = errno;
        e = DSIM_ERR(DSIM_EIO, -1, "checkpoint: cannot create %s: %s%s", tmp, strerror(err),
                     err == ENOENT ? " (does the directory exist?)" : "");
        goto out;
    }
    e = ckpt_write_all(fd, buf, len, tmp);
    if (e == DSIM_OK && (ckpt_fiu("dsim/ckpt/fsync") || fsync(fd) != 0))
        e = DSIM_ERR(DSIM_EIO, -1, "checkpoint: fsync of %s failed: %s", tmp, strerror(errno));
    if (close(fd) != 0 && e == DSIM_OK)
        e = DSIM_ERR(DSIM_EIO, -1, "checkpoint: closing %s failed: %s", tmp, strerror(errno));
    if (e == DSIM_OK && (ckpt_fiu("dsim/ckpt/rename") || rename(tmp, path) != 0))
        e = DSIM_ERR(DSIM_EIO, -1, "checkpoint: renaming %s to %s failed: %s", tmp, path,
                     strerror(errno));
    if (e != DSIM_OK) {
        unlink(tmp);
        goto out;
    }
    /* The rename is durable only once the directory is. */
    int dfd = open(dirname(dircopy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
out:
    free(buf);
    free(tmp);
    free(dircopy);
    return e;
}

void dsim_checkpoint_free(dsim_checkpoint *ck)
{
    if (!ck)
        return;
    free(ck->params);
    free(ck->optim_state);
    free(ck);
}

dsim_err dsim_checkpoint_read(const char *path, dsim_checkpoint **out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_checkpoint_read: out is NULL");
    *out = NULL;
    if (!path || !*path)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_checkpoint_read: no path given");
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT)
            return DSIM_ERR(DSIM_ENOENT, -1, "checkpoint %s does not exist", path);
        return DSIM_ERR(DSIM_EIO, -1, "checkpoint %s cannot be opened: %s", path, strerror(errno));
    }
    unsigned char *buf = NULL;
    dsim_checkpoint *ck = NULL;
    dsim_err e = DSIM_OK;
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        e = DSIM_ERR(DSIM_EIO, -1, "checkpoint %s: stat failed: %s", path, strerror(errno));
        goto out;
    }
    size_t len = (size_t)st.st_size;
    if (len < CKPT_HEADER_V1 + 8) {
        e = DSIM_ERR(DSIM_EPROTO, -1,
                     "checkpoint %s is corrupt: %zu bytes, shorter than the %u-byte header and "
                     "checksum; delete it or restore from an older copy",
                     path, len, CKPT_HEADER_V1 + 8);
        goto out;
    }
    buf = malloc(len);
    if (!buf) {
        e = DSIM_ERR(DSIM_ENOMEM, -1, "checkpoint %s: out of memory for %zu bytes", path, len);
        goto out;
    }
    if (fread(buf, 1, len, f) != len) {
        e = DSIM_ERR(DSIM_EIO, -1, "checkpoint %s: read failed", path);
        goto out;
    }
    if (memcmp(buf, ckpt_magic, 8) != 0) {
        e = DSIM_ERR(DSIM_EPROTO, -1, "checkpoint %s is corrupt: bad magic (not a dsim checkpoint)",
                     path);
        goto out;
    }
    uint32_t version = ckpt_get32(buf + 8);
    if (version != 1 && version != CKPT_VERSION) {
        e = DSIM_ERR(DSIM_EPROTO, -1,
                     "checkpoint %s has format version %u; this dsim reads versions 1 and %u", path,
                     version, CKPT_VERSION);
        goto out;
    }
    uint32_t hdr = version == 1 ? CKPT_HEADER_V1 : CKPT_HEADER;
    uint64_t n = ckpt_get64(buf + 40), sl = ckpt_get64(buf + 56);
    if (n == 0 || n > CKPT_MAX_FLOATS || sl > CKPT_MAX_FLOATS ||
        (uint64_t)len != hdr + 4 * (n + sl) + 8) {
        e = DSIM_ERR(DSIM_EPROTO, -1,
                     "checkpoint %s is corrupt: its header says %llu parameters and %llu "
                     "optimizer floats but the file has %zu bytes (truncated?)",
                     path, (unsigned long long)n, (unsigned long long)sl, len);
        goto out;
    }
    uint64_t want = ckpt_get64(buf + len - 8), got = ckpt_fnv(CKPT_FNV_INIT, buf, len - 8);
    if (want != got) {
        e = DSIM_ERR(DSIM_EPROTO, -1,
                     "checkpoint %s is corrupt: checksum %016llx, expected %016llx; delete it or "
                     "restore from an older copy",
                     path, (unsigned long long)got, (unsigned long long)want);
        goto out;
    }
    uint32_t kind = ckpt_get32(buf + 12);
    if (kind >= DSIM_OPTIM_KIND_COUNT) {
        e = DSIM_ERR(DSIM_EPROTO, -1, "checkpoint %s: unknown optimizer kind %u", path, kind);
        goto out;
    }
    ck = calloc(1, sizeof *ck);
    if (ck) {
        ck->params = malloc(4 * (size_t)n);
        ck->optim_state = sl ? malloc(4 * (size_t)sl) : NULL;
    }
    if (!ck || !ck->params || (sl && !ck->optim_state)) {
        dsim_checkpoint_free(ck);
        ck = NULL;
        e = DSIM_ERR(DSIM_ENOMEM, -1, "checkpoint %s: out of memory", path);
        goto out;
    }
    ck->version = version;
    ck->optim_kind = (dsim_optim_kind)kind;
    if (version >= 2) {
        uint32_t flags = ckpt_get32(buf + 20);
        ck->shuffle = (flags & CKPT_SHUFFLE) != 0;
        ck->drop_remainder = (flags & CKPT_DROP) != 0;
        ck->global_batch = (int64_t)ckpt_get64(buf + 64);
        ck->hosts = ckpt_get32(buf + 72);
        ck->devices_per_host = ckpt_get32(buf + 76);
        ck->shard = (dsim_shard_policy)ckpt_get32(buf + 80);
        ck->n_files = ckpt_get32(buf + 84);
        ck->n_examples = ckpt_get64(buf + 88);
        ck->seed = ckpt_get64(buf + 96);
        ck->steps_per_epoch = ckpt_get64(buf + 104);
        ck->epochs = ckpt_get32(buf + 112);
        ck->has_loss_scale = ckpt_get32(buf + 124) == 1;
        if (ck->has_loss_scale) {
            uint32_t lsb = ckpt_get32(buf + 116);
            memcpy(&ck->loss_scale, &lsb, 4);
            ck->loss_scale_counter = ckpt_get32(buf + 120);
            if (!(ck->loss_scale > 0) || ck->loss_scale > 3.4e38f) {
                e = DSIM_ERR(DSIM_EPROTO, -1,
                             "checkpoint %s is corrupt: its loss scale is %g (a positive finite "
                             "float is kept); delete it or restore from an older copy",
                             path, (double)ck->loss_scale);
                dsim_checkpoint_free(ck);
                ck = NULL;
                goto out;
            }
        }
    }
    ck->epoch = ckpt_get32(buf + 16);
    ck->step = ckpt_get64(buf + 24);
    ck->global_step = ckpt_get64(buf + 32);
    ck->n_params = (size_t)n;
    ck->optim_step = ckpt_get64(buf + 48);
    ck->optim_state_len = (size_t)sl;
    ckpt_get_floats(ck->params, buf + hdr, ck->n_params);
    if (sl)
        ckpt_get_floats(ck->optim_state, buf + hdr + 4 * ck->n_params, ck->optim_state_len);
    *out = ck;
out:
    free(buf);
    fclose(f);
    return e;
}
