/* gpu_nocuda.c — the agent's CUDA helpers in a build without CUDA: every device call says
 * -WB_E_NOGPU, pinned host memory is plain host memory. See gpu.cu. */
#include "agent/xfer.h"

#include <errno.h>
#include <stdlib.h>

int ag_gpu_use(int device)
{
    (void)device;
    return -WB_E_NOGPU;
}

int ag_gpu_addr_range(const void *p, uintptr_t *base, uint64_t *size)
{
    (void)p;
    (void)base;
    (void)size;
    return -WB_E_NOGPU;
}

int ag_stream_create(void **out)
{
    (void)out;
    return -WB_E_NOGPU;
}

void ag_stream_destroy(void *s)
{
    (void)s;
}

int ag_event_record(void *stream, void **out)
{
    (void)stream;
    (void)out;
    return -WB_E_NOGPU;
}

int ag_event_done(void *ev)
{
    (void)ev;
    return -WB_E_NOGPU;
}

void ag_event_destroy(void *ev)
{
    (void)ev;
}

int ag_stream_order(void *from, void *to)
{
    (void)from;
    (void)to;
    return -WB_E_NOGPU;
}

int ag_stream_sync(void *stream)
{
    (void)stream;
    return -WB_E_NOGPU;
}

int ag_permute_async(void *dst, const void *src, size_t elem, uint32_t ndim, const uint64_t *ext,
                     uint32_t perm, void *stream)
{
    (void)dst;
    (void)src;
    (void)elem;
    (void)ndim;
    (void)ext;
    (void)perm;
    (void)stream;
    return -WB_E_NOGPU;
}

int ag_box_move_async(float *b_arr, const struct wb_box *b, const float *a_arr,
                      const struct wb_box *a, const struct wb_box *in, int merge, void *stream)
{
    (void)b_arr;
    (void)b;
    (void)a_arr;
    (void)a;
    (void)in;
    (void)merge;
    (void)stream;
    return -WB_E_NOGPU;
}

int ag_copy_async(void *dst, const void *src, size_t n, void *stream)
{
    (void)dst;
    (void)src;
    (void)n;
    (void)stream;
    return -WB_E_NOGPU;
}

int ag_memset_async(void *dst, int v, size_t n, void *stream)
{
    (void)dst;
    (void)v;
    (void)n;
    (void)stream;
    return -WB_E_NOGPU;
}

int ag_amax_merge_async(float *acc, const float *part, size_t n, void *stream)
{
    (void)acc;
    (void)part;
    (void)n;
    (void)stream;
    return -WB_E_NOGPU;
}

int ag_host_alloc(size_t n, void **out)
{
    void *p = calloc(1, n ? n : 1);
    if (!p)
        return -ENOMEM;
    *out = p;
    return 0;
}

void ag_host_free(void *p)
{
    free(p);
}
