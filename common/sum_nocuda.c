/* sum_nocuda.c — wb_sum64's GPU batch in a build without CUDA: there is no device memory. */
#include "common/common.h"

int wb_sum_gpu_new(struct wb_sum_gpu **out)
{
    (void)out;
    return -WB_E_NOGPU;
}

void wb_sum_gpu_free(struct wb_sum_gpu *g)
{
    (void)g;
}

int wb_sum_gpu_launch(struct wb_sum_gpu *g, const struct wb_sum_piece *pieces, size_t n,
                      void *stream)
{
    (void)g, (void)pieces, (void)n, (void)stream;
    return -WB_E_NOGPU;
}

uint64_t wb_sum_gpu_result(const struct wb_sum_gpu *g, size_t i)
{
    (void)g, (void)i;
    return 0;
}

int wb_sum_gpu_run(struct wb_sum_gpu *g, const struct wb_sum_piece *pieces, size_t n, void *stream,
                   uint64_t *sums)
{
    (void)g, (void)pieces, (void)n, (void)stream, (void)sums;
    return -WB_E_NOGPU;
}
