/* txmem_nocuda.c — the memory helpers of transport.h in a build without CUDA: host memory only;
 * asking for device memory is -WB_E_NOGPU. Twin of txmem_cuda.c. */
#include "transport/transport.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int wb_tx_mem_alloc(enum wb_tx_mem kind, int device, size_t len, void **out)
{
    (void)device;
    if (kind != WB_TX_MEM_HOST)
        return -WB_E_NOGPU;
    void *p = NULL;
    if (posix_memalign(&p, 4096, len ? len : 1) != 0)
        return -ENOMEM;
    *out = p;
    return 0;
}

void wb_tx_mem_free(enum wb_tx_mem kind, void *p)
{
    (void)kind;
    free(p);
}

int wb_tx_mem_copy(void *dst, const void *src, size_t len)
{
    memmove(dst, src, len);
    return 0;
}

int wb_tx_mem_copy_reps(void *dst, const void *src, size_t len, size_t reps)
{
    for (size_t i = 0; i < reps; i++)
        memcpy(dst, src, len);
    return 0;
}
