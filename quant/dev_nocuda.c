/* dev_nocuda.c — the device backend of quant/ in a build without CUDA: there is no device
 * memory to work on, so every device call reports -WB_E_NOGPU (the public API still runs the
 * CPU reference on host memory), and NVIDIA's reference conversion is absent (-ENOTSUP). */
#include "quant/quant_int.h"

#include <errno.h>

int qt_dev_pass(const struct wb_quant_pass *p, void *stream, unsigned threads)
{
    (void)p, (void)stream, (void)threads;
    return -WB_E_NOGPU;
}

int qt_dev_copy(const struct wb_quant_copy *c, void *stream)
{
    (void)c, (void)stream;
    return -WB_E_NOGPU;
}

int qt_dev_cast(enum wb_dtype from, const void *src, enum wb_dtype to, void *dst, uint64_t n,
                void *stream)
{
    (void)from, (void)src, (void)to, (void)dst, (void)n, (void)stream;
    return -WB_E_NOGPU;
}

int qt_dev_batch_create(const struct wb_quant_item *q, size_t nq, const struct wb_copy_item *c,
                        size_t nc, struct wb_quant_dev_batch **out)
{
    (void)q, (void)nq, (void)c, (void)nc, (void)out;
    return -WB_E_NOGPU;
}

int qt_dev_batch_run(struct wb_quant_dev_batch *b, void *stream, bool delta, uint64_t *stored)
{
    (void)b, (void)stream, (void)delta, (void)stored;
    return -WB_E_NOGPU;
}

void qt_dev_batch_free(struct wb_quant_dev_batch *b)
{
    (void)b;
}

int wb_quant_gpu_alloc(size_t bytes, void **out)
{
    (void)bytes, (void)out;
    return -WB_E_NOGPU;
}

void wb_quant_gpu_free(void *p)
{
    (void)p;
}

int wb_quant_gpu_copy(void *dst, const void *src, size_t bytes, void *stream)
{
    (void)dst, (void)src, (void)bytes, (void)stream;
    return -WB_E_NOGPU;
}

int wb_quant_gpu_sync(void *stream)
{
    (void)stream;
    return -WB_E_NOGPU;
}

int qt_nvref_e4m3(float x, uint8_t *out)
{
    (void)x, (void)out;
    return -ENOTSUP;
}
