/* synth.c — the synthetic parameter source and the launcher-environment reader.
 *
 * A synthetic value depends only on (tensor name, seed, version, global element index), so a
 * trainer rank holding any shard, a test computing the expected rollout bytes, and a rollout
 * checking what landed all agree without exchanging anything. A counter-based hash
 * (splitmix64) gives that; a stateful generator would make values depend on iteration order. */
#include "agent/agent.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

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
    return splitmix64(h ^ splitmix64(seed ^ splitmix64(version)));
}

static float value_at(uint64_t key, float scale, uint64_t index)
{
    uint64_t u = splitmix64(key + index);
    /* 24 random bits -> [-1, 1) exactly representable in FP32 */
    float x = (float)(int32_t)((u >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
    return x * scale;
}

float wb_synth_value(const char *name, uint64_t seed, uint64_t version, uint64_t index)
{
    float scale;
    uint64_t key = stream_key(name, seed, version, &scale);
    return value_at(key, scale, index);
}

uint16_t wb_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet and NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float wb_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t wb_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (abs >= 0x477ff000u) /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) { /* subnormal half (or zero): scale to 2^-24 units, round even */
        float a;
        memcpy(&a, &abs, 4);
        float q = a * 16777216.0f; /* exact: power-of-two scaling */
        uint32_t n = (uint32_t)nearbyintf(q);
        return (uint16_t)(sign | n);
    }
    uint32_t mant = abs & 0x7fffffu;
    uint32_t exp = (abs >> 23) - 127 + 15;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

float wb_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
    float f;
    if (exp == 0) {
        f = ldexpf((float)mant, -24);
        return sign ? -f : f;
    }
    uint32_t u = exp == 31 ? sign | 0x7f800000u | (mant << 13)
                           : sign | ((exp - 15 + 127) << 23) | (mant << 13);
    memcpy(&f, &u, 4);
    return f;
}

int wb_synth_fill(const char *name, uint64_t seed, uint64_t version, enum wb_dtype dtype,
                  const struct wb_shape *shape, const struct wb_box *box, void *dst)
{
    if (dtype != WB_DTYPE_BF16 && dtype != WB_DTYPE_FP16 && dtype != WB_DTYPE_FP32)
        return -EINVAL;
    if (!wb_box_within(shape, box))
        return -EINVAL;
    float scale;
    uint64_t key = stream_key(name, seed, version, &scale);
    uint64_t n = wb_box_numel(box);
    uint32_t nd = box->ndim;
    uint64_t idx[WB_MAX_DIMS] = {0};
    for (uint64_t k = 0; k < n; k++) {
        uint64_t lin = 0;
        for (uint32_t d = 0; d < nd; d++)
            lin = lin * shape->dim[d] + box->off[d] + idx[d];
        float v = value_at(key, scale, lin);
        if (dtype == WB_DTYPE_FP32)
            ((float *)dst)[k] = v;
        else if (dtype == WB_DTYPE_BF16)
            ((uint16_t *)dst)[k] = wb_f32_to_bf16(v);
        else
            ((uint16_t *)dst)[k] = wb_f32_to_f16(v);
        for (uint32_t d = nd; d-- > 0;) { /* odometer over the box */
            if (++idx[d] < box->ext[d])
                break;
            idx[d] = 0;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- launcher environment */

static int env_int(const char *var, int64_t *out, const char **bad)
{
    const char *s = getenv(var);
    int64_t v;
    if (!s || !*s) {
        *out = -1;
        return 0;
    }
    if (wb_parse_i64(s, &v) || v < 0) {
        *bad = var;
        return -EINVAL;
    }
    *out = v;
    return 0;
}

int wb_launch_env_read(struct wb_launch_env *out, const char **bad)
{
    struct wb_launch_env e = {.rank = -1, .local_rank = -1, .world = -1, .source = "none"};
    const char *b = NULL;
    int err;
    if (getenv("RANK")) {
        e.source = "torchrun";
        err = env_int("RANK", &e.rank, &b);
        err = err ? err : env_int("LOCAL_RANK", &e.local_rank, &b);
        err = err ? err : env_int("WORLD_SIZE", &e.world, &b);
    } else if (getenv("SLURM_PROCID")) {
        e.source = "slurm";
        err = env_int("SLURM_PROCID", &e.rank, &b);
        err = err ? err : env_int("SLURM_LOCALID", &e.local_rank, &b);
        err = err ? err : env_int("SLURM_NTASKS", &e.world, &b);
    } else {
        err = 0;
    }
    if (err) {
        if (bad)
            *bad = b;
        return err;
    }
    *out = e;
    return 0;
}
