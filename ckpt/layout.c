/* layout.c — a checkpoint's readers as the trainer side of a job: the trainer layout in which
 * reader k holds exactly the rows its share covers, and a fingerprint that names the
 * checkpoint's contents for every process that opens it.
 *
 * A tensor read whole by one reader is placed on that reader alone (INDEX); a tensor the
 * shares split is placed by explicit row ranges (WB_PLACE_ROWS), one range per reader, empty
 * for the readers that hold none of it. The planner then sends every byte from the reader that
 * read it, so each byte of the files is read once in the whole fleet. */
#include "ckpt/ckpriv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

int wb_ckpt_layout(const struct wb_ckpt *ck, const struct wb_ckpt_shares *s,
                   struct wb_trainer_layout *out, struct wb_errlist *el)
{
    size_t n = ck->inv.n;
    uint32_t nr = s->n;
    uint32_t *npieces = calloc(n ? n : 1, sizeof(uint32_t));
    uint32_t *holder = calloc(n ? n : 1, sizeof(uint32_t));
    uint64_t **cuts = calloc(n ? n : 1, sizeof(uint64_t *));
    const char **names = calloc(n ? n : 1, sizeof(char *));
    struct wb_placement *place = calloc(n ? n : 1, sizeof(*place));
    int err = npieces && holder && cuts && names && place ? 0 : -ENOMEM;
    for (uint32_t k = 0; !err && k < nr; k++)
        for (size_t i = 0; i < s->share[k].n; i++) {
            uint32_t t = s->share[k].piece[i].tensor;
            npieces[t]++;
            holder[t] = k;
        }
    /* split tensors: each reader's rows, then their running sum as the cuts */
    for (uint32_t k = 0; !err && k < nr; k++)
        for (size_t i = 0; !err && i < s->share[k].n; i++) {
            const struct wb_ckpt_piece *p = &s->share[k].piece[i];
            if (npieces[p->tensor] < 2)
                continue;
            if (!cuts[p->tensor] && !(cuts[p->tensor] = calloc((size_t)nr + 1, sizeof(uint64_t))))
                err = -ENOMEM;
            else
                cuts[p->tensor][k + 1] = p->rows;
        }
    for (size_t t = 0; !err && t < n; t++) {
        names[t] = ck->inv.p[t].name;
        if (!cuts[t]) {
            place[t] = (struct wb_placement){WB_PLACE_INDEX, holder[t]};
            continue;
        }
        place[t] = (struct wb_placement){WB_PLACE_ROWS, 0};
        for (uint32_t k = 0; k < nr; k++)
            cuts[t][k + 1] += cuts[t][k];
    }
    if (!err) {
        struct wb_mesh_dim dim = {.size = nr};
        snprintf(dim.name, sizeof(dim.name), "reader");
        err = wb_trainer_layout_from_placements(1, &dim, 0, WB_RESIDE_HOST, n, names, place,
                                                (const uint64_t *const *)cuts,
                                                "the checkpoint's readers", out, el);
    }
    for (size_t t = 0; cuts && t < n; t++)
        free(cuts[t]);
    free(cuts);
    free(npieces);
    free(holder);
    free(names);
    free(place);
    return err;
}

int wb_ckpt_fingerprint(const struct wb_ckpt *ck, char *buf, size_t cap)
{
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return -ENOMEM;
    XXH3_64bits_reset(st);
    int err = 0;
    uint8_t *hdr = NULL;
    for (size_t i = 0; !err && i < ck->nfiles; i++) {
        const struct wb_ckpt_file *f = &ck->files[i];
        XXH3_64bits_update(st, f->name, strlen(f->name) + 1);
        XXH3_64bits_update(st, &f->size, sizeof(f->size));
        uint8_t *nh = realloc(hdr, f->data ? f->data : 1);
        if (!nh) {
            err = -ENOMEM;
            break;
        }
        hdr = nh;
        err = ck_read_full(f->fd, hdr, f->data, 0);
        if (!err)
            XXH3_64bits_update(st, hdr, f->data);
    }
    if (!err)
        snprintf(buf, cap, "safetensors %016llx (%zu file%s, %llu bytes)",
                 (unsigned long long)XXH3_64bits_digest(st), ck->nfiles, ck->nfiles == 1 ? "" : "s",
                 (unsigned long long)ck->bytes);
    free(hdr);
    XXH3_freeState(st);
    return err;
}

char *wb_hash128_hex(const struct wb_hash128 *h, char buf[33])
{
    for (int i = 0; i < 16; i++)
        snprintf(buf + 2 * i, 3, "%02x", h->b[i]);
    return buf;
}

int wb_ckpt_share_hash(const struct wb_ckpt *ck, const struct wb_ckpt_share *s,
                       struct wb_ckpt_reader *r, struct wb_hash128 *share, struct wb_hash128 *piece)
{
    enum { CHUNK = 8 << 20 };
    (void)ck;
    uint8_t *buf = malloc(CHUNK);
    XXH3_state_t *st = XXH3_createState(), *all = XXH3_createState();
    int err = buf && st && all ? 0 : -ENOMEM;
    if (!err)
        XXH3_128bits_reset(all);
    for (size_t i = 0; !err && i < s->n; i++) {
        const struct wb_ckpt_piece *p = &s->piece[i];
        XXH3_128bits_reset(st);
        for (uint64_t off = 0; !err && off < p->bytes; off += CHUNK) {
            uint64_t len = p->bytes - off < CHUNK ? p->bytes - off : CHUNK;
            err = wb_ckpt_read(r, p->tensor, p->offset + off, len, buf, NULL);
            if (!err)
                XXH3_128bits_update(st, buf, (size_t)len);
        }
        if (err)
            break;
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
        if (piece)
            memcpy(piece[i].b, c.digest, 16);
        uint64_t key[3] = {p->tensor, p->offset, p->bytes};
        XXH3_128bits_update(all, key, sizeof(key));
        XXH3_128bits_update(all, c.digest, sizeof(c.digest));
    }
    if (!err) {
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits_digest(all));
        memcpy(share->b, c.digest, 16);
    }
    XXH3_freeState(st);
    XXH3_freeState(all);
    free(buf);
    return err;
}
