/* mpriv.h — private to matcher/: the small integer expression language used by model-family
 * files (shapes, conditions, derived values), name templates, name patterns with captures,
 * config.json values, and the rules structure shared by rules.c and match.c.
 *
 * Why a hand-written evaluator: shapes in family files are short arithmetic over config
 * fields ("num_attention_heads*head_dim"). A general scripting engine would accept far more
 * than we want to trust and give worse error messages; this one knows integers, + - * / %,
 * comparisons, && || !, ?: and five functions, checks every operation for overflow, and says
 * which token or field is wrong. */
#ifndef WB_MATCHER_MPRIV_H
#define WB_MATCHER_MPRIV_H

#include "matcher/matcher.h"

/* ---------------------------------------------------------------- config.json values */

enum wb_jkind { WB_J_INT = 0, WB_J_LIST, WB_J_OTHER };

struct wb_jval {
    char *name; /* flattened: "quantization_config.quant_method" */
    enum wb_jkind kind;
    int64_t i;     /* WB_J_INT (booleans are 0/1) */
    bool is_bool;  /* WB_J_INT from true/false: a truth value, never a number */
    int64_t *list; /* WB_J_LIST: an array of integers */
    size_t nlist;
    char *text; /* WB_J_OTHER: the value as JSON text, for messages */
    char *str;  /* WB_J_OTHER from a JSON string: the string itself, else NULL */
};

/* The fields of a config.json, sorted by name. Nulls are left out (so defined() is false). */
struct wb_jcfg {
    char *path;
    struct wb_jval *v;
    size_t n;
};

int mx_jcfg_load(const char *path, struct wb_jcfg **out, struct wb_errlist *el);
void mx_jcfg_free(struct wb_jcfg *c);
const struct wb_jval *mx_jcfg_get(const struct wb_jcfg *c, const char *name, size_t len);

/* ---------------------------------------------------------------- expressions */

struct wb_expr; /* a compiled expression (opaque) */

/* A named value visible to an expression (loop variables). */
struct wb_xvar {
    const char *name;
    int64_t value;
};

/* Derived values ("vars" of a family file): name = expression, used when the config lacks
 * the name. Evaluated on demand. */
struct wb_xderived {
    char *name;
    struct wb_expr *e;
    char where[300]; /* file:line:col of the definition */
};

/* Where an expression looks names up: loop variables first, then the job's values of the
 * family's vars (sets), then the config, then the derived values. */
struct wb_xenv {
    const struct wb_xvar *vars;
    size_t nvars;
    const struct wb_xvar *sets; /* per-job values ("mtp=1"), over config and defaults */
    size_t nsets;
    const struct wb_jcfg *cfg; /* may be NULL */
    const struct wb_xderived *derived;
    size_t nderived;
    unsigned depth; /* recursion guard for derived values */
};

/* Compiles text. On a syntax error returns -EINVAL and writes "<problem> at column N" into
 * err. */
int mx_expr_compile(const char *text, struct wb_expr **out, char *err, size_t errcap);
void mx_expr_free(struct wb_expr *e);
const char *mx_expr_text(const struct wb_expr *e);

/* Evaluates. Errors (message in err): -ENOENT an unknown name (err is "missing field 'x'"),
 * -EDOM division by zero, -ERANGE overflow, -EINVAL a non-integer value, a config boolean
 * used as a number (arithmetic, <, >) or a bad call. For conditions: a boolean result is
 * fine. */
int mx_expr_eval(const struct wb_expr *e, struct wb_xenv *env, int64_t *out, char *err,
                 size_t errcap);
/* The same for numbers (shapes, loop bounds, names): a config boolean as the result is
 * -EINVAL "field 'x' is a boolean (true), not a number". */
int mx_expr_eval_num(const struct wb_expr *e, struct wb_xenv *env, int64_t *out, char *err,
                     size_t errcap);

/* ---------------------------------------------------------------- name templates */

/* "model.layers.{layer}.mlp" with expressions in braces, rendered by the generator. */
struct wb_tmpl;
int mx_tmpl_compile(const char *text, struct wb_tmpl **out, char *err, size_t errcap);
void mx_tmpl_free(struct wb_tmpl *t);
/* Renders into buf (NUL-terminated); -ENAMETOOLONG when it does not fit; eval errors as
 * mx_expr_eval. */
int mx_tmpl_render(const struct wb_tmpl *t, struct wb_xenv *env, char *buf, size_t cap, char *err,
                   size_t errcap);

/* ---------------------------------------------------------------- name patterns */

/* A pattern over tensor names: literal text, {NAME} capturing a decimal integer, and *
 * capturing any text. Used by rules (rollout templates, trainer templates with captures
 * substituted) and by ignore/quantize lists. */
enum { WB_PAT_MAX_CAPS = 8 };

struct wb_pat_seg {
    enum { WB_SEG_LIT, WB_SEG_CAP, WB_SEG_STAR } kind;
    char *text; /* literal text, or the capture name */
    size_t len;
};

struct wb_pat {
    char *src;
    struct wb_pat_seg *seg;
    size_t nseg;
    size_t nstar;
};

struct wb_caps {
    size_t n;
    const char *name[WB_PAT_MAX_CAPS]; /* capture name, or "*" */
    const char *at[WB_PAT_MAX_CAPS];
    size_t len[WB_PAT_MAX_CAPS];
};

int mx_pat_compile(const char *text, struct wb_pat *p, char *err, size_t errcap);
void mx_pat_free(struct wb_pat *p);
/* Matches a whole name; captures filled on success. */
bool mx_pat_match(const struct wb_pat *p, const char *name, struct wb_caps *caps);
/* Builds a name from a template, replacing {NAME} by the capture of that name (or by
 * override_value when NAME equals override_name) and the i-th * by the i-th * capture.
 * Returns 0, -ENOENT (a capture is missing) or -ENAMETOOLONG. */
int mx_pat_subst(const struct wb_pat *t, const struct wb_caps *caps, const char *override_name,
                 uint64_t override_value, char *buf, size_t cap);
/* Whether every name `inner` matches is matched by `outer` too (a later rule that an earlier
 * one shadows whole): 1 or 0; -E2BIG when it was not decided: the patterns too long, the search
 * too wide (1,024 pairs of state sets) or *budget (steps, decremented; shared by a caller's
 * calls so that their work is bounded) spent; -ENOMEM. */
int mx_pat_covers(const struct wb_pat *outer, const struct wb_pat *inner, uint64_t *budget);
/* True when the capture name occurs in the pattern. */
bool mx_pat_has_cap(const struct wb_pat *p, const char *name);

/* ---------------------------------------------------------------- rules */

enum wb_rule_kind { WB_RULE_FROM, WB_RULE_FUSE, WB_RULE_STACK, WB_RULE_UNSTACK };

/* One named component of a split rule: `size` elements along the rule's dim. */
struct wb_split {
    char *name;
    struct wb_expr *size;
    bool drop; /* named `_`: cut off, not moved (Megatron's padded vocab rows) */
};
enum { WB_SPLIT_MAX = 16 }; /* as many as a rollout rank's pieces (WB_MAX_PIECES) */

struct wb_rule {
    uint32_t line, col;
    enum wb_rule_kind kind;
    struct wb_pat rollout;
    struct wb_pat *from; /* trainer templates, in concatenation order */
    size_t nfrom;
    uint32_t dim;              /* rollout dim of concatenation / chunking */
    char *stack_var;           /* STACK: capture iterated along rollout dim 0 */
    char *index_var;           /* UNSTACK: capture giving the slice of trainer dim 0 */
    uint32_t chunk_i, chunk_n; /* UNSTACK: take chunk i of n along dim (n == 0: none) */
    struct wb_pat tied;        /* src NULL when absent */
    uint32_t nperm;            /* FROM: rollout dim k is trainer dim perm[k]; 0: no permute */
    uint8_t perm[WB_MAX_DIMS];
    struct wb_shard shard;
    struct wb_expr *head_dim; /* NULL when the rule gives no heads */
    /* FROM only: the one trainer tensor is already fused (Phi-3's qkv_proj = [q; k; v]); it is
     * cut along `dim` into these components, in order, so that a TP split takes each one's
     * share as it takes a fused rule's. nsplit 0: not split. */
    struct wb_split *split;
    size_t nsplit;
    /* with split: the trainer tensor is this many repetitions of the components along dim
     * (Megatron's linear_qkv per query group); NULL: one */
    struct wb_expr *groups;
    uint32_t naming;   /* the namings the rule belongs to (a bit mask over the file's namings) */
    bool optional;     /* may build no rollout tensor (MTP layers, configs without biases) */
    size_t suffix_len; /* literal tail of the rollout pattern, for a quick reject */
    const char *suffix;
};

struct wb_match_rules {
    char *path;
    char *family;
    struct wb_rule *r;
    size_t n;
    char *scale_suffix; /* "_scale_inv" */
    struct wb_pat *fp8; /* rollout names that may be FP8 block-quantized */
    size_t nfp8;
    uint32_t fp8_line;
    struct wb_pat *ign_trainer, *ign_rollout;
    size_t nign_trainer, nign_rollout;
    struct wb_xderived *vars;
    size_t nvars;
    const struct wb_jcfg *cfg; /* bound config.json (one of cfgs), or NULL */
    /* The family file, open for generating inventories from it (wb_match_rules_generate),
     * and every config.json read for these rules, each parsed once (its path: cfgs[i]->path).
     * vars and model_types are fam's. */
    struct wb_family *fam;
    struct wb_jcfg **cfgs;
    size_t ncfgs;
    char **model_types; /* as struct wb_family's */
    size_t nmodel_types;
    char model_type_at[300];
    bool partial_rollout; /* wb_match_rules_partial_rollout */
    uint32_t naming;      /* the selected naming (index into fam->namings) */
    struct wb_xvar *sets; /* the job's values of vars (wb_match_rules_set_vars) */
    size_t nsets;
    char *sets_buf;
};

/* Trainer namings a family file may list (`namings:`), so that a naming set is a uint32_t. */
enum { WB_NAMING_MAX = 16 };

/* A model-family file opened and checked at the top level (generate.c); shared by the
 * generator and the rules loader, which read different sections of the same file. */
struct wb_family {
    struct wb_yaml *y;
    char *family, *description;
    const struct wb_ynode *vars, *trainer, *rollout, *rules;
    struct {
        char *scale_suffix; /* (quant.block is checked to be WB_FP8_BLOCK, and not kept) */
        const struct wb_ynode *fp8;
    } quant;
    struct {
        const struct wb_ynode *trainer, *rollout;
    } ignore;
    struct wb_xderived *dv; /* compiled vars */
    size_t ndv;
    char **model_types; /* config.json model_type values covered; none: any */
    size_t nmodel_types;
    char model_type_at[300];
    struct wb_xderived *checks; /* conditions that must hold (name: the expression text) */
    size_t nchecks;
    /* `namings:` — the trainer namings the file describes, the first the default; a file
     * without the key has one, "hf". A block or rule's naming set is a bit mask over them. */
    char *namings[WB_NAMING_MAX];
    size_t nnamings;
};

int mx_family_open(const char *path, struct wb_family **out, struct wb_errlist *el);
/* A `naming:` key (a name or a list of the file's namings) as a bit mask; node NULL: every
 * naming. An unknown name is an error at its place. */
int mx_naming_mask(const struct wb_family *f, const struct wb_ynode *node, uint32_t *mask,
                   struct wb_errlist *el);
/* The index of naming `name` in the file's namings (NULL or "": the first, the default); an
 * unknown name is an error naming the file's namings. */
int mx_naming_index(const struct wb_family *f, const char *path, const char *name, uint32_t *idx,
                    struct wb_errlist *el);
void mx_family_close(struct wb_family *f);
/* wb_inv_generate_vars on a family file opened once (the fuzz target generates thousands of
 * inventories from one family; the family is only read). */
int mx_inv_generate_family(struct wb_family *f, const char *family_yaml, const char *config_json,
                           const char *vars, const char *naming, const char *side,
                           struct wb_inventory *inv, struct wb_errlist *el);
/* The generation itself, from a family and a config.json already read and the job's vars
 * already parsed (no message for running out of memory: the callers add theirs). */
int mx_inv_generate_parsed(struct wb_family *f, const char *family_yaml, const struct wb_jcfg *cfg,
                           const struct wb_xvar *sets, size_t nsets, uint32_t naming,
                           const char *side, struct wb_inventory *inv, struct wb_errlist *el);
void mx_family_vars_free(struct wb_xderived *v, size_t n);
void mx_family_free_types(char **types, size_t n);

/* config.json's model_type must be one of types (n == 0: anything); `at` is where the family
 * file lists them. Returns 0 or -WB_E_CONFIG with one message. */
int mx_check_model_type(char *const *types, size_t n, const char *at, const struct wb_jcfg *cfg,
                        struct wb_errlist *el);
/* config.json's quantization_config, when present, must be what quant/ produces: quant_method
 * fp8, weight_block_size [128, 128], fmt e4m3 and activation_scheme dynamic when given, and no
 * other key. Returns 0 or -WB_E_CONFIG with a message per offending key. */
int mx_check_quant_config(const struct wb_jcfg *cfg, struct wb_errlist *el);

/* Parses a job's values of a family's vars, "NAME=INTEGER[,NAME=INTEGER...]" (NULL or ""
 * sets nothing). Every NAME must be one of the family's vars (dv, from the file at `path`).
 * On success *out holds the values, their names pointing into *buf (free both). */
int mx_vars_parse(const char *text, const struct wb_xderived *dv, size_t ndv, const char *path,
                  struct wb_xvar **out, size_t *nout, char **buf, struct wb_errlist *el);

/* A short label for a tensor in messages: "q_proj" for "model.layers.0.self_attn.q_proj.weight". */
void mx_name_label(const char *name, char *buf, size_t cap);

#endif /* WB_MATCHER_MPRIV_H */
