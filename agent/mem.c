/* mem.c — the data side's registered memory: a buffer of the agent's memory kind, allocated and
 * registered with the transport in one step (data.c's trainer arenas and inboxes, rollout.c's
 * tensors and checksum inbox). */
#include "agent/xfer.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

int ag_reg_alloc(struct data *d, uint64_t n, unsigned access, void **buf, struct wb_tx_mr **mr,
                 const char *what, char *err, size_t errcap)
{
    int rc = wb_tx_mem_alloc(ag_mem_kind(d), d->device, n, buf);
    if (rc) {
        snprintf(err, errcap, "%s: cannot allocate %" PRIu64 " bytes: %s", what, n,
                 wb_strerror(rc));
        return rc;
    }
    if (!d->gpu)
        memset(*buf, 0, n);
    if (!mr)
        return 0;
    rc = wb_tx_mr_reg(d->tx, *buf, n, access, mr);
    if (rc) {
        snprintf(err, errcap, "%s: cannot register %" PRIu64 " bytes: %s", what, n,
                 wb_tx_errmsg(d->tx));
        wb_tx_mem_free(ag_mem_kind(d), *buf); /* the caller owns only what registered */
        *buf = NULL;
    }
    return rc;
}
