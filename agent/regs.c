/* regs.c — the tensors an endpoint registers: checked and copied when added, sent to the
 * controller in REGISTER, found again by name when the plan arrives, and grouped into the
 * allocations they lie in.
 *
 * Why allocations and not tensors: a 1T-parameter rollout holds tens of thousands of tensors,
 * and one memory registration each would cost a key per tensor at every NIC and — without
 * FI_HMEM — a pinned host mirror per tensor. The caching allocator of PyTorch places many
 * tensors in one segment (cudaMalloc'd block); registering that segment once and handing peers
 * a bounded view per tensor (wb_tx_rdesc_view) keeps both the key count and the per-tensor
 * bounds checks. */
#include "agent/gpu.h"
#include "agent/priv.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PAGE = 4096 };

int ag_regs_add(struct wb_endpoint *ep, const struct wb_tensor_reg *t, char *err, size_t errcap)
{
    const char *name = t->name ? t->name : "";
    char a[160], b[320];
    if (!*name || strlen(name) >= WB_NAME_MAX) {
        snprintf(err, errcap, "tensor name '%.40s': must be 1 to %d bytes", name, WB_NAME_MAX - 1);
        return -EINVAL;
    }
    if (ag_regs_find(ep, name)) {
        snprintf(err, errcap, "%s: registered twice", name);
        return -EEXIST;
    }
    if (!wb_dtype_size(t->dtype)) {
        snprintf(err, errcap, "%s: invalid dtype %d", name, (int)t->dtype);
        return -EINVAL;
    }
    if (t->shape.ndim == 0 || t->shape.ndim > WB_MAX_DIMS || t->box.ndim != t->shape.ndim ||
        !wb_box_within(&t->shape, &t->box)) {
        snprintf(err, errcap, "%s: box %s is not inside shape %s", name,
                 wb_box_str(&t->box, b, sizeof(b)), wb_shape_str(&t->shape, a, sizeof(a)));
        return -EINVAL;
    }
    uint64_t n = wb_box_numel(&t->box);
    if (ep->sourced && t->ptr) {
        snprintf(err, errcap,
                 "%s: a sourced trainer's tensors are read from its source: no pointer", name);
        return -EINVAL;
    }
    if (n && !t->ptr && !ep->sourced) {
        snprintf(err, errcap, "%s: no memory (NULL pointer)", name);
        return -EINVAL;
    }
    int where = n && !ep->sourced ? wb_gpu_ptr_device(t->ptr) : WB_GPU_HOST;
    if (where == WB_GPU_UNKNOWN) {
        snprintf(err, errcap, "%s: the CUDA runtime cannot say whether its memory is a GPU's",
                 name);
        return -WB_E_CUDA;
    }
    bool dev = where >= 0;
    if (n && !ep->sourced && dev != (ep->o.device >= 0)) {
        snprintf(err, errcap, "%s: %s memory, but the endpoint's tensors live in %s", name,
                 dev ? "GPU" : "host", ep->o.device >= 0 ? "GPU memory" : "host memory");
        return -EINVAL;
    }
    if (ep->nregs == ep->capregs && wb_grow(&ep->regs, &ep->capregs, 64, sizeof(*ep->regs)))
        return -ENOMEM;
    struct reg *r = &ep->regs[ep->nregs];
    memset(r, 0, sizeof(*r));
    snprintf(r->t.meta.name, sizeof(r->t.meta.name), "%s", name);
    r->t.meta.dtype = t->dtype;
    r->t.meta.shape = t->shape;
    r->t.meta.box = t->box;
    if (t->strides) {
        r->t.has_strides = true;
        memcpy(r->t.strides, t->strides, t->box.ndim * sizeof(int64_t));
    }
    if (t->placement) {
        if (!ep->mesh.ndims) {
            snprintf(err, errcap, "%s: a placement needs the mesh (wb_endpoint_set_mesh) first",
                     name);
            return -EINVAL;
        }
        r->t.nplace = ep->mesh.ndims;
        for (uint32_t d = 0; d < ep->mesh.ndims; d++) {
            int32_t p = t->placement[d];
            int64_t at = wb_reg_at_index(p);
            if (at >= (int64_t)ep->mesh.size[d]) {
                snprintf(err, errcap,
                         "%s: placement on mesh dim %s: at coordinate %lld, but the dim has "
                         "%u (0..%u)",
                         name, ep->mesh.name[d], (long long)at, ep->mesh.size[d],
                         ep->mesh.size[d] - 1);
                return -EINVAL;
            }
            if (p >= (int32_t)t->shape.ndim) {
                snprintf(err, errcap,
                         "%s: placement on mesh dim %s: %d is neither replicate (-1), at a "
                         "coordinate (-2 - i) nor a dim of the tensor",
                         name, ep->mesh.name[d], p);
                return -EINVAL;
            }
            r->t.place[d] = p;
        }
    }
    r->ptr = t->ptr;
    r->device = dev;
    ep->nregs++;
    return 0;
}

/* qsort_r/bsearch over indices into the registrations */
static int cmp_by_name(const void *a, const void *b, void *arg)
{
    const struct reg *r = arg;
    return strcmp(r[*(const uint32_t *)a].t.meta.name, r[*(const uint32_t *)b].t.meta.name);
}

int ag_regs_index(struct wb_endpoint *ep)
{
    free(ep->by_name);
    ep->by_name = malloc((ep->nregs ? ep->nregs : 1) * sizeof(uint32_t));
    if (!ep->by_name)
        return -ENOMEM;
    for (uint32_t i = 0; i < ep->nregs; i++)
        ep->by_name[i] = i;
    qsort_r(ep->by_name, ep->nregs, sizeof(uint32_t), cmp_by_name, ep->regs);
    return 0;
}

const struct reg *ag_regs_find(const struct wb_endpoint *ep, const char *name)
{
    /* Before start (checking a new name: a registering process adds each tensor once) linear;
     * at setup, once per shard of the plan, by the sorted index: a checkpoint reader holds
     * tens of thousands. */
    if (!ep->by_name) {
        for (uint32_t i = 0; i < ep->nregs; i++)
            if (strcmp(ep->regs[i].t.meta.name, name) == 0)
                return &ep->regs[i];
        return NULL;
    }
    uint32_t lo = 0, hi = ep->nregs;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ep->regs[ep->by_name[mid]].t.meta.name, name);
        if (c == 0)
            return &ep->regs[ep->by_name[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

void ag_regs_put(const struct wb_endpoint *ep, struct wb_mpw *w)
{
    wb_mpw_array(w, ep->nregs);
    for (uint32_t i = 0; i < ep->nregs; i++)
        wb_reg_put(w, &ep->regs[i].t);
}

/* A tensor's bytes as it lies in memory (contiguous: numel x size; strided: up to its last
 * element). */
static uint64_t extent_bytes(const struct reg *r)
{
    size_t es = wb_dtype_size(r->t.meta.dtype);
    uint64_t n = wb_box_numel(&r->t.meta.box);
    if (!n)
        return 0;
    if (!r->t.has_strides)
        return n * es;
    uint64_t last = 0;
    for (uint32_t d = 0; d < r->t.meta.box.ndim; d++)
        if (r->t.strides[d] > 0)
            last += (uint64_t)r->t.strides[d] * (r->t.meta.box.ext[d] - 1);
    return (last + 1) * es;
}

static int cmp_seg(const void *a, const void *b)
{
    const struct seg *x = a, *y = b;
    return x->base < y->base ? -1 : x->base > y->base;
}

/* The device-allocation lookup of ag_segs_build: the driver's (cuMemGetAddressRange). */
static int gpu_range(void *arg, const void *p, uintptr_t *base, uint64_t *size)
{
    (void)arg;
    return ag_gpu_addr_range(p, base, size);
}

int ag_segs_group(const struct reg *regs, uint32_t nregs, ag_alloc_range_fn range, void *arg,
                  struct seg **out, uint32_t *nout, char *err, size_t errcap)
{
    struct seg *s = calloc(nregs ? nregs : 1, sizeof(*s));
    uint32_t n = 0;
    if (!s)
        return -ENOMEM;
    for (uint32_t i = 0; i < nregs; i++) {
        const struct reg *r = &regs[i];
        uint64_t len = extent_bytes(r);
        if (!len)
            continue;
        uintptr_t p = (uintptr_t)r->ptr, base;
        uint64_t size;
        if (r->device) {
            int rc = range(arg, r->ptr, &base, &size);
            if (rc) {
                snprintf(err, errcap, "%s: cannot find the GPU allocation it lies in: %s",
                         r->t.meta.name, wb_strerror(rc));
                free(s);
                return rc;
            }
            if (p < base || p + len > base + size) {
                snprintf(err, errcap,
                         "%s: %" PRIu64 " bytes at %#" PRIxPTR
                         " run past their allocation (%#" PRIxPTR ", %" PRIu64 " bytes)",
                         r->t.meta.name, len, p, base, size);
                free(s);
                return -EINVAL;
            }
        } else {
            base = p / PAGE * PAGE;
            size = (p + len + PAGE - 1) / PAGE * PAGE - base;
        }
        s[n++] = (struct seg){.base = base, .len = size, .device = r->device};
    }
    /* Merge host pages that overlap or touch, and GPU tensors of one allocation — only those:
     * two GPU allocations stay two segments even where the driver placed them back to back.
     * A segment is registered (and, for CUDA IPC, exported by the handle of the allocation it
     * starts in) as one piece, and a peer reaches every tensor in it at its offset from the
     * segment's base; a peer that opened the first allocation's handle has mapped that
     * allocation and nothing after it, so a tensor of the next one was written past the
     * mapping — into whatever the writer's process had there — while the write was counted
     * as landed (issue #35: layers 1-3 of a Qwen3 rollout, whose caching-allocator segments
     * lay back to back, wrong while every version was complete; trainers whose own memory
     * there held more crashed). Host
     * memory is one address space for every transport: touching pages may share a
     * registration. */
    qsort(s, n, sizeof(*s), cmp_seg);
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++) {
        const struct seg *prev = m ? &s[m - 1] : NULL;
        bool merge = prev && s[i].device == prev->device &&
                     (s[i].device ? s[i].base == prev->base /* the same allocation */
                                  : s[i].base <= prev->base + prev->len);
        if (merge) {
            uintptr_t end = s[i].base + s[i].len;
            if (end > s[m - 1].base + s[m - 1].len)
                s[m - 1].len = end - s[m - 1].base;
        } else {
            s[m++] = s[i];
        }
    }
    *out = s;
    *nout = m;
    return 0;
}

int ag_segs_build(struct wb_endpoint *ep, char *err, size_t errcap)
{
    /* The driver answers for the calling thread's context: the endpoint's thread has none until
     * it names its device. */
    int rc0 = ep->o.device >= 0 ? ag_gpu_use(ep->o.device) : 0;
    if (rc0) {
        snprintf(err, errcap, "GPU %d: %s", ep->o.device, wb_strerror(rc0));
        return rc0;
    }
    int rc1 = ag_regs_index(ep);
    if (rc1)
        return rc1;
    if (ep->sourced) /* nothing in memory: the executor reads into its own */
        return 0;
    struct seg *s;
    uint32_t m;
    int rc = ag_segs_group(ep->regs, ep->nregs, gpu_range, NULL, &s, &m, err, errcap);
    if (rc)
        return rc;
    free(ep->segs);
    ep->segs = s;
    ep->nsegs = m;
    return 0;
}

int ag_seg_of(const struct wb_endpoint *ep, const void *p, uint64_t n)
{
    uintptr_t a = (uintptr_t)p;
    for (uint32_t i = 0; i < ep->nsegs; i++)
        if (a >= ep->segs[i].base && a + n <= ep->segs[i].base + ep->segs[i].len)
            return (int)i;
    return -1;
}

void ag_regs_free(struct wb_endpoint *ep)
{
    free(ep->regs);
    free(ep->segs);
    free(ep->by_name);
    ep->by_name = NULL;
    ep->regs = NULL;
    ep->segs = NULL;
    ep->nregs = ep->nsegs = 0;
    ep->capregs = 0;
}

uint32_t ag_segs_count(const struct wb_endpoint *ep)
{
    return ep->nsegs;
}

const struct seg *ag_seg_get(const struct wb_endpoint *ep, uint32_t k)
{
    return &ep->segs[k];
}

uint32_t ag_regs_index_of(const struct wb_endpoint *ep, const struct reg *r)
{
    return (uint32_t)(r - ep->regs);
}

const struct wb_endpoint_source *ag_regs_source(const struct wb_endpoint *ep)
{
    return ep->sourced ? &ep->src : NULL;
}
