/* cudaipc_nocuda.c — the CUDA IPC backend in a build without CUDA: opening it explains why it
 * cannot work. (The mailbox, mbox.c, is built either way.) Twin of cudaipc_cuda.c. */
#include "transport/tx_priv.h"

#include <errno.h>

int txi_cudaipc_open(const struct wb_tx_cfg *cfg, struct wb_errlist *el, struct wb_tx **out)
{
    (void)cfg;
    (void)out;
    wb_errlist_add(el, "transport.backend: cudaipc needs a CUDA build (this one has CUDA=0)");
    return -ENOTSUP;
}
