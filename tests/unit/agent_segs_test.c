/* agent_segs_test.c — how an endpoint groups its registered tensors into the memory it registers
 * with the transport (agent/regs.c, ag_segs_group), without a GPU: device pointers here are
 * addresses handed out by a model of PyTorch's CUDA caching allocator over a model of the
 * driver's cudaMalloc, and the driver's cuMemGetAddressRange is answered from that model.
 *
 * What must hold: a GPU segment is exactly one driver allocation, however the allocations lie in
 * the address space. A peer reaches a rollout's GPU memory through the registration of the
 * segment a tensor lies in — with CUDA IPC, by opening the IPC handle of the allocation the
 * segment starts in, which maps that allocation and nothing after it — and writes at the
 * tensor's offset in the segment. Issue #35 (FSDP2 over two GPUs, a Qwen3 rollout on GPU 1):
 * the caching allocator puts layers 1-3's linear weights in four allocations of their own; where
 * the driver placed those right after layer 0's, the old grouping merged the five into one
 * segment exported by layer 0's allocation, and the trainers' writes to layers 1-3 went past
 * the mapping they had opened — into whatever their own process had there — while every
 * version reported complete. Host memory (numpy arrays, pinned buffers) is one address space:
 * touching pages still merge into one registration. */
#include "agent/priv.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#define MIB (1024ull * 1024)

/* ---------------------------------------------------------------- the GPU model */

struct alloc { /* one cudaMalloc */
    uintptr_t base;
    uint64_t size;
};

struct block { /* a caching-allocator block inside an allocation */
    uintptr_t addr;
    uint64_t size;
    bool free, small;
};

struct gpu {
    struct alloc a[64];
    uint32_t na;
    struct block b[256];
    uint32_t nb;
    uintptr_t next;  /* where the driver places the next allocation */
    uint32_t apart;  /* the first `apart` allocations each lie apart from what follows */
    bool fail_range; /* cuMemGetAddressRange fails */
};

static void gpu_init(struct gpu *g, uint32_t apart)
{
    memset(g, 0, sizeof(*g));
    g->next = (uintptr_t)0x7f3a00000000ull;
    g->apart = apart;
}

/* cudaMalloc: 2 MiB-aligned sizes, placed one after the other (or apart, see gpu.apart). */
static uintptr_t driver_malloc(struct gpu *g, uint64_t size)
{
    CHECK(g->na < 64);
    uintptr_t base = g->next;
    g->a[g->na] = (struct alloc){base, size};
    g->next = base + size + (g->na < g->apart ? 64 * MIB : 0);
    g->na++;
    return base;
}

/* The index of the allocation holding p, or -1. */
static int alloc_of(const struct gpu *g, uintptr_t p)
{
    for (uint32_t i = 0; i < g->na; i++)
        if (p >= g->a[i].base && p < g->a[i].base + g->a[i].size)
            return (int)i;
    return -1;
}

/* cuMemGetAddressRange, from the model. */
static int range(void *arg, const void *p, uintptr_t *base, uint64_t *size)
{
    const struct gpu *g = arg;
    int i = g->fail_range ? -1 : alloc_of(g, (uintptr_t)p);
    if (i < 0)
        return -EINVAL;
    *base = g->a[i].base;
    *size = g->a[i].size;
    return 0;
}

/* PyTorch's CUDACachingAllocator (c10/cuda/CUDACachingAllocator.cpp) with its defaults: sizes
 * rounded up to 512 bytes; up to 1 MiB from the small pool, whose allocations are 2 MiB; larger
 * from the large pool, whose allocations are 20 MiB for requests under 10 MiB and the request
 * rounded up to 2 MiB otherwise; a request takes the smallest free block of its pool that holds
 * it (lowest address among equals) and splits off the rest when more than 1 MiB (large) or at
 * least 512 bytes (small) remains. */
static uintptr_t torch_alloc(struct gpu *g, uint64_t bytes)
{
    uint64_t size = bytes < 512 ? 512 : (bytes + 511) / 512 * 512;
    bool small = size <= MIB;
    int best = -1;
    for (uint32_t i = 0; i < g->nb; i++) {
        const struct block *b = &g->b[i];
        if (b->free && b->small == small && b->size >= size &&
            (best < 0 || b->size < g->b[best].size ||
             (b->size == g->b[best].size && b->addr < g->b[best].addr)))
            best = (int)i;
    }
    if (best < 0) {
        uint64_t seg = small             ? 2 * MIB
                       : size < 10 * MIB ? 20 * MIB
                                         : (size + 2 * MIB - 1) / (2 * MIB) * (2 * MIB);
        CHECK(g->nb < 256);
        g->b[g->nb] = (struct block){driver_malloc(g, seg), seg, true, small};
        best = (int)g->nb++;
    }
    struct block *b = &g->b[best];
    uint64_t rest = b->size - size;
    if (small ? rest >= 512 : rest > MIB) {
        CHECK(g->nb < 256);
        g->b[g->nb++] = (struct block){b->addr + size, rest, true, small};
        b->size = size;
    }
    b->free = false;
    return b->addr;
}

/* ---------------------------------------------------------------- registrations */

struct regs {
    struct reg r[128];
    uint32_t n;
};

static void add(struct regs *rs, const char *name, uint64_t rows, uint64_t cols, uintptr_t ptr,
                bool device)
{
    CHECK(rs->n < 128);
    struct reg *r = &rs->r[rs->n++];
    memset(r, 0, sizeof(*r));
    snprintf(r->t.meta.name, sizeof(r->t.meta.name), "%s", name);
    r->t.meta.dtype = WB_DTYPE_BF16;
    r->t.meta.shape = (struct wb_shape){.ndim = cols ? 2 : 1, .dim = {rows, cols}};
    r->t.meta.box = wb_box_full(&r->t.meta.shape);
    r->ptr = (void *)ptr;
    r->device = device;
}

/* A BF16 tensor of rows x cols (cols 0: 1-d) allocated through the caching allocator; `part`
 * of its rows (1: all, 2: an FSDP2 shard of two). */
static void zeros(struct gpu *g, struct regs *rs, const char *name, uint64_t rows, uint64_t cols,
                  uint64_t part)
{
    uint64_t numel = rows / part * (cols ? cols : 1);
    add(rs, name, rows / part, cols, torch_alloc(g, numel * 2), true);
}

static uint64_t bytes_of(const struct reg *r)
{
    return wb_box_numel(&r->t.meta.box) * wb_dtype_size(r->t.meta.dtype);
}

/* The rollout of issue #35: transformers' Qwen3 config of the report (hidden 1024, intermediate
 * 3072, 4 layers, 16 heads, 8 KV heads, head_dim 64, vocab 4096, untied) in vLLM's BF16 layout,
 * in the order of wb.plan()'s receive list, each tensor a torch.zeros on the rollout's GPU. */
static void issue35_rollout(struct gpu *g, struct regs *rs)
{
    const uint64_t H = 1024, I = 3072, L = 4, NH = 16, NKV = 8, HD = 64, V = 4096;
    char name[WB_NAME_MAX];
    zeros(g, rs, "model.embed_tokens.weight", V, H, 1);
    zeros(g, rs, "model.norm.weight", H, 0, 1);
    zeros(g, rs, "lm_head.weight", V, H, 1);
    static const char *const norms[] = {"input_layernorm", "post_attention_layernorm",
                                        "self_attn.q_norm", "self_attn.k_norm"};
    for (uint64_t l = 0; l < L; l++)
        for (int k = 0; k < 4; k++) {
            snprintf(name, sizeof(name), "model.layers.%llu.%s.weight", (unsigned long long)l,
                     norms[k]);
            zeros(g, rs, name, k < 2 ? H : HD, 0, 1);
        }
    for (uint64_t l = 0; l < L; l++) {
        snprintf(name, sizeof(name), "model.layers.%llu.self_attn.qkv_proj.weight",
                 (unsigned long long)l);
        zeros(g, rs, name, (NH + 2 * NKV) * HD, H, 1);
        snprintf(name, sizeof(name), "model.layers.%llu.self_attn.o_proj.weight",
                 (unsigned long long)l);
        zeros(g, rs, name, H, NH * HD, 1);
        snprintf(name, sizeof(name), "model.layers.%llu.mlp.gate_up_proj.weight",
                 (unsigned long long)l);
        zeros(g, rs, name, 2 * I, H, 1);
        snprintf(name, sizeof(name), "model.layers.%llu.mlp.down_proj.weight",
                 (unsigned long long)l);
        zeros(g, rs, name, H, I, 1);
    }
}

/* The allocation (cudaMalloc, in call order) the caching allocator puts each of
 * issue35_rollout's tensors in: 0 and 2 hold the embeddings, lm_head and layer 0, 3-6 layers 1-3
 * and nothing else (best fit packs a 20 MiB allocation with whatever fits: layer 2's o_proj goes
 * into the hole layer 1 left), 1 is the small pool's, every norm. */
static const int issue35_alloc[35] = {
    0, 1, 0,                /* embed_tokens, norm, lm_head */
    1, 1, 1, 1, 1, 1, 1, 1, /* layers 0-1's norms */
    1, 1, 1, 1, 1, 1, 1, 1, /* layers 2-3's norms */
    0, 2, 2, 2,             /* layer 0: qkv, o, gate_up, down */
    3, 3, 3, 4,             /* layer 1 */
    4, 3, 5, 4,             /* layer 2 */
    4, 6, 6, 6,             /* layer 3 */
};

/* Groups rs and checks what a peer needs: every tensor lies inside the one allocation that the
 * registration of its segment exports (the allocation the segment starts in), and a GPU segment
 * is exactly one allocation. Fails naming every tensor a peer would write outside it. */
static void check_groups(struct gpu *g, const struct regs *rs, uint32_t want_segs)
{
    struct wb_endpoint ep;
    memset(&ep, 0, sizeof(ep));
    char err[512] = "";
    int rc = ag_segs_group(rs->r, rs->n, range, g, &ep.segs, &ep.nsegs, err, sizeof(err));
    if (rc)
        wb_test_fail(__FILE__, __LINE__, "ag_segs_group: %s (%d)", err, rc);
    char bad[4096] = "";
    size_t pos = 0;
    uint32_t nbad = 0;
    for (uint32_t i = 0; i < rs->n; i++) {
        const struct reg *r = &rs->r[i];
        int k = ag_seg_of(&ep, r->ptr, bytes_of(r));
        CHECK(k >= 0);
        const struct seg *s = &ep.segs[k];
        if (!r->device)
            continue;
        int a = alloc_of(g, s->base);
        CHECK(a >= 0);
        uintptr_t p = (uintptr_t)r->ptr;
        if (p + bytes_of(r) > g->a[a].base + g->a[a].size) {
            if (nbad++ < 12) /* the first dozen by name (the report's case has 12) */
                pos += (size_t)snprintf(bad + pos, sizeof(bad) - pos,
                                        "\n        %s: offset %" PRIu64 " of a %" PRIu64
                                        "-byte segment registered through allocation %d "
                                        "(%" PRIu64 " bytes)",
                                        r->t.meta.name, (uint64_t)(p - s->base), s->len, a,
                                        g->a[a].size);
        }
    }
    if (nbad)
        wb_test_fail(__FILE__, __LINE__,
                     "%u of %u tensors lie outside the allocation their segment's registration "
                     "exports (a CUDA IPC peer writes past its mapping):%s%s",
                     nbad, rs->n, bad, nbad > 12 ? "\n        ..." : "");
    for (uint32_t k = 0; k < ep.nsegs; k++) {
        const struct seg *s = &ep.segs[k];
        if (!s->device)
            continue;
        int a = alloc_of(g, s->base);
        CHECK(a >= 0);
        CHECK_U64(s->base, g->a[a].base);
        CHECK_U64(s->len, g->a[a].size);
    }
    CHECK_INT(ep.nsegs, want_segs);
    free(ep.segs);
}

/* ---------------------------------------------------------------- tests */

/* The caching-allocator model puts the report's tensors where the report's outcome says. */
static void test_issue35_allocator_model(void)
{
    struct gpu g;
    struct regs rs = {0};
    gpu_init(&g, 0);
    issue35_rollout(&g, &rs);
    CHECK_INT(rs.n, 35);
    CHECK_INT(g.na, 7);
    static const uint64_t sizes[7] = {20 * MIB, 2 * MIB,  20 * MIB, 20 * MIB,
                                      20 * MIB, 12 * MIB, 20 * MIB};
    for (uint32_t i = 0; i < 7; i++)
        CHECK_U64(g.a[i].size, sizes[i]);
    for (uint32_t i = 0; i < rs.n; i++)
        if (alloc_of(&g, (uintptr_t)rs.r[i].ptr) != issue35_alloc[i])
            wb_test_fail(__FILE__, __LINE__, "%s: in allocation %d, expected %d",
                         rs.r[i].t.meta.name, alloc_of(&g, (uintptr_t)rs.r[i].ptr),
                         issue35_alloc[i]);
}

/* The report's layout: the embeddings' allocation and the small pool's lie apart, layer 0's and
 * the four after it back to back. Before the fix the last five merged into one segment
 * registered through layer 0's allocation, and exactly the 12 linear weights of layers 1-3 lay
 * past it — the 12 tensors the report found wrong. */
static void test_issue35_rollout_layout(void)
{
    struct gpu g;
    struct regs rs = {0};
    gpu_init(&g, 2);
    issue35_rollout(&g, &rs);
    check_groups(&g, &rs, 7);
}

/* Every allocation back to back (the driver is free to do that): still one segment each. */
static void test_touching_allocations(void)
{
    struct gpu g;
    struct regs rs = {0};
    gpu_init(&g, 0);
    issue35_rollout(&g, &rs);
    for (uint32_t i = 1; i < g.na; i++)
        CHECK_U64(g.a[i].base, g.a[i - 1].base + g.a[i - 1].size);
    check_groups(&g, &rs, 7);
}

/* A trainer rank of the report: FSDP2's local shards (half the rows of each parameter, one
 * allocation of the caching allocator each, in named_parameters() order), back to back. */
static void test_trainer_shards(void)
{
    struct gpu g;
    struct regs rs = {0};
    gpu_init(&g, 0);
    const uint64_t H = 1024, I = 3072, NH = 16, NKV = 8, HD = 64, V = 4096;
    char name[WB_NAME_MAX];
    zeros(&g, &rs, "model.embed_tokens.weight", V, H, 2);
    for (unsigned l = 0; l < 4; l++) {
        static const char *const p[] = {
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",        "self_attn.o_proj",
            "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj",           "mlp.up_proj",
            "mlp.down_proj",    "input_layernorm",  "post_attention_layernorm"};
        const uint64_t rows[] = {NH * HD, NKV * HD, NKV * HD, H, HD, HD, I, I, H, H, H};
        const uint64_t cols[] = {H, H, H, NH * HD, 0, 0, H, H, I, 0, 0};
        for (int k = 0; k < 11; k++) {
            snprintf(name, sizeof(name), "model.layers.%u.%s.weight", l, p[k]);
            zeros(&g, &rs, name, rows[k], cols[k], 2);
        }
    }
    zeros(&g, &rs, "model.norm.weight", H, 0, 2);
    zeros(&g, &rs, "lm_head.weight", V, H, 2);
    CHECK_INT(rs.n, 47);
    uint32_t used = 0; /* allocations holding a shard */
    for (uint32_t i = 0; i < g.na; i++)
        for (uint32_t j = 0; j < rs.n; j++)
            if (alloc_of(&g, (uintptr_t)rs.r[j].ptr) == (int)i) {
                used++;
                break;
            }
    CHECK(g.na > 2);
    check_groups(&g, &rs, used);
}

/* Tensors of one allocation share its segment: one registration for all of them. */
static void test_one_allocation(void)
{
    struct gpu g;
    struct regs rs = {0};
    gpu_init(&g, 0);
    uintptr_t a = torch_alloc(&g, 2 * MIB), b = torch_alloc(&g, 4 * MIB),
              c = torch_alloc(&g, 6 * MIB);
    CHECK_INT(g.na, 1);
    add(&rs, "c", 3 * MIB, 0, c, true);
    add(&rs, "a", MIB, 0, a, true);
    add(&rs, "b", 2 * MIB, 0, b, true);
    check_groups(&g, &rs, 1);
}

/* Host memory is one address space: arrays whose pages overlap or touch are one registration,
 * the others their own, each page-aligned. */
static void test_host_pages_merge(void)
{
    struct regs rs = {0};
    add(&rs, "a", 2048, 0, 0x10000, false); /* [0x10000, 0x11000) */
    add(&rs, "b", 100, 0, 0x11000, false);  /* touches a's page */
    add(&rs, "c", 10, 0, 0x11100, false);   /* the same page as b */
    add(&rs, "d", 2048, 0, 0x20010, false); /* apart: [0x20000, 0x22000) */
    add(&rs, "e", 0, 0, 0, false);          /* empty: no memory, no segment */
    struct seg *s = NULL;
    uint32_t n = 0;
    char err[256] = "";
    CHECK_INT(ag_segs_group(rs.r, rs.n, range, NULL, &s, &n, err, sizeof(err)), 0);
    CHECK_INT(n, 2);
    CHECK_U64(s[0].base, 0x10000);
    CHECK_U64(s[0].len, 0x2000);
    CHECK(!s[0].device);
    CHECK_U64(s[1].base, 0x20000);
    CHECK_U64(s[1].len, 0x2000);
    free(s);
}

/* A tensor the driver places in no allocation, or past the end of its own: exact errors. */
static void test_errors(void)
{
    struct gpu g;
    struct regs rs = {0};
    gpu_init(&g, 0);
    uintptr_t p = torch_alloc(&g, 19 * MIB);
    CHECK_INT(g.na, 1);
    CHECK_U64(g.a[0].size, 20 * MIB);
    add(&rs, "model.layers.0.mlp.down_proj.weight", 11 * MIB, 0, p, true); /* 22 MiB in 20 */
    struct seg *s = NULL;
    uint32_t n = 0;
    char err[512] = "";
    CHECK_INT(ag_segs_group(rs.r, rs.n, range, &g, &s, &n, err, sizeof(err)), -EINVAL);
    CHECK_STR(err, "model.layers.0.mlp.down_proj.weight: 23068672 bytes at 0x7f3a00000000 run "
                   "past their allocation (0x7f3a00000000, 20971520 bytes)");
    g.fail_range = true;
    rs.r[0].t.meta.shape.dim[0] = rs.r[0].t.meta.box.ext[0] = MIB;
    CHECK_INT(ag_segs_group(rs.r, rs.n, range, &g, &s, &n, err, sizeof(err)), -EINVAL);
    CHECK_STR(err, "model.layers.0.mlp.down_proj.weight: cannot find the GPU allocation it lies "
                   "in: Invalid argument");
}

const struct wb_test wb_tests[] = {
    {"issue35_allocator_model", test_issue35_allocator_model, 0},
    {"issue35_rollout_layout", test_issue35_rollout_layout, 0},
    {"touching_allocations", test_touching_allocations, 0},
    {"trainer_shards", test_trainer_shards, 0},
    {"one_allocation", test_one_allocation, 0},
    {"host_pages_merge", test_host_pages_merge, 0},
    {"errors", test_errors, 0},
    {0},
};
