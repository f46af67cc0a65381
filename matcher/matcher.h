/* matcher.h — the one public header of matcher/: parameter inventories, model-rule YAML, and
 * the match that decides, once per job, how every rollout tensor is built from trainer tensors.
 *
 * The planner consumes struct wb_match: a list of mappings, each "rollout tensor <- ordered
 * components (trainer tensor, box within it, box in the rollout tensor), transform, dtypes",
 * plus how the rollout tensor is sharded over a replica's GPUs (TP along a dim, per component
 * for fused tensors, EP over experts, or replicated).
 *
 * All tensors here are *global* (unsharded) tensors named as each side names them: trainer
 * side Hugging Face names, rollout side vLLM names. Shards held by trainer ranks (FSDP/EP/PP)
 * are the planner's business; shards held by rollout ranks are described by wb_shard below.
 */
#ifndef WB_MATCHER_H
#define WB_MATCHER_H

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- inventories */

struct wb_param {
    char name[WB_NAME_MAX];
    enum wb_dtype dtype;
    struct wb_shape shape;
};

/* A list of parameters with a name index. */
struct wb_inventory {
    struct wb_param *p;
    size_t n, cap;
    struct wb_inv_index *index; /* private hash index (matcher/) */
};

/* The largest tensor an inventory holds: 2^48 bytes (256 TiB) and no dim above that, so that
 * every product of dims, offsets and element sizes computed later fits in 64 bits. */
#define WB_INV_MAX_BYTES (1ull << 48)

void wb_inv_init(struct wb_inventory *inv);
void wb_inv_free(struct wb_inventory *inv);
/* Appends a parameter; -EEXIST for a duplicate name, -EINVAL for a bad dtype/shape,
 * -EOVERFLOW for a tensor over WB_INV_MAX_BYTES. */
int wb_inv_add(struct wb_inventory *inv, const char *name, enum wb_dtype dt,
               const struct wb_shape *shape);
/* Index of a name, or -1. */
ssize_t wb_inv_find(const struct wb_inventory *inv, const char *name);

/* Loads an inventory file (YAML or JSON): a mapping name -> {dtype: bf16, shape: [a, b]}
 * (or name -> [dtype, [a, b]]). Errors name file:line:col (YAML) and the tensor. On success
 * the file's parameters replace inv's contents; on failure inv is untouched. */
int wb_inv_load_file(const char *path, struct wb_inventory *inv, struct wb_errlist *el);
/* Writes an inventory as a file wb_inv_load_file reads back (JSON, which is also YAML). */
int wb_inv_save_file(const char *path, const struct wb_inventory *inv);

/* Generates an inventory from a Hugging Face config.json and a model-family YAML whose entries
 * are name templates with shapes written as arithmetic over config fields. `side` selects the
 * family file's "trainer" or "rollout" section. Like wb_inv_load_file, replaces inv's contents
 * on success only. With an FP8 block rule in the section (`fp8:` true for the config), values
 * are fp8_e4m3 and each gets an FP32 "<name><scale_suffix>" tensor of ceil(m/128) x ceil(n/128)
 * blocks over its last two dims. */
int wb_inv_generate(const char *family_yaml, const char *config_json, const char *side,
                    struct wb_inventory *inv, struct wb_errlist *el);
/* The same with a job's values of the family file's vars, "NAME=INTEGER[,NAME=INTEGER...]"
 * (NULL or "": none): they take precedence over config.json fields and the file's defaults,
 * and every NAME must be one of the file's vars. deepseek_v3.yaml's mtp=1 adds the
 * multi-token-prediction layers (configs/models/README.md). */
int wb_inv_generate_vars(const char *family_yaml, const char *config_json, const char *vars,
                         const char *side, struct wb_inventory *inv, struct wb_errlist *el);
/* The same for one of the family file's trainer namings (`namings:`, e.g. "megatron"; NULL or
 * "": the file's first). The naming selects the trainer blocks; the rollout side is the same
 * for every naming. A name the file does not list is -WB_E_CONFIG naming the file's namings. */
int wb_inv_generate_named(const char *family_yaml, const char *config_json, const char *vars,
                          const char *naming, const char *side, struct wb_inventory *inv,
                          struct wb_errlist *el);
/* Bounds of one generation, so that a config.json value never makes it run for long or grow
 * without end: loop iterations of a section, all levels and blocks counted together, and
 * generated tensors. Past either the generator stops with an error. */
enum { WB_GEN_MAX_ITERS = 1 << 20, WB_GEN_MAX_TENSORS = 1 << 19 };

/* ---------------------------------------------------------------- rules and matching */

/* Model rules loaded from configs/models/<family>.yaml (opaque). */
struct wb_match_rules;

int wb_match_rules_load(const char *path, struct wb_match_rules **out, struct wb_errlist *el);
void wb_match_rules_free(struct wb_match_rules *r);
/* Optional: binds a Hugging Face config.json so that expressions in the rules (a shard's
 * head_dim) read the model's values; without it they use the family file's `vars` defaults.
 * Returns -WB_E_CONFIG (message in el) when the file cannot be read. */
int wb_match_rules_bind_config(struct wb_match_rules *r, const char *config_json,
                               struct wb_errlist *el);
/* Optional: the job's values of the family's vars, as for wb_inv_generate_vars() (the same
 * text must be given to both, so that both sides and the rules agree). */
int wb_match_rules_set_vars(struct wb_match_rules *r, const char *vars, struct wb_errlist *el);
/* Optional: the trainer naming the match and wb_match_rules_generate() use (NULL or "": the
 * file's first). Only the rules of that naming apply. -WB_E_CONFIG for a name the file does
 * not list. Give wb_inv_generate_named() the same naming. */
int wb_match_rules_set_naming(struct wb_match_rules *r, const char *naming, struct wb_errlist *el);
/* The file's namings, in order (the first the default), and the one selected now. */
size_t wb_match_rules_namings(const struct wb_match_rules *r, const char *const **names);
const char *wb_match_rules_naming(const struct wb_match_rules *r);
/* Whether the family file has a var of this name (`vars:`): the controller sets mesh_<dim>
 * vars from the trainers' registered device mesh. */
bool wb_match_rules_has_var(const struct wb_match_rules *r, const char *name);
/* Optional: the rollout inventory matched with these rules is not generated from the family
 * file (an inventory file, a test's few tensors) and may hold part of the model. A rule that
 * matches none of its names is then not an error (it may describe tensors this inventory leaves
 * out); by default it is (a typo in its pattern: the tensors it was meant for fall through to a
 * later rule). A rule whose names earlier rules took is an error either way. */
void wb_match_rules_partial_rollout(struct wb_match_rules *r, bool partial);
/* wb_inv_generate_vars() from the family file the rules were loaded from and the rules' vars
 * (wb_match_rules_set_vars), without reading the family file again; config.json is parsed on
 * its first use by these rules (here or wb_match_rules_bind_config) and kept. The same
 * inventory and the same messages as wb_inv_generate_vars(path, config_json, vars, side). */
int wb_match_rules_generate(struct wb_match_rules *r, const char *config_json, const char *side,
                            struct wb_inventory *inv, struct wb_errlist *el);

/* What the trainer agent does to the components before writing. */
enum wb_xform {
    WB_XFORM_COPY = 0,  /* same dtype: bytes move as they are */
    WB_XFORM_CAST,      /* dtype conversion (BF16<->FP16<->FP32) */
    WB_XFORM_FP8_BLOCK, /* FP8 E4M3 128x128 block quantization + FP32 scale_inv tensor */
};

/* How a rollout tensor is split over the GPUs of one replica. */
enum wb_shard_kind {
    WB_SHARD_REPLICATE = 0, /* every rank holds the whole tensor */
    WB_SHARD_TP,            /* split along `dim` over tp ranks (per component when fused) */
    WB_SHARD_EP,            /* split along dim 0 (experts) over ep ranks */
};

/* ep1_tp_dim value: without EP, tp rank 0 holds the whole tensor and the other tp ranks hold
 * a tensor of the same shape that nothing writes (vLLM loads FusedMoE's w2 bias on rank 0 and
 * zeros on the others, so the all-reduce adds it once). */
enum { WB_SHARD_RANK0 = -2 };

struct wb_shard {
    enum wb_shard_kind kind;
    uint32_t dim;
    /* WB_SHARD_EP only: with ep == 1 (no expert parallelism) the tensor is split over the tp
     * ranks along this dim, per component, as vLLM's FusedMoE does; -1 replicates it;
     * WB_SHARD_RANK0 puts it whole on tp rank 0 only. */
    int32_t ep1_tp_dim;
    /* WB_SHARD_TP only, 0 or a padding multiple (vLLM's VocabParallelEmbedding/ParallelLMHead:
     * 64): the dim is padded up to a multiple of `pad`, the padded size is split evenly over
     * the tp ranks and each rank's local tensor is padded/tp long along it. A rank holds the
     * real rows of its range first; the padding rows after them are never written (they keep
     * what the engine put there when it loaded the model: vLLM's weight loader zeroes them).
     * The rollout inventory keeps the real size: padding exists only in the local tensors. */
    uint32_t pad;
};

/* One trainer tensor's contribution to a rollout tensor. */
struct wb_component {
    uint32_t trainer;  /* index into the trainer inventory */
    struct wb_box src; /* box within the trainer tensor (usually all of it) */
    struct wb_box dst; /* box within the rollout tensor (same extents, up to stacking: a
                          stacked component has dst.ndim == src.ndim + 1 with ext[0] == 1) */
    /* Heads in this component along the TP dim when the rule gives them (GQA k/v), else 0.
     * A component with fewer heads than TP ranks is replicated: rank r holds head
     * r * heads / tp. */
    uint32_t heads;
    /* Index of the trainer's FP32 scale tensor when the trainer side is itself FP8 block-
     * quantized (checkpoint broadcast: xform COPY of the values; the scales are copied by a
     * mapping of their own, fp8_scales), else -1. */
    int32_t trainer_scale;
    /* A transpose (any dim permutation): when `permuted`, src and dst have the same ndim n,
     * dst.ext[k] == src.ext[perm[k]], and dst element (i_0, ..., i_{n-1}) is src element j with
     * j[perm[k]] = i_k for every k: dst = src.permute(perm) in PyTorch terms (gpt-oss experts:
     * trainer [E, H, 2I], rollout [E, 2I, H], perm [0, 2, 1]). Not permuted: dims correspond
     * in order, up to stacking. The planner works in the permuted tensor's coordinates and
     * has the trainer transpose its shard first (a route table's PERMUTE op). */
    bool permuted;
    uint8_t perm[WB_MAX_DIMS];
    /* A grouped split's piece (Megatron's linear_qkv: q of query group g > 0): it continues the
     * rollout part of the previous piece of the same named component, so that the rollout's TP
     * split sees one part per name (one q, one k, one v, heads summed), as vLLM shards it. */
    bool joins_prev;
};
/* An unstacking component (trainer stacked, rollout per expert) has src.ndim == dst.ndim + 1
 * with src.ext[0] == 1: the leading 1 changes no element order. */

/* How the mapping was formed, for counts and messages. */
enum wb_map_kind {
    WB_MAP_RENAME = 0, /* one trainer tensor, same shape */
    WB_MAP_FUSE,       /* concatenation of several trainer tensors along a dim */
    WB_MAP_STACK,      /* per-expert trainer tensors stacked along a new dim 0 (+ fused) */
    WB_MAP_UNSTACK,    /* one slice (and chunk) of a stacked trainer tensor */
    WB_MAP_TIE,        /* tied weights: built from another trainer tensor (lm_head) */
    WB_MAP_SPLIT,      /* one trainer tensor fused already, cut into its components (Phi-3's
                          qkv_proj): each a box of it at the same place in the rollout tensor */
};

struct wb_mapping {
    uint32_t rollout; /* index of the rollout value tensor */
    int32_t scale;    /* index of the rollout scale tensor (FP8), or -1 */
    enum wb_xform xform;
    enum wb_dtype src_dtype, dst_dtype;
    struct wb_shard shard;
    uint32_t ncomp;
    struct wb_component *comp; /* ordered along the fused/stacked dim */
    uint32_t rule_line;        /* line of the rule that produced it, for messages */
    enum wb_map_kind kind;
    /* Quantization block edge (128) when the values are FP8 block-quantized — scale >= 0, or
     * an FP8 copy whose scales have a mapping of their own (fp8_scales below) — else 0. A TP
     * split must not cut the values inside a block. */
    uint32_t block;
    /* This mapping copies the FP32 scales of FP8 trainer tensors (a checkpoint broadcast into
     * FP8 rollouts): its rollout tensor is the scale tensor of an FP8 copy's values, its
     * components the trainer scale tensors, boxes in blocks. */
    bool fp8_scales;
};

/* The match result. Owns its mappings; refers to the two inventories by index. */
struct wb_match {
    struct wb_mapping *map;
    size_t n;
    size_t nignored;  /* trainer tensors declared ignorable and left out */
    char *rules_path; /* the rules file, for messages (owned) */
};

/* Matches trainer against rollout parameters by the rules. Every problem found is appended to
 * el (all of them, not only the first), each naming the tensor(s), the rule (file:line) and
 * the shapes involved; the return is then -WB_E_MATCH and *out is untouched. */
int wb_match_run(const struct wb_match_rules *rules, const struct wb_inventory *trainer,
                 const struct wb_inventory *rollout, struct wb_match **out, struct wb_errlist *el);
void wb_match_free(struct wb_match *m);

/* ---------------------------------------------------------------- rollout sharding */

/* One piece of a rollout rank's local tensor: the box of the global rollout tensor it holds
 * and where that lands in the rank's local tensor. */
struct wb_local_piece {
    struct wb_box global;
    struct wb_box local;
};

/* The local shape rank (tp_rank of tp, ep_rank of ep) holds of mapping m's rollout tensor, and
 * its pieces (at most WB_MAX_PIECES: one per component when sharded per component). The
 * pieces cover every element of the local tensor that the trainer writes; they may cover less
 * than the local shape (vocab padding rows, shard.pad) or nothing at all (a rank holding only
 * padding, or a WB_SHARD_RANK0 tensor on tp rank > 0): the rest is never written.
 * Returns -WB_E_PLAN with a message in el when the split is impossible (dimension not
 * divisible, quant blocks cut by a shard edge). */
enum { WB_MAX_PIECES = 16 };
int wb_mapping_local(const struct wb_match *mt, const struct wb_inventory *rollout,
                     const struct wb_mapping *m, uint32_t tp_rank, uint32_t tp, uint32_t ep_rank,
                     uint32_t ep, struct wb_shape *local_shape, struct wb_local_piece *pieces,
                     uint32_t *npieces, struct wb_errlist *el);

/* The box of the FP32 scale tensor that holds the scales of value box `value` (block-quantized
 * over its last two dims in block x block tiles; leading dims are copied). Returns -EINVAL when
 * the box starts inside a block (its end may be the tensor's unaligned end). */
int wb_scale_box(const struct wb_box *value, uint32_t block, struct wb_box *scale);

#ifdef __cplusplus
}
#endif

#endif /* WB_MATCHER_H */
