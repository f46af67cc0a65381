/* synth.c — the synthetic parameter source (the demo's, the tests' and the benchmarks' weights).
 *
 * A synthetic value depends only on (tensor name, seed, version, global element index), so a
 * trainer rank holding any shard, a test computing the expected rollout bytes, and a rollout
 * checking what landed all agree without exchanging anything. A counter-based hash
 * (splitmix64) gives that; a stateful generator would make values depend on iteration order.
 * The element function is in fpbits.h, shared with the CUDA kernel of wb_synth_fill_async
 * (synth.cu), so GPU-filled memory holds the very bytes the CPU reference computes. */
#include "common/common.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t name_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* Per (name, seed, version): the stream key and the magnitude. */
static uint64_t stream_key(const char *name, uint64_t seed, uint64_t version, float *scale)
{
    uint64_t h = name_hash(name);
    *scale = ldexpf(1.0f, (int)(h >> 60) % 9 - 6); /* 2^-6 .. 2^2 */
    return wb_splitmix64(h ^ wb_splitmix64(seed ^ wb_splitmix64(version)));
}

float wb_synth_value(const char *name, uint64_t seed, uint64_t version, uint64_t index)
{
    float scale;
    uint64_t key = stream_key(name, seed, version, &scale);
    return wb_synth_at(key, scale, index);
}

/* The arguments' check and the stream of a fill (CPU or GPU). */
static int fill_stream(const char *name, uint64_t seed, uint64_t version, enum wb_dtype dtype,
                       const struct wb_shape *shape, const struct wb_box *box, uint64_t *key,
                       float *scale)
{
    if (dtype != WB_DTYPE_BF16 && dtype != WB_DTYPE_FP16 && dtype != WB_DTYPE_FP32)
        return -EINVAL;
    if (!wb_box_within(shape, box))
        return -EINVAL;
    *key = stream_key(name, seed, version, scale);
    return 0;
}

/* Slowly changing values (wb_synth_fill_change): element `index` takes generation
 * g = (version + phase) / period, phase a hash of the index below period, so from one version to
 * the next exactly the elements whose phase comes round (1 / period of them, spread evenly)
 * draw new values. Its value is the stream of g's element, at the magnitude runs of the
 * version-free stream: the runs, and so most FP8 block scales, stay put as a trained model's
 * do. */
static float changing_at(uint64_t h, uint64_t seed, uint64_t version, uint64_t period,
                         uint64_t key0, float scale, uint64_t index)
{
    uint64_t phase = wb_splitmix64(key0 ^ wb_splitmix64(index)) % period;
    uint64_t g = (version + phase) / period;
    uint64_t kg = wb_splitmix64(h ^ wb_splitmix64(seed ^ wb_splitmix64(g))); /* stream_key's */
    uint64_t u = wb_splitmix64(kg + index);
    float x = (float)(int32_t)((u >> 40) & 0xffffff) * (1.0f / 8388608.0f) - 1.0f;
    uint32_t run = (uint32_t)(((key0 ^ (index >> 14)) * 0x9e3779b97f4a7c15ull) >> 62);
    return x * scale * (1.0f / (float)(1u << run));
}

int wb_synth_fill(const char *name, uint64_t seed, uint64_t version, enum wb_dtype dtype,
                  const struct wb_shape *shape, const struct wb_box *box, void *dst)
{
    return wb_synth_fill_change(name, seed, version, 0, dtype, shape, box, dst);
}

int wb_synth_fill_change(const char *name, uint64_t seed, uint64_t version, uint64_t period,
                         enum wb_dtype dtype, const struct wb_shape *shape,
                         const struct wb_box *box, void *dst)
{
    float scale;
    uint64_t key;
    int rc = fill_stream(name, seed, version, dtype, shape, box, &key, &scale);
    if (rc)
        return rc;
    uint64_t h = name_hash(name), key0 = period ? stream_key(name, seed, 0, &scale) : 0;
    uint64_t n = wb_box_numel(box);
    uint32_t nd = box->ndim;
    uint64_t idx[WB_MAX_DIMS] = {0};
    for (uint64_t k = 0; k < n; k++) {
        uint64_t lin = 0;
        for (uint32_t d = 0; d < nd; d++)
            lin = lin * shape->dim[d] + box->off[d] + idx[d];
        float v = period ? changing_at(h, seed, version, period, key0, scale, lin)
                         : wb_synth_at(key, scale, lin);
        if (dtype == WB_DTYPE_FP32)
            ((float *)dst)[k] = v;
        else if (dtype == WB_DTYPE_BF16)
            ((uint16_t *)dst)[k] = wb_f32_to_bf16(v);
        else
            ((uint16_t *)dst)[k] = wb_f32_to_fp16(v);
        for (uint32_t d = nd; d-- > 0;) { /* odometer over the box */
            if (++idx[d] < box->ext[d])
                break;
            idx[d] = 0;
        }
    }
    return 0;
}

int wb_synth_fill_async(const char *name, uint64_t seed, uint64_t version, enum wb_dtype dtype,
                        const struct wb_shape *shape, const struct wb_box *box, void *dst,
                        void *stream)
{
    float scale;
    uint64_t key;
    int rc = fill_stream(name, seed, version, dtype, shape, box, &key, &scale);
    return rc ? rc : cm_synth_launch(key, scale, dtype, shape, box, dst, stream);
}

int wb_synth_fill_args(const char *name, uint64_t seed, uint64_t version, const char *dtype,
                       uint32_t ndim, const uint64_t *shape, const uint64_t *box_off,
                       const uint64_t *box_ext, void *dst)
{
    enum wb_dtype dt;
    if (!dtype || wb_dtype_parse(dtype, &dt) || ndim == 0 || ndim > WB_MAX_DIMS)
        return -EINVAL;
    struct wb_shape s = {.ndim = ndim};
    struct wb_box b = {.ndim = ndim};
    for (uint32_t d = 0; d < ndim; d++) {
        s.dim[d] = shape[d];
        b.off[d] = box_off[d];
        b.ext[d] = box_ext[d];
    }
    return wb_synth_fill(name, seed, version, dt, &s, &b, dst);
}
