/* fabric_nocuda.c — the bounce/staging hooks of the libfabric backend in a build without CUDA:
 * there is no device memory, so every copy is a host copy done at once. Used for stage_host
 * (the staging path on host memory). Twin of fabric_cuda.c. */
#include "transport/fabric/fabric.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

bool fab_gpu_available(void)
{
    return false;
}

int fab_gpu_open(int device, struct fab_gpu **out)
{
    (void)device;
    (void)out;
    return -WB_E_NOGPU;
}

void fab_gpu_close(struct fab_gpu *g)
{
    (void)g;
}

int fab_gpu_host_alloc(size_t len, bool pinned, void **out)
{
    (void)pinned;
    void *p = NULL;
    if (posix_memalign(&p, 4096, len) != 0)
        return -ENOMEM;
    *out = p;
    return 0;
}

void fab_gpu_host_free(void *p, bool pinned)
{
    (void)pinned;
    free(p);
}

int fab_gpu_copy(struct fab_gpu *g, int stream, void *dst, const void *src, size_t len, void **ev,
                 int *native)
{
    (void)g;
    (void)stream;
    (void)native;
    memcpy(dst, src, len);
    *ev = NULL;
    return 0;
}

int fab_gpu_done(struct fab_gpu *g, void *ev, int *native)
{
    (void)g;
    (void)ev;
    (void)native;
    return 1;
}
