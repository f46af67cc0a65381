/* ckpt.h — the one public header of ckpt/: a Hugging Face safetensors checkpoint as the source
 * of a weight update, for broadcasting a checkpoint into a rollout fleet without a trainer.
 *
 * "Reader" processes each read a share of the checkpoint's bytes and write it into the rollouts
 * with the same plan, pipeline and transport as a training update: the checkpoint plays the
 * trainer's role, so its tensors must be the model's trainer inventory. This part gives
 *  - the reader: every file's header parsed and checked (bounds, offsets, overlaps, lengths,
 *    dtypes, the index against the files) before a byte of data is read (wb_ckpt_open);
 *  - the check against the model (wb_ckpt_check_model), BF16 or FP8 checkpoints;
 *  - data reads of a tensor or a byte range of one into host memory, with XXH3-64 checksums
 *    computed on the way (wb_ckpt_read*);
 *  - load-balanced shares of the bytes for N readers, large tensors split by rows along dim 0
 *    (wb_ckpt_shares_make);
 *  - a writer of real checkpoints of synthetic values for tests and benchmarks (wb_ckpt_write).
 *
 * Errors follow common.h: 0 or a negative code, every problem of an input appended to the
 * error list. A checkpoint that cannot be used is -EBADMSG (its files) or -WB_E_MATCH (against
 * the model); a file that cannot be opened or read is its errno. Messages name the file as the
 * checkpoint names it (relative to the checkpoint directory) and the tensor.
 */
#ifndef WB_CKPT_H
#define WB_CKPT_H

#include "common/common.h"
#include "matcher/matcher.h"
#include "planner/planner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- limits */

/* What a file may claim, checked before anything is allocated for it. The header limit is the
 * safetensors library's own (100 MB); Kimi-K2's largest header is about 150 kB. */
#define WB_CKPT_MAX_HEADER  100000000ull
#define WB_CKPT_MAX_INDEX   (64ull << 20) /* bytes of model.safetensors.index.json */
#define WB_CKPT_MAX_TENSORS (1u << 20)    /* tensors in one checkpoint (Kimi-K2: 69,975) */
#define WB_CKPT_MAX_FILES   (1u << 16)
#define WB_CKPT_MAX_READERS (1u << 16)

/* The index file name of a sharded checkpoint. */
#define WB_CKPT_INDEX "model.safetensors.index.json"

/* ---------------------------------------------------------------- opening */

struct wb_ckpt_file {
    char *name;    /* as messages name it: relative to the checkpoint directory, or the path
                      given when a single file was opened */
    char *path;    /* the path opened */
    uint64_t size; /* bytes */
    uint64_t data; /* offset of the data area: 8 + header length */
    uint32_t ntensors;
    int fd; /* open for reading (O_RDONLY) while the checkpoint is open */
};

/* Where a tensor's bytes are. Parallel to the inventory: tensor i is inv.p[i] (name, dtype,
 * shape) and loc[i]. */
struct wb_ckpt_loc {
    uint32_t file;
    uint64_t offset; /* absolute byte offset in the file */
    uint64_t bytes;  /* numel x dtype size */
};

struct wb_ckpt {
    char *path; /* as given to wb_ckpt_open */
    struct wb_ckpt_file *files;
    size_t nfiles;
    /* The tensors in reading order: by file (file names sorted), then by offset. The inventory
     * has the name index (wb_inv_find) and can stand in as a job's trainer inventory. */
    struct wb_inventory inv;
    struct wb_ckpt_loc *loc;
    uint64_t bytes; /* sum of the tensors' bytes */
};

/* Opens a checkpoint: a directory with model.safetensors.index.json (only the files the index
 * names are read), a directory without one (every *.safetensors file in it, sorted), or one
 * .safetensors file. Every header is read and checked; the data is not touched. Problems are
 * all appended to el (every file is checked) and the return is -EBADMSG, or the errno of a
 * path that cannot be opened (-ENOENT ...); *out is written only on success. */
int wb_ckpt_open(const char *path, struct wb_ckpt **out, struct wb_errlist *el);
void wb_ckpt_close(struct wb_ckpt *ck);

/* ---------------------------------------------------------------- against the model */

/* Which form of the model's weights the checkpoint holds. */
enum wb_ckpt_form {
    WB_CKPT_FORM_AUTO = 0, /* FP8 when the checkpoint holds fp8_e4m3 tensors and the model's
                              trainer inventory none, else MODEL */
    WB_CKPT_FORM_MODEL,    /* the trainer inventory as generated (BF16 for most families) */
    WB_CKPT_FORM_FP8,      /* block-FP8 like the official -FP8 checkpoints: every trainer tensor
                              of >= 2 dims that a rule builds an FP8 rollout tensor from (the
                              family's fp8 rule with an FP8 config.json) is fp8_e4m3 and has an
                              FP32 <name>_scale_inv of ceil(rows/128) x ceil(cols/128) blocks */
};

const char *wb_ckpt_form_name(enum wb_ckpt_form f); /* "auto", "model", "fp8" */

/* The inventory a checkpoint of model m has in form `form` (not AUTO): out is replaced on
 * success. -EINVAL for AUTO. */
int wb_ckpt_expected(const struct wb_model *m, enum wb_ckpt_form form, struct wb_inventory *out,
                     struct wb_errlist *el);

/* Compares the checkpoint's tensors with `want`: every extra tensor, dtype or shape mismatch
 * (in the checkpoint's order) and every missing tensor (in want's order) is appended to el,
 * each naming the tensor, what the model expects and what the checkpoint has; -WB_E_MATCH then. */
int wb_ckpt_check(const struct wb_ckpt *ck, const struct wb_inventory *want, struct wb_errlist *el);

/* wb_ckpt_expected + wb_ckpt_check; with AUTO picks the form as described above. *used (may
 * be NULL) is the form checked against, also on a mismatch. */
int wb_ckpt_check_model(const struct wb_ckpt *ck, const struct wb_model *m, enum wb_ckpt_form form,
                        enum wb_ckpt_form *used, struct wb_errlist *el);

/* ---------------------------------------------------------------- reading data */

/* XXH3-64 (seed 0) of a buffer: what a rollout computes over what landed, to compare with the
 * checksum a read returned for the same bytes. */
uint64_t wb_ckpt_xxh3(const void *p, size_t n);

/* (1 was an mmap mode, gone: a mapped file that shrinks while it is copied is a SIGBUS that a
 * library cannot catch cleanly; wb_ckpt_reader_open() refuses it with -EINVAL.) */
enum wb_ckpt_io_mode {
    WB_CKPT_IO_PREAD = 0,  /* pread(2) in chunks straight into the caller's buffer (default) */
    WB_CKPT_IO_DIRECT = 2, /* O_DIRECT pread(2) of 4 KiB-aligned chunks into a bounce buffer,
                              then memcpy: no page cache; falls back to PREAD for a file whose
                              filesystem refuses O_DIRECT, or that is no longer the file opened
                              (wb_ckpt_reader_direct() says) */
};

struct wb_ckpt_io_opts {
    enum wb_ckpt_io_mode mode;
    uint64_t chunk; /* bytes per read call (rounded up to 4 KiB); 0: 8 MiB */
};

/* A reading context: one per thread (it owns the bounce buffer and the O_DIRECT descriptors);
 * any number may read the same open checkpoint at once. */
struct wb_ckpt_reader;

int wb_ckpt_reader_open(const struct wb_ckpt *ck, const struct wb_ckpt_io_opts *o,
                        struct wb_ckpt_reader **out);
void wb_ckpt_reader_close(struct wb_ckpt_reader *r);
/* Whether reads go through O_DIRECT (mode DIRECT on a filesystem that allows it, checked on
 * the first file). */
bool wb_ckpt_reader_direct(const struct wb_ckpt_reader *r);

/* Reads bytes [off, off + len) of tensor `tensor` into dst. With xxh3 non-NULL, *xxh3 is the
 * XXH3-64 of those bytes, computed chunk by chunk as they arrive. -EINVAL for a range outside
 * the tensor; -EIO (logged, naming file and offset) when the file is shorter than it was when
 * opened; a read error's errno. */
int wb_ckpt_read(struct wb_ckpt_reader *r, size_t tensor, uint64_t off, uint64_t len, void *dst,
                 uint64_t *xxh3);
/* The whole tensor. */
int wb_ckpt_read_tensor(struct wb_ckpt_reader *r, size_t tensor, void *dst, uint64_t *xxh3);

/* ---------------------------------------------------------------- shares for N readers */

/* Rows [row0, row0 + rows) along dim 0 of one tensor: bytes [offset, offset + bytes) of it. A
 * 0-d tensor is one row. */
struct wb_ckpt_piece {
    uint32_t tensor;
    uint64_t row0, rows;
    uint64_t offset, bytes;
};

struct wb_ckpt_share {
    struct wb_ckpt_piece *piece; /* in reading order */
    size_t n;
    uint64_t bytes;
};

/* The checkpoint's bytes in reading order cut into one contiguous range per reader, each cut
 * moved to the nearest row boundary of the tensor it falls in (for a 2-D fp8_e4m3 tensor, the
 * nearest 128-row block boundary, so that every reader holds whole FP8 blocks). Hence
 * max <= ceil(total / n) + slack, slack being the largest row (block of rows) of a tensor a cut
 * falls in: one row of total/N. Zero-byte tensors go to the reader whose range holds their
 * position. */
struct wb_ckpt_shares {
    uint32_t n;
    struct wb_ckpt_share *share;
    uint64_t total, min, max;
    uint64_t slack;
    size_t nsplit; /* tensors split over more than one reader */
};

/* -EINVAL for readers 0 or above WB_CKPT_MAX_READERS. */
int wb_ckpt_shares_make(const struct wb_ckpt *ck, uint32_t readers, struct wb_ckpt_shares *out);
void wb_ckpt_shares_free(struct wb_ckpt_shares *s);
/* The box of the tensor a piece covers (rows along dim 0, everything along the others). */
struct wb_box wb_ckpt_piece_box(const struct wb_ckpt *ck, const struct wb_ckpt_piece *p);
/* Reads a piece into dst (p->bytes bytes); xxh3 as for wb_ckpt_read. */
int wb_ckpt_read_piece(struct wb_ckpt_reader *r, const struct wb_ckpt_piece *p, void *dst,
                       uint64_t *xxh3);

/* ---------------------------------------------------------------- the readers as trainers */

/* The trainer layout in which the shares' readers are a job's trainer ranks (a one-dim mesh
 * "reader" of s->n, residence host: they read from the files): a tensor one reader reads whole
 * sits on that reader alone, a tensor the shares split is placed by explicit row ranges
 * (WB_PLACE_ROWS), so the plan sends every byte from the reader that read it. *out is
 * replaced on success. */
int wb_ckpt_layout(const struct wb_ckpt *ck, const struct wb_ckpt_shares *s,
                   struct wb_trainer_layout *out, struct wb_errlist *el);

/* What the checkpoint holds, as one line ("safetensors <XXH3 of every file's name, size and
 * header> (N files, B bytes)"): readers register it and the broadcast's controller refuses a
 * reader that opened other files. */
int wb_ckpt_fingerprint(const struct wb_ckpt *ck, char *buf, size_t cap);

/* What a share's bytes are: XXH3-128 of each piece's bytes as read from the files (piece[i],
 * when piece is not NULL: s->n of them), and XXH3-128 over every piece's tensor index, offset,
 * length and hash in reading order (*share). The fingerprint says which files and headers a
 * reader opened; this says what their tensor bytes are, so two checkpoints of one model that
 * differ only in values get different hashes. Reads the share once more (in 8 MiB chunks
 * through r). -EIO when a file is shorter than when it was opened. */
struct wb_hash128 {
    uint8_t b[16]; /* canonical (big-endian) XXH128 */
};
int wb_ckpt_share_hash(const struct wb_ckpt *ck, const struct wb_ckpt_share *s,
                       struct wb_ckpt_reader *r, struct wb_hash128 *share,
                       struct wb_hash128 *piece);
/* 32 lowercase hex digits and a NUL into buf[33]. */
char *wb_hash128_hex(const struct wb_hash128 *h, char buf[33]);

/* ---------------------------------------------------------------- writing (tests, benches) */

struct wb_ckpt_write_opts {
    uint64_t seed, version; /* of the synthetic source (wb_synth_fill) */
    uint32_t files;         /* data files; 0 or 1: one model.safetensors without an index */
    const char *metadata;   /* __metadata__ "format" value; NULL: "pt" */
};

/* Writes a safetensors checkpoint of the inventory into dir (created when missing): the
 * tensors in inventory order, cut into `files` files of about equal bytes
 * (model-00001-of-0000N.safetensors) with model.safetensors.index.json, or one
 * model.safetensors. Values are the synthetic source's: BF16/FP16/FP32 as wb_synth_fill gives
 * them; an fp8_e4m3 tensor X is the 128x128 block quantization of X's BF16 values (what a
 * trainer holding BF16 would produce) and an FP32 tensor X_scale_inv next to it holds that
 * quantization's scales; I32/I64 tensors are zeros. Errors name the file. */
int wb_ckpt_write(const char *dir, const struct wb_inventory *inv,
                  const struct wb_ckpt_write_opts *o, struct wb_errlist *el);

#ifdef __cplusplus
}
#endif

#endif /* WB_CKPT_H */
