/* inproc: every rank lives in this address space (threads and sim engines).
 *
 * A frame is handed straight to the receiving endpoint's receive path.
 * Small messages (<= eager_max, default 64 KiB) are eager: the payload is
 * copied (into a posted receive if there is one, else into a buffer) and the
 * send finishes at once. Larger ones are rendezvous: the receive path keeps
 * a reference to the sender's buffer and the receiver copies or reduces
 * straight out of it, finishing the send afterwards; if the receive was
 * posted first, the sender copies straight into it. Either way a large
 * message's bytes are moved exactly once.
 *
 * Options: eager_max=BYTES (k/m/g suffixes). */
#include <string.h>

#include "dsim/spi/transport.h"

#define INPROC_EAGER_MAX_DEFAULT ((size_t)64 << 10)

typedef struct inproc_fabric {
    size_t eager_max;
} inproc_fabric;

static dsim_err inproc_fabric_open(dsim_fabric *f, const char *options)
{
    inproc_fabric *p = dsim_tp_fabric_priv(f);
    p->eager_max = INPROC_EAGER_MAX_DEFAULT;
    const char *cur = options;
    char key[32], val[64];
    int rc;
    while ((rc = dsim_tp_opt_next("inproc", &cur, key, sizeof key, val, sizeof val)) > 0) {
        if (strcmp(key, "eager_max") == 0)
            DSIM_CHECK(dsim_tp_opt_size("inproc", key, val, &p->eager_max));
        else
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "unknown inproc option '%s'; the known option is eager_max=BYTES", key);
    }
    return rc < 0 ? DSIM_EINVAL : DSIM_OK;
}

static void inproc_fabric_close(dsim_fabric *f)
{
    (void)f; /* nothing beyond the shared layer's state */
}

static dsim_err inproc_ep_open(dsim_ep *ep)
{
    (void)ep; /* reachable as soon as the shared layer has it */
    return DSIM_OK;
}

static void inproc_ep_close(dsim_ep *ep)
{
    (void)ep;
}

static dsim_err inproc_send(dsim_ep *ep, int to, const dsim_tp_hdr *hdr, const void *payload,
                            size_t len, dsim_req *req)
{
    dsim_fabric *f = dsim_tp_ep_fabric(ep);
    const inproc_fabric *p = dsim_tp_fabric_priv(f);
    return dsim_tp_hand_over(f, to, hdr, payload, len, p->eager_max, req);
}

const struct dsim_tp_ops dsim_tp_inproc_ops = {
    .size = sizeof(struct dsim_tp_ops),
    .name = "inproc",
    .fabric_priv_size = sizeof(inproc_fabric),
    .ep_priv_size = 0,
    .req_priv_size = 0,
    .fabric_open = inproc_fabric_open,
    .fabric_close = inproc_fabric_close,
    .ep_open = inproc_ep_open,
    .ep_close = inproc_ep_close,
    .send = inproc_send,
    .cancel_send = NULL, /* sends are never held by the backend */
    .abort = NULL,       /* one address space: the local revoke reaches everyone */
};
