/* synth_nocuda.c — wb_synth_fill_async in a build without CUDA: there is no device memory. */
#include "common/common.h"

int cm_synth_launch(uint64_t key, float scale, enum wb_dtype dtype, const struct wb_shape *shape,
                    const struct wb_box *box, void *dst, void *stream)
{
    (void)key, (void)scale, (void)dtype, (void)shape, (void)box, (void)dst, (void)stream;
    return -WB_E_NOGPU;
}
