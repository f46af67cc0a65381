/* reader.c — a reader process of a checkpoint broadcast: a trainer endpoint whose tensors are
 * the pieces of its share of the checkpoint (rows of a tensor, or all of it), registered with
 * their global shapes and row boxes and read from the files on demand.
 *
 * Every reader computes the same shares from the same files, so none needs to be told its
 * part: the coordinator's plan expects exactly these boxes (a reader that opened other files,
 * or counts other readers, is refused at registration, its problems listed). Reads go through
 * one wb_ckpt_reader per I/O thread (a reader context is one thread's).
 *
 * Before registering, a reader hashes its whole share (XXH3-128 per piece, then over the
 * pieces: wb_ckpt_share_hash) and registers the hash with the fingerprint, and each piece's
 * hash with the piece; the coordinator hashed the same share of its own checkpoint, so a
 * reader whose bytes differ is refused before anything is sent, told which pieces differ. The
 * transfer reads the files again (tasks read pieces in the planner's order, not the hash's), so
 * each read also checks that its file was not written to since the hash (ctime and size): a changed
 * file fails the transfer naming it. */
#include "bcast/bcast.h"

#include "agent/agent.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct source {
    const struct wb_ckpt *ck;
    const struct wb_ckpt_share *share;
    struct wb_ckpt_reader **rd; /* per I/O thread */
    uint32_t nthreads;
    struct stat *st; /* each file as it was when its content was hashed */
};

/* The files as they are now, taken before the content hash: a write into one afterwards
 * changes its ctime (which no user can set back), its size, or both. */
static int take_stats(const struct wb_ckpt *ck, struct stat *st)
{
    for (size_t f = 0; f < ck->nfiles; f++)
        if (fstat(ck->files[f].fd, &st[f]) != 0)
            return -errno;
    return 0;
}

static bool changed(const struct stat *a, const struct stat *b)
{
    return a->st_size != b->st_size || a->st_ctim.tv_sec != b->st_ctim.tv_sec ||
           a->st_ctim.tv_nsec != b->st_ctim.tv_nsec;
}

static int read_piece(void *arg, uint32_t thread, uint32_t index, uint64_t off, uint64_t len,
                      void *dst, char *msg, size_t msgcap)
{
    struct source *s = arg;
    if (thread >= s->nthreads || index >= s->share->n) {
        snprintf(msg, msgcap, "read request for piece %u on I/O thread %u", index, thread);
        return -EINVAL;
    }
    const struct wb_ckpt_piece *p = &s->share->piece[index];
    if (off > p->bytes || len > p->bytes - off) {
        snprintf(msg, msgcap, "bytes [%" PRIu64 ", +%" PRIu64 ") outside the piece's %" PRIu64, off,
                 len, p->bytes);
        return -EINVAL;
    }
    int rc = wb_ckpt_read(s->rd[thread], p->tensor, p->offset + off, len, dst, NULL);
    const struct wb_ckpt_loc *l = &s->ck->loc[p->tensor];
    struct stat now;
    /* after the read: bytes read before a write that changed them would not have passed the
     * content check's hash; a write since the check is refused, not sent */
    if (!rc && (fstat(s->ck->files[l->file].fd, &now) != 0 || changed(&now, &s->st[l->file]))) {
        snprintf(msg, msgcap,
                 "%s: the file changed after its content was checked (written to since): its "
                 "bytes are not the ones proven equal to the coordinator's checkpoint",
                 wb_esc(s->ck->files[l->file].name).s);
        return -ESTALE;
    }
    if (rc) {
        snprintf(msg, msgcap, "%s: %" PRIu64 " bytes at offset %" PRIu64 ": %s",
                 wb_esc(s->ck->files[l->file].name).s, len, l->offset + p->offset + off,
                 rc == -EIO ? "the file is shorter than when it was opened" : wb_strerror(rc));
    }
    return rc;
}

static void endpoint_problems(struct wb_endpoint *ep, struct wb_errlist *el)
{
    const char *e = wb_endpoint_error(ep);
    /* one problem per line (a refused registration lists them) */
    while (*e) {
        const char *nl = strchr(e, '\n');
        size_t n = nl ? (size_t)(nl - e) : strlen(e);
        if (n)
            wb_errlist_add(el, "%.*s", (int)n, e);
        e += n + (nl ? 1 : 0);
    }
}

int wb_bcast_reader_run(const struct wb_bcast_reader_opts *o, struct wb_errlist *el)
{
    struct wb_ckpt *ck = NULL;
    struct wb_ckpt_shares sh = {0};
    struct wb_endpoint *ep = NULL;
    struct source src = {0};
    char id[WB_SOURCE_MAX];
    struct wb_hash128 *digests = NULL; /* each piece's, registered with it */
    int rc = wb_ckpt_open(o->checkpoint, &ck, el);
    if (rc)
        return rc;
    if (o->readers == 0 || o->rank >= o->readers) {
        wb_errlist_add(el, "reader rank %u of %u readers", o->rank, o->readers);
        rc = -EINVAL;
        goto out;
    }
    if ((rc = wb_ckpt_shares_make(ck, o->readers, &sh)) != 0 ||
        (rc = wb_ckpt_fingerprint(ck, id, sizeof(id))) != 0) {
        wb_errlist_add(el, "%s: %s", wb_esc(o->checkpoint).s, wb_strerror(rc));
        goto out;
    }
    src.ck = ck;
    src.share = &sh.share[o->rank];
    src.nthreads = o->io_threads ? o->io_threads : 2;
    src.rd = calloc(src.nthreads, sizeof(*src.rd));
    if (!src.rd) {
        rc = -ENOMEM;
        goto out;
    }
    for (uint32_t i = 0; i < src.nthreads; i++)
        if ((rc = wb_ckpt_reader_open(ck, &o->io, &src.rd[i])) != 0) {
            wb_errlist_add(el, "%s: reader context: %s", wb_esc(o->checkpoint).s, wb_strerror(rc));
            goto out;
        }
    /* What this reader's share holds, byte for byte: registered with the fingerprint, so the
     * coordinator, which hashed the same share of its own checkpoint, refuses a reader whose
     * files are another checkpoint of the same model before anything is sent. */
    {
        struct wb_hash128 h;
        char hex[33];
        uint64_t t0 = wb_now_ns();
        if (!(src.st = calloc(ck->nfiles ? ck->nfiles : 1, sizeof(*src.st))) ||
            (rc = take_stats(ck, src.st)) != 0) {
            rc = src.st ? rc : -ENOMEM;
            wb_errlist_add(el, "%s: %s", wb_esc(o->checkpoint).s, wb_strerror(rc));
            goto out;
        }
        if (!(digests = calloc(src.share->n ? src.share->n : 1, sizeof(*digests)))) {
            rc = -ENOMEM;
            goto out;
        }
        if ((rc = wb_ckpt_share_hash(ck, src.share, src.rd[0], &h, digests)) != 0) {
            wb_errlist_add(el, "%s: hashing its share: %s", wb_esc(o->checkpoint).s,
                           rc == -EIO ? "a file is shorter than when it was opened"
                                      : wb_strerror(rc));
            goto out;
        }
        char t[2 * WB_SOURCE_MAX];
        snprintf(t, sizeof(t), "%s share %u/%u content %s", id, o->rank, o->readers,
                 wb_hash128_hex(&h, hex));
        if (strlen(t) >= sizeof(id)) {
            rc = -ENAMETOOLONG;
            wb_errlist_add(el, "%s: its identity is too long", wb_esc(o->checkpoint).s);
            goto out;
        }
        memcpy(id, t, strlen(t) + 1);
        wb_log(WB_LOG_INFO, "bcast",
               "reader %u: share content %s (%" PRIu64 " bytes hashed in %.3f s)", o->rank, hex,
               src.share->bytes, (double)(wb_now_ns() - t0) / 1e9);
    }
    struct wb_endpoint_opts eo = {.role = WB_ROLE_TRAINER,
                                  .rank = o->rank,
                                  .device = o->device,
                                  .controller = o->controller,
                                  .token = o->token,
                                  .trace = o->trace,
                                  .give_up_ns = o->give_up_ns,
                                  .pace_ns = o->pace_ns,
                                  .tx_domain = o->tx_domain,
                                  .tx_extra = o->tx_extra};
    if ((rc = wb_endpoint_open(&eo, &ep)) != 0) {
        wb_errlist_add(el, "controller %s: %s", o->controller ? o->controller : "(none)",
                       rc == -EINVAL ? "not a usable nng URL" : wb_strerror(rc));
        goto out;
    }
    struct wb_endpoint_source es = {.read = read_piece,
                                    .arg = &src,
                                    .threads = src.nthreads,
                                    .id = id,
                                    .digests = digests->b,
                                    .ndigests = (uint32_t)src.share->n};
    if ((rc = wb_endpoint_set_source(ep, &es)) != 0) {
        endpoint_problems(ep, el);
        goto out;
    }
    for (size_t i = 0; i < src.share->n; i++) {
        const struct wb_ckpt_piece *p = &src.share->piece[i];
        const struct wb_param *t = &ck->inv.p[p->tensor];
        struct wb_tensor_reg r = {.name = t->name, .dtype = t->dtype, .shape = t->shape};
        r.box = wb_ckpt_piece_box(ck, p);
        if ((rc = wb_endpoint_add(ep, &r)) != 0) {
            endpoint_problems(ep, el);
            goto out;
        }
    }
    wb_log(WB_LOG_INFO, "bcast", "reader %u of %u: %zu pieces, %" PRIu64 " bytes of %s", o->rank,
           o->readers, src.share->n, src.share->bytes, id);
    rc = wb_endpoint_run(ep);
    if (rc)
        endpoint_problems(ep, el);
out:
    wb_endpoint_close(ep);
    for (uint32_t i = 0; src.rd && i < src.nthreads; i++)
        wb_ckpt_reader_close(src.rd[i]);
    free(src.rd);
    free(src.st);
    free(digests);
    wb_ckpt_shares_free(&sh);
    wb_ckpt_close(ck);
    return rc;
}
