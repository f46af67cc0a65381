/* common.h — the one public header of common/: errors, logging, dtypes, tensor boxes, the
 * msgpack wire codec, the table-driven YAML config loader and the optional-GPU helpers.
 *
 * Everything else in weightbridge builds on these. Conventions used throughout the project:
 *  - functions return int: 0 on success or a negative errno (-EINVAL, -ENOMEM, ...), or a
 *    negative project code (-WB_E_*); counts are returned as ssize_t;
 *  - out-parameters are written only on success;
 *  - no global mutable state except the cached log level.
 */
#ifndef WB_COMMON_H
#define WB_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/fpbits.h" /* the float converters: one set for C and CUDA */

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- errors */

/* Project error codes start at 256 so they never collide with errno values. Functions return
 * them negated, like errno values. */
enum wb_errcode {
    WB_E_FIRST = 256,
    WB_E_CONFIG = 256, /* configuration file invalid */
    WB_E_MATCH,        /* trainer/rollout names or shapes do not match */
    WB_E_PLAN,         /* layout cannot be planned */
    WB_E_VERSION,      /* wire message of an unsupported version */
    WB_E_TOKEN,        /* control message with a wrong or missing cluster token */
    WB_E_PEER,         /* a peer process died or stopped answering */
    WB_E_CUDA,         /* a CUDA runtime call failed */
    WB_E_FABRIC,       /* a libfabric call failed */
    WB_E_NOGPU,        /* a GPU was needed and none is usable */
    WB_E_BOUNDS,       /* a write would fall outside its destination region */
    WB_E_ENDED,        /* the controller is shutting the job down: agents exit */
    WB_E_HELLO,        /* a control message on a connection it is not bound to (HELLO first) */
    WB_E_LAST
};

/* Text for 0, a negative errno or a negative project code (the sign is ignored). Never NULL. */
const char *wb_strerror(int err);

/* A growing list of user-facing error messages, for checks that report every problem at once
 * (config loading, matching, planning) instead of stopping at the first. */
struct wb_errlist {
    char **msgs;
    size_t n, cap;
    size_t dropped; /* problems counted by wb_errlist_drop() without their text */
};

void wb_errlist_init(struct wb_errlist *el);
/* Appends one formatted message. Returns 0 or -ENOMEM (the message is then lost). */
int wb_errlist_add(struct wb_errlist *el, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int wb_errlist_vadd(struct wb_errlist *el, const char *fmt, va_list ap);
/* Counts k more problems without keeping their text: a check that can find millions keeps the
 * first ones (wb_errlist_add) and only counts the others. */
void wb_errlist_drop(struct wb_errlist *el, size_t k);
/* Every problem found: the kept messages plus the counted ones. */
static inline size_t wb_errlist_count(const struct wb_errlist *el)
{
    return el->n + el->dropped;
}
/* Writes every kept message, one per line, each prefixed by `prefix` (may be ""), then
 * "<prefix>... and N more" when N problems were only counted. */
void wb_errlist_print(const struct wb_errlist *el, const char *prefix, void *file);
void wb_errlist_free(struct wb_errlist *el);

/* ---------------------------------------------------------------- logging */

enum wb_log_level { WB_LOG_DEBUG = 0, WB_LOG_INFO, WB_LOG_WARN, WB_LOG_ERROR, WB_LOG_OFF };

/* The level from $WB_LOG (debug|info|warn|error|off; default warn), read once. */
enum wb_log_level wb_log_level(void);
/* Parses a level name; returns -EINVAL for an unknown name. */
int wb_log_level_parse(const char *s, enum wb_log_level *out);
/* Writes "wb <level> <module>: <message>\n" to stderr when level >= wb_log_level(). */
void wb_log(enum wb_log_level level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---------------------------------------------------------------- dtypes */

enum wb_dtype {
    WB_DTYPE_INVALID = 0,
    WB_DTYPE_BF16,
    WB_DTYPE_FP16,
    WB_DTYPE_FP32,
    WB_DTYPE_FP8_E4M3, /* e4m3fn: no infinities, max 448 */
    WB_DTYPE_I32,
    WB_DTYPE_I64,
    WB_DTYPE_COUNT
};

/* FP8 block quantization works on WB_FP8_BLOCK x WB_FP8_BLOCK tiles counted from the tensor
 * origin (DeepSeek-V3, Qwen3-FP8 and Kimi-K2 checkpoints; vLLM's block-FP8 layout). This is
 * the one place the edge is defined: the matcher refuses models asking for another size, the
 * planner and quant/ tile with it, and every routing table carries it. */
enum { WB_FP8_BLOCK = 128 };

/* Bytes per element; 0 for WB_DTYPE_INVALID or out-of-range values. */
size_t wb_dtype_size(enum wb_dtype dt);
/* Canonical lower-case name ("bf16", "fp16", "fp32", "fp8_e4m3", "i32", "i64"); "invalid". */
const char *wb_dtype_name(enum wb_dtype dt);
/* Accepts canonical names and the common aliases of PyTorch and safetensors, any case
 * ("bfloat16", "torch.bfloat16", "BF16", "float8_e4m3fn", "F8_E4M3", "float32", "int64", ...).
 * Returns 0 or -EINVAL. */
int wb_dtype_parse(const char *s, enum wb_dtype *out);

/* ---------------------------------------------------------------- tensor boxes */

enum { WB_MAX_DIMS = 6 };

/* The global shape of a row-major tensor. ndim 0 is a scalar (one element). */
struct wb_shape {
    uint32_t ndim;
    uint64_t dim[WB_MAX_DIMS];
};

/* An n-dimensional slice [off, off+ext) per dimension, in elements. A box with any zero extent
 * is empty. */
struct wb_box {
    uint32_t ndim;
    uint64_t off[WB_MAX_DIMS];
    uint64_t ext[WB_MAX_DIMS];
};

uint64_t wb_shape_numel(const struct wb_shape *s);
bool wb_shape_eq(const struct wb_shape *a, const struct wb_shape *b);
/* "[4096, 128]" into buf (always NUL-terminated); returns buf. */
char *wb_shape_str(const struct wb_shape *s, char *buf, size_t cap);

/* The box covering the whole tensor. */
struct wb_box wb_box_full(const struct wb_shape *s);
uint64_t wb_box_numel(const struct wb_box *b);
bool wb_box_empty(const struct wb_box *b);
bool wb_box_eq(const struct wb_box *a, const struct wb_box *b);
/* The shape of the box (its extents). */
struct wb_shape wb_box_shape(const struct wb_box *b);
/* Intersection of two boxes of equal ndim. Returns true when non-empty; *out is written
 * either way (an empty intersection has zero extents). */
bool wb_box_intersect(const struct wb_box *a, const struct wb_box *b, struct wb_box *out);
/* True when every element of inner lies in outer (an empty inner is contained anywhere). */
bool wb_box_contains(const struct wb_box *outer, const struct wb_box *inner);
/* True when the box lies inside the tensor of shape s. */
bool wb_box_within(const struct wb_shape *s, const struct wb_box *b);
/* Box b expressed relative to origin's offsets (b must be contained in origin). */
struct wb_box wb_box_relative(const struct wb_box *b, const struct wb_box *origin);
/* Box b moved by +delta[d] per dimension. */
struct wb_box wb_box_shift(const struct wb_box *b, const uint64_t *delta);
/* "[0:128, 64:96]" into buf; returns buf. */
char *wb_box_str(const struct wb_box *b, char *buf, size_t cap);
/* Transposes a packed row-major array in host memory: src has extents ext[0..ndim); dst gets
 * extent ext[perm[k]] along dim k, and dst element i is src element j with j[perm[k]] = i_k
 * (PyTorch's src.permute(perm).contiguous()). elem is 1, 2, 4 or 8 bytes; dst and src do not
 * overlap. Tiled, so that reads and writes both stay in cache lines. Returns 0, or -EINVAL
 * (perm not a permutation of 0..ndim-1, another elem size). */
int wb_permute(void *dst, const void *src, size_t elem, uint32_t ndim, const uint64_t *ext,
               const uint8_t *perm);

/* The contiguous byte ranges a box covers inside a row-major tensor, in increasing order and
 * maximally merged (a box spanning whole trailing dimensions is fewer, longer ranges).
 * Iterate with wb_ranges_next() until it returns false. */
struct wb_ranges {
    struct wb_shape shape;
    struct wb_box box;
    size_t elem;
    uint32_t outer;        /* dims [0, outer) are iterated; the rest form one run */
    uint64_t run_bytes;    /* bytes per range */
    uint64_t count, index; /* ranges in total, ranges produced */
    uint64_t idx[WB_MAX_DIMS];
};

/* Returns 0 or -EINVAL (ndim mismatch, box outside the tensor, elem 0). */
int wb_ranges_init(struct wb_ranges *r, const struct wb_shape *shape, const struct wb_box *box,
                   size_t elem_size);
/* Number of ranges (0 for an empty box). */
static inline uint64_t wb_ranges_count(const struct wb_ranges *r)
{
    return r->count;
}
/* Next range as byte offset from the tensor start and length; false when done. */
bool wb_ranges_next(struct wb_ranges *r, uint64_t *offset, uint64_t *len);

/* ---------------------------------------------------------------- msgpack wire codec */

/* Every message on the wire is the msgpack array [WB_WIRE_MAGIC, version, type, body]. */
enum { WB_WIRE_MAGIC = 0x57420a0b, WB_WIRE_VERSION = 1 };

/* Limits a decoder enforces before trusting a count from the wire. */
enum { WB_WIRE_MAX_STR = 4096, WB_WIRE_MAX_ARRAY = 1u << 24 };

/* Growable output buffer with a msgpack packer. On allocation failure the writer records
 * -ENOMEM and later calls do nothing; wb_mpw_finish() reports it. */
struct wb_mpw {
    uint8_t *buf;
    size_t len, cap;
    int err;
};

void wb_mpw_init(struct wb_mpw *w);
void wb_mpw_free(struct wb_mpw *w);
/* Starts an envelope; the caller then writes exactly one body object. */
void wb_mpw_envelope(struct wb_mpw *w, uint32_t type);
void wb_mpw_array(struct wb_mpw *w, uint32_t n);
void wb_mpw_map(struct wb_mpw *w, uint32_t n);
void wb_mpw_u64(struct wb_mpw *w, uint64_t v);
void wb_mpw_i64(struct wb_mpw *w, int64_t v);
void wb_mpw_f64(struct wb_mpw *w, double v);
void wb_mpw_bool(struct wb_mpw *w, bool v);
void wb_mpw_nil(struct wb_mpw *w);
void wb_mpw_str(struct wb_mpw *w, const char *s);
void wb_mpw_strn(struct wb_mpw *w, const char *s, size_t n);
void wb_mpw_bin(struct wb_mpw *w, const void *p, size_t n);
/* Appends bytes that are already msgpack (one or more whole objects) as they are. */
void wb_mpw_raw(struct wb_mpw *w, const void *p, size_t n);
/* Returns 0 or the first error. */
static inline int wb_mpw_finish(const struct wb_mpw *w)
{
    return w->err;
}

/* A zero-allocation pull decoder over a byte buffer. Every read checks the remaining length
 * and the expected type; any problem returns -EBADMSG and leaves the reader failed (every later
 * read also returns -EBADMSG), so a decode function can check once at the end. Why not
 * msgpack-c's unpacker: it allocates what a count on the wire claims before reading the items,
 * so a 5-byte message can ask for gigabytes. */
struct wb_mpr {
    const uint8_t *p;
    size_t left;
    int err;
};

void wb_mpr_init(struct wb_mpr *r, const void *buf, size_t len);
/* Opens an envelope: checks magic and version (-WB_E_VERSION for another version). */
int wb_mpr_envelope(struct wb_mpr *r, uint32_t *type);
/* Array/map headers; counts above max are -EBADMSG. */
int wb_mpr_array(struct wb_mpr *r, uint32_t max, uint32_t *n);
int wb_mpr_map(struct wb_mpr *r, uint32_t max, uint32_t *n);
int wb_mpr_u64(struct wb_mpr *r, uint64_t *v);
int wb_mpr_u32(struct wb_mpr *r, uint32_t *v);
int wb_mpr_i64(struct wb_mpr *r, int64_t *v);
int wb_mpr_f64(struct wb_mpr *r, double *v);
int wb_mpr_bool(struct wb_mpr *r, bool *v);
/* True (and consumes it) when the next object is nil. */
bool wb_mpr_nil(struct wb_mpr *r);
/* Copies a string into buf (NUL-terminated); strings of cap bytes or more are -EBADMSG. */
int wb_mpr_str(struct wb_mpr *r, char *buf, size_t cap);
/* Points at a bin or str payload inside the buffer without copying. */
int wb_mpr_bin(struct wb_mpr *r, const void **p, size_t *n, size_t max);
/* Skips one whole object of any type (nesting limited to 32 levels). */
int wb_mpr_skip(struct wb_mpr *r);
/* 0 when no error occurred and no bytes are left; -EBADMSG otherwise. */
int wb_mpr_end(const struct wb_mpr *r);

/* The shared structs' encodings (arrays, compact). */
void wb_wire_put_shape(struct wb_mpw *w, const struct wb_shape *s);
int wb_wire_get_shape(struct wb_mpr *r, struct wb_shape *s);
void wb_wire_put_box(struct wb_mpw *w, const struct wb_box *b);
int wb_wire_get_box(struct wb_mpr *r, struct wb_box *b);

/* A parameter as an agent registers it: name, dtype, global shape and the box it holds. */
enum { WB_NAME_MAX = 256 };
struct wb_tensor_meta {
    char name[WB_NAME_MAX];
    enum wb_dtype dtype;
    struct wb_shape shape;
    struct wb_box box;
};
void wb_wire_put_tensor_meta(struct wb_mpw *w, const struct wb_tensor_meta *t);
int wb_wire_get_tensor_meta(struct wb_mpr *r, struct wb_tensor_meta *t);

/* ---------------------------------------------------------------- synthetic source */

/* Deterministic parameter values for the demo, the tests and the benchmarks: the value of
 * element `index` (row-major linear index into the global tensor) of tensor `name` at (seed,
 * version) depends on nothing else, so a trainer holding any shard, a test computing the
 * expected rollout bytes and a rollout checking what landed agree without exchanging anything.
 * Values are FP32 in [-s, s) with s a per-tensor magnitude between 1/64 and 4, so FP8 block
 * scales differ between tensors. */
float wb_synth_value(const char *name, uint64_t seed, uint64_t version, uint64_t index);

/* Fills dst with the box `box` of the global tensor (name, dtype, shape) at (seed, version),
 * row-major with the box's extents, converted as fpbits.h converts. dtype: BF16, FP16 or FP32
 * (-EINVAL otherwise; -EINVAL when the box is not within the shape). */
int wb_synth_fill(const char *name, uint64_t seed, uint64_t version, enum wb_dtype dtype,
                  const struct wb_shape *shape, const struct wb_box *box, void *dst);
/* The same for a source that changes slowly: with period P > 0, version N + 1 differs from N in
 * the 1/P of the elements whose turn it is (each element draws a new value once every P
 * versions, at a phase of its own), the rest bit for bit equal — a fine-tuning step's pattern,
 * for delta updates. P = 0 is wb_synth_fill. Host memory only. */
int wb_synth_fill_change(const char *name, uint64_t seed, uint64_t version, uint64_t period,
                         enum wb_dtype dtype, const struct wb_shape *shape,
                         const struct wb_box *box, void *dst);
/* The same into device memory, by a CUDA kernel on `stream` (a cudaStream_t; NULL = the default
 * stream), asynchronously: the same bytes as wb_synth_fill. -WB_E_NOGPU in a build without
 * CUDA, -WB_E_CUDA when the launch fails. */
int wb_synth_fill_async(const char *name, uint64_t seed, uint64_t version, enum wb_dtype dtype,
                        const struct wb_shape *shape, const struct wb_box *box, void *dst,
                        void *stream);
/* Private to common/: the kernel launch behind wb_synth_fill_async (synth.cu). */
int cm_synth_launch(uint64_t key, float scale, enum wb_dtype dtype, const struct wb_shape *shape,
                    const struct wb_box *box, void *dst, void *stream);
/* The same with plain arguments (for language bindings): dtype by name, ndim entries each. */
int wb_synth_fill_args(const char *name, uint64_t seed, uint64_t version, const char *dtype,
                       uint32_t ndim, const uint64_t *shape, const uint64_t *box_off,
                       const uint64_t *box_ext, void *dst);

/* ---------------------------------------------------------------- checksums */

/* wb_sum64, the checksum of a write's bytes (what a trainer records and a rollout checks),
 * defined so that a GPU computes it in parallel and the host gets the same value: the n bytes
 * are cut into 4 KiB chunks, each chunk is hashed with XXH3-64 (seed 0) over exactly 4096 bytes
 * (the last one zero-padded), and the result is XXH3-64 with seed n over the array of the chunk
 * hashes (little-endian u64 each; no chunks for n = 0). A changed byte changes its chunk's hash,
 * and that the result, with XXH3's probability. */
enum { WB_SUM_CHUNK = 4096 };

static inline uint64_t wb_sum_nchunks(uint64_t n)
{
    return (n + WB_SUM_CHUNK - 1) / WB_SUM_CHUNK;
}
/* wb_sum64 of n bytes of host memory. */
uint64_t wb_sum64(const void *p, size_t n);
/* One chunk's hash: `valid` bytes at p (more than 4096: the first 4096), zero-padded. */
uint64_t wb_sum64_chunk(const void *p, uint64_t valid);
/* wb_sum64 of n bytes from their wb_sum_nchunks(n) chunk hashes in order. */
uint64_t wb_sum64_combine(const uint64_t *chunks, uint64_t n);

/* Pieces of GPU memory hashed in one kernel launch: one thread per chunk of every piece, the
 * chunk hashes copied back to pinned host memory, combined on the host. Reusable buffers; one
 * batch in flight per object. Built with CUDA only (-WB_E_NOGPU otherwise). */
struct wb_sum_piece {
    const void *p; /* device memory of the current device */
    uint64_t len;
};
struct wb_sum_gpu;
int wb_sum_gpu_new(struct wb_sum_gpu **out);
void wb_sum_gpu_free(struct wb_sum_gpu *g);
/* Enqueues the batch on `stream` (a cudaStream_t; NULL = the default stream) and returns: the
 * results are there once the stream has passed this point (an event, or a synchronize). The
 * pieces' bytes must be final for work enqueued on the stream from now on. */
int wb_sum_gpu_launch(struct wb_sum_gpu *g, const struct wb_sum_piece *pieces, size_t n,
                      void *stream);
/* wb_sum64 of piece i of the last batch (after the stream passed it). */
uint64_t wb_sum_gpu_result(const struct wb_sum_gpu *g, size_t i);
/* The same, waiting: sums[i] = wb_sum64 of piece i. */
int wb_sum_gpu_run(struct wb_sum_gpu *g, const struct wb_sum_piece *pieces, size_t n, void *stream,
                   uint64_t *sums);

/* ---------------------------------------------------------------- YAML config */

/* A loaded YAML file: the libyaml document plus its path, for error locations. */
struct wb_yaml;
/* A node inside a document (opaque; libyaml's yaml_node_t). */
struct wb_ynode;

/* Loads and parses a YAML file. Syntax errors return -WB_E_CONFIG with
 * "file:line:col: <libyaml problem>" appended to el. */
int wb_yaml_load(const char *path, struct wb_errlist *el, struct wb_yaml **out);
/* Same, from a string (name is used in messages in place of a path). */
int wb_yaml_load_string(const char *name, const char *text, struct wb_errlist *el,
                        struct wb_yaml **out);
void wb_yaml_free(struct wb_yaml *y);
/* The root node, or NULL for an empty document. */
const struct wb_ynode *wb_yaml_root(const struct wb_yaml *y);
/* "file:line:col" (1-based) of a node into buf; returns buf. */
char *wb_yaml_where(const struct wb_yaml *y, const struct wb_ynode *n, char *buf, size_t cap);

enum wb_ynode_kind { WB_YNODE_NONE = 0, WB_YNODE_SCALAR, WB_YNODE_SEQ, WB_YNODE_MAP };
enum wb_ynode_kind wb_ynode_kind(const struct wb_ynode *n);
/* Scalar text, or NULL when the node is not a scalar. */
const char *wb_ynode_scalar(const struct wb_ynode *n);
/* Number of items (sequence) or pairs (mapping); 0 otherwise. */
size_t wb_ynode_len(const struct wb_ynode *n);
/* i-th sequence item. */
const struct wb_ynode *wb_ynode_item(const struct wb_yaml *y, const struct wb_ynode *n, size_t i);
/* i-th mapping pair. */
void wb_ynode_pair(const struct wb_yaml *y, const struct wb_ynode *n, size_t i,
                   const struct wb_ynode **key, const struct wb_ynode **value);
/* Value for a scalar key in a mapping, or NULL. */
const struct wb_ynode *wb_ynode_get(const struct wb_yaml *y, const struct wb_ynode *map,
                                    const char *key);

/* Scalar conversions with strict checking (whole string, range). Return 0 or -EINVAL. */
int wb_parse_i64(const char *s, int64_t *out);
int wb_parse_u64(const char *s, uint64_t *out);
int wb_parse_f64(const char *s, double *out);
int wb_parse_bool(const char *s, bool *out);
/* Byte sizes: "4096", "64KiB", "1.5GiB", "2MB", "512M" (K/M/G/T = 1024 powers, kB/MB/GB =
 * 1000 powers). */
int wb_parse_size(const char *s, uint64_t *out);
/* Durations: "250ms", "2s", "1.5s", "10us", or a bare number of seconds. Out in ns. */
int wb_parse_duration(const char *s, uint64_t *out);

enum wb_cfg_type {
    WB_CFG_END = 0,  /* terminates a table */
    WB_CFG_STR,      /* char * (malloc'd; free with wb_cfg_free) */
    WB_CFG_I64,      /* int64_t */
    WB_CFG_U64,      /* uint64_t */
    WB_CFG_F64,      /* double */
    WB_CFG_BOOL,     /* bool */
    WB_CFG_SIZE,     /* uint64_t bytes, with unit suffixes */
    WB_CFG_DURATION, /* uint64_t nanoseconds, with unit suffixes */
    WB_CFG_ENUM,     /* int: index into `choices` (NULL-terminated) */
    WB_CFG_SECTION,  /* nested mapping parsed with `sub` at offset */
    WB_CFG_NODE,     /* const struct wb_ynode * left for the caller (lists, free-form parts) */
};

/* One row of a config table. `def` is the default as YAML text; NULL means the key is required.
 * For WB_CFG_SECTION, `def` non-NULL ("") means the whole section may be absent (its rows'
 * defaults then apply). */
struct wb_cfg_field {
    const char *key;
    enum wb_cfg_type type;
    const char *def;
    const char *doc;
    size_t offset;
    const char *const *choices;     /* WB_CFG_ENUM */
    const struct wb_cfg_field *sub; /* WB_CFG_SECTION */
};

/* Fills the struct at `out` from a mapping node by the table. Every problem is appended to el
 * as "file:line:col: <key path>: <problem>" (unknown key, wrong type, out-of-range value,
 * missing required key) and the function returns -WB_E_CONFIG after visiting the whole node;
 * on failure the strings it allocated are freed again, so nothing is left half-applied.
 * A NULL node is an empty mapping. Defaults are applied first. */
int wb_cfg_parse(const struct wb_yaml *y, const struct wb_ynode *node,
                 const struct wb_cfg_field *table, void *out, struct wb_errlist *el);
/* Applies only the defaults (used for absent sections and by programs without a file). */
int wb_cfg_defaults(const struct wb_cfg_field *table, void *out);
/* Frees the strings a parse allocated. */
void wb_cfg_free(const struct wb_cfg_field *table, void *out);
/* Prints the table as documented YAML: "key: default   # doc", sections indented. */
void wb_cfg_dump(const struct wb_cfg_field *table, void *file);

/* ---------------------------------------------------------------- GPU (optional) */

/* Number of usable CUDA devices: 0 when built without CUDA or when no GPU or driver is present.
 * Asked of the runtime once per process: a GPU it failed to report is never used. */
int wb_gpu_count(void);
/* Where p lives: the index of the GPU whose device memory it is, WB_GPU_HOST (host memory of any
 * kind, or no GPU), or WB_GPU_UNKNOWN when the runtime failed to say — never to be taken for
 * host memory (a host copy of device memory crashes, a socket send of it fails EFAULT). */
enum { WB_GPU_HOST = -1, WB_GPU_UNKNOWN = -2 };
int wb_gpu_ptr_device(const void *p);
/* True when p is CUDA device memory (always false without CUDA; false when unknown). */
bool wb_gpu_is_device_ptr(const void *p);
/* Whether this build was compiled with CUDA. */
bool wb_gpu_built(void);

/* ---------------------------------------------------------------- small helpers */

/* Grows a heap array for one more item: *cap doubles (or becomes `first` when 0) and the array
 * at *(T **)arrp is reallocated to *cap items of elem bytes. Callers call it when n == *cap.
 * On failure returns -ENOMEM and leaves both the array and *cap as they were. */
int wb_grow(void *arrp, size_t *cap, size_t first, size_t elem);

/* Monotonic clock in nanoseconds. */
uint64_t wb_now_ns(void);
/* 64 bits nobody can predict (getrandom; the clock, mixed, where that fails): session
 * identities, transfer epochs, memory keys. */
uint64_t wb_random_u64(void);
/* SipHash-2-4 of len bytes under a 128-bit key (common/siphash.c): the MAC of what agents tell
 * each other on the data plane, which nobody without the key can forge. */
enum { WB_MAC_KEY_BYTES = 16 };
uint64_t wb_siphash(const uint8_t key[WB_MAC_KEY_BYTES], const void *msg, size_t len);
/* "1.50 GiB" style formatting into buf; returns buf. */
char *wb_fmt_bytes(uint64_t bytes, char *buf, size_t cap);

/* Untrusted text made safe to print — tensor and file names read from a checkpoint, paths:
 * control characters (bytes below 0x20, DEL, the C1 controls U+0080..U+009F), bytes that are
 * not UTF-8 and the backslash are written as C escapes (\n, \t, \r, \\, \xHH), so what is
 * printed can neither start a line of its own nor send the terminal an escape sequence; UTF-8
 * text is kept. Into buf, always NUL-terminated: a result longer than cap - 1 bytes is cut and
 * ends in "..." (cap >= 4; 4 * strlen(s) + 1 always holds it whole). NULL is "(null)". */
char *wb_esc_str(const char *s, char *buf, size_t cap);
/* The same by value, for use within one expression (C11: the returned array lives until the
 * end of the statement), cut at WB_ESC_MAX - 1 bytes:
 *     fprintf(stderr, "tensor \"%s\"\n", wb_esc(name).s);                                    */
enum { WB_ESC_MAX = 1024 };
struct wb_esc_buf {
    char s[WB_ESC_MAX];
};
struct wb_esc_buf wb_esc(const char *s);

#define WB_ARRAY_LEN(a)                    (sizeof(a) / sizeof((a)[0]))
#define WB_CONTAINER_OF(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#ifdef __cplusplus
}
#endif

#endif /* WB_COMMON_H */
