/* layout.c — cluster layout files: the trainer (mesh, placement rules, residence), the rollout
 * (replicas, TP, EP) and the hardware model behind estimates, loaded with common's table-driven
 * YAML loader, plus the layout checks that need no inventory.
 *
 * Lists (mesh dims, placement rules) come out of the table loader as WB_CFG_NODE and are walked
 * here, each item again through a table, so every key is checked and every message carries
 * file:line:col. Placement values (`shard(0)`, `layer`, ...) are keyed by mesh dim names, which
 * are only known at run time, so they are parsed by hand against the declared dims. */
#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "planner/plan_int.h"

/* ---------------------------------------------------------------- hardware */

struct hw_raw {
    char *name;
    double nic_gbps;
    uint64_t nics_per_gpu;
    double nic_efficiency;
    double nvlink_GBps, h2d_GBps, copy_GBps, quant_GBps;
    uint64_t kernel_ns, write_submit_ns, barrier_ns, collective_ns;
};

static const struct wb_cfg_field hw_table[] = {
    {"name", WB_CFG_STR, "", "model name (for reports)", offsetof(struct hw_raw, name)},
    {"nic_gbps", WB_CFG_F64, NULL, "line rate of one NIC, Gbit/s",
     offsetof(struct hw_raw, nic_gbps)},
    {"nics_per_gpu", WB_CFG_U64, "1", "NICs one GPU stripes its writes over",
     offsetof(struct hw_raw, nics_per_gpu)},
    {"nic_efficiency", WB_CFG_F64, "1.0", "fraction of line rate a tuned WRITE stream reaches",
     offsetof(struct hw_raw, nic_efficiency)},
    {"nvlink_GBps", WB_CFG_F64, NULL, "one GPU's NVLink bandwidth per direction, GB/s",
     offsetof(struct hw_raw, nvlink_GBps)},
    {"h2d_GBps", WB_CFG_F64, NULL, "pinned host-to-device copy, GB/s",
     offsetof(struct hw_raw, h2d_GBps)},
    {"copy_GBps", WB_CFG_F64, NULL, "device-to-device copy (fuse/pack/cast), GB/s read",
     offsetof(struct hw_raw, copy_GBps)},
    {"quant_GBps", WB_CFG_F64, NULL, "FP8 block quantization, GB/s of input",
     offsetof(struct hw_raw, quant_GBps)},
    {"kernel_launch", WB_CFG_DURATION, "5us", "cost of one GPU op launch",
     offsetof(struct hw_raw, kernel_ns)},
    {"write_submit", WB_CFG_DURATION, NULL, "CPU cost to post one WRITE on one NIC",
     offsetof(struct hw_raw, write_submit_ns)},
    {"barrier", WB_CFG_DURATION, NULL, "latency of one global barrier",
     offsetof(struct hw_raw, barrier_ns)},
    {"collective_launch", WB_CFG_DURATION, "20us", "fixed cost of one all-gather call",
     offsetof(struct hw_raw, collective_ns)},
    {0},
};

static int hw_from_node(const struct wb_yaml *y, const struct wb_ynode *n, struct wb_hw *out,
                        struct wb_errlist *el)
{
    struct hw_raw raw;
    memset(&raw, 0, sizeof(raw));
    int r = wb_cfg_parse(y, n, hw_table, &raw, el);
    if (r == 0) {
        /* every bad value, each at its own key's value (the key may be absent: then its
         * default is at fault, and the mapping is where to add it) */
        const struct {
            const char *key;
            bool bad;
            const char *want;
        } checks[] = {
            {"nic_gbps", !(isfinite(raw.nic_gbps) && raw.nic_gbps > 0), "must be a number > 0"},
            {"nics_per_gpu", raw.nics_per_gpu == 0 || raw.nics_per_gpu > 64,
             "must be from 1 to 64"},
            {"nic_efficiency", !(raw.nic_efficiency > 0 && raw.nic_efficiency <= 1),
             "must be in (0, 1]"},
            {"nvlink_GBps", !(isfinite(raw.nvlink_GBps) && raw.nvlink_GBps > 0),
             "must be a number > 0"},
            {"h2d_GBps", !(isfinite(raw.h2d_GBps) && raw.h2d_GBps > 0), "must be a number > 0"},
            {"copy_GBps", !(isfinite(raw.copy_GBps) && raw.copy_GBps > 0), "must be a number > 0"},
            {"quant_GBps", !(isfinite(raw.quant_GBps) && raw.quant_GBps > 0),
             "must be a number > 0"},
        };
        for (size_t i = 0; i < WB_ARRAY_LEN(checks); i++) {
            if (!checks[i].bad)
                continue;
            const struct wb_ynode *at = wb_ynode_get(y, n, checks[i].key);
            char where[512];
            wb_errlist_add(el, "%s: %s: %s, got %s",
                           wb_yaml_where(y, at ? at : n, where, sizeof(where)), checks[i].key,
                           checks[i].want,
                           at && wb_ynode_scalar(at) ? wb_ynode_scalar(at) : "its default");
            r = -WB_E_CONFIG;
        }
    }
    if (r) {
        wb_cfg_free(hw_table, &raw);
        return r;
    }
    memset(out, 0, sizeof(*out));
    out->name = raw.name;
    out->nic_gbps = raw.nic_gbps;
    out->nics_per_gpu = raw.nics_per_gpu;
    out->nic_efficiency = raw.nic_efficiency;
    out->nvlink_Bps = raw.nvlink_GBps * 1e9;
    out->h2d_Bps = raw.h2d_GBps * 1e9;
    out->copy_Bps = raw.copy_GBps * 1e9;
    out->quant_Bps = raw.quant_GBps * 1e9;
    out->kernel_s = (double)raw.kernel_ns * 1e-9;
    out->write_submit_s = (double)raw.write_submit_ns * 1e-9;
    out->barrier_s = (double)raw.barrier_ns * 1e-9;
    out->gather_s = (double)raw.collective_ns * 1e-9;
    return 0;
}

int wb_hw_set(struct wb_hw *hw, const char *key, const char *value, char *err, size_t cap)
{
    static const struct {
        const char *key;
        char kind; /* r: rate in GB/s, f: a number > 0, e: in (0, 1], n: 1..64, t: a duration */
        size_t off;
    } keys[] = {
        {"nic_gbps", 'f', offsetof(struct wb_hw, nic_gbps)},
        {"nics_per_gpu", 'n', offsetof(struct wb_hw, nics_per_gpu)},
        {"nic_efficiency", 'e', offsetof(struct wb_hw, nic_efficiency)},
        {"nvlink_GBps", 'r', offsetof(struct wb_hw, nvlink_Bps)},
        {"h2d_GBps", 'r', offsetof(struct wb_hw, h2d_Bps)},
        {"copy_GBps", 'r', offsetof(struct wb_hw, copy_Bps)},
        {"quant_GBps", 'r', offsetof(struct wb_hw, quant_Bps)},
        {"kernel_launch", 't', offsetof(struct wb_hw, kernel_s)},
        {"write_submit", 't', offsetof(struct wb_hw, write_submit_s)},
        {"barrier", 't', offsetof(struct wb_hw, barrier_s)},
        {"collective_launch", 't', offsetof(struct wb_hw, gather_s)},
    };
    size_t i = 0;
    while (i < WB_ARRAY_LEN(keys) && strcmp(keys[i].key, key) != 0)
        i++;
    if (i == WB_ARRAY_LEN(keys)) {
        size_t n = (size_t)snprintf(err, cap, "unknown hardware key \"%s\" (one of", key);
        for (size_t k = 0; k < WB_ARRAY_LEN(keys) && n < cap; k++)
            n += (size_t)snprintf(err + n, cap - n, " %s", keys[k].key);
        if (n < cap)
            snprintf(err + n, cap - n, ")");
        return -WB_E_CONFIG;
    }
    uint8_t *at = (uint8_t *)hw + keys[i].off;
    char *end = NULL;
    if (keys[i].kind == 't') {
        uint64_t ns;
        if (wb_parse_duration(value, &ns)) {
            snprintf(err, cap, "%s: expected a duration (2us, 1ms), got \"%s\"", key, value);
            return -WB_E_CONFIG;
        }
        *(double *)at = (double)ns * 1e-9;
        return 0;
    }
    errno = 0;
    double v = strtod(value, &end);
    bool ok = *value && end && !*end && !errno && isfinite(v) && v > 0;
    if (keys[i].kind == 'e')
        ok = ok && v <= 1;
    if (keys[i].kind == 'n')
        ok = ok && v <= 64 && v == (double)(uint64_t)v;
    if (!ok) {
        snprintf(err, cap, "%s: %s, got \"%s\"", key,
                 keys[i].kind == 'e'   ? "must be in (0, 1]"
                 : keys[i].kind == 'n' ? "must be a whole number from 1 to 64"
                                       : "must be a number > 0",
                 value);
        return -WB_E_CONFIG;
    }
    if (keys[i].kind == 'n')
        *(uint64_t *)at = (uint64_t)v;
    else
        *(double *)at = keys[i].kind == 'r' ? v * 1e9 : v;
    return 0;
}

int wb_hw_load(const char *path, struct wb_hw *out, struct wb_errlist *el)
{
    struct wb_yaml *y;
    int r = wb_yaml_load(path, el, &y);
    if (r)
        return r;
    r = hw_from_node(y, wb_yaml_root(y), out, el);
    wb_yaml_free(y);
    return r;
}

void wb_hw_free(struct wb_hw *hw)
{
    free(hw->name);
    hw->name = NULL;
}

/* `hardware:` is a file name (relative to the layout file) or an inline mapping. Absent: the
 * layout has no hardware model (hw.nic_gbps == 0) and estimates refuse to run. */
static int load_hw_ref(const struct wb_yaml *y, const struct wb_ynode *n, const char *layout_path,
                       struct wb_hw *out, struct wb_errlist *el)
{
    memset(out, 0, sizeof(*out));
    if (!n)
        return 0;
    if (wb_ynode_kind(n) == WB_YNODE_MAP)
        return hw_from_node(y, n, out, el);
    const char *s = wb_ynode_scalar(n);
    char where[512];
    if (!s || !*s) {
        wb_errlist_add(el, "%s: hardware: expected a file name or a mapping",
                       wb_yaml_where(y, n, where, sizeof(where)));
        return -WB_E_CONFIG;
    }
    char path[4096];
    if (s[0] == '/') {
        snprintf(path, sizeof(path), "%s", s);
    } else {
        char *dup = strdup(layout_path);
        if (!dup)
            return -ENOMEM;
        snprintf(path, sizeof(path), "%s/%s", dirname(dup), s);
        free(dup);
    }
    /* a file that cannot be read is the layout's problem, at its `hardware:` line; problems
     * inside the file are reported at their own lines of that file */
    struct stat st;
    const char *why = stat(path, &st) != 0      ? strerror(errno)
                      : S_ISDIR(st.st_mode)     ? "is a directory"
                      : access(path, R_OK) != 0 ? strerror(errno)
                                                : NULL;
    if (why) {
        wb_errlist_add(el, "%s: hardware: cannot read %s: %s",
                       wb_yaml_where(y, n, where, sizeof(where)), path, why);
        return -WB_E_CONFIG;
    }
    size_t before = wb_errlist_count(el);
    int r = wb_hw_load(path, out, el);
    if (r && wb_errlist_count(el) == before)
        wb_errlist_add(el, "%s: hardware: cannot load %s: %s",
                       wb_yaml_where(y, n, where, sizeof(where)), path, wb_strerror(r));
    return r;
}

/* ---------------------------------------------------------------- trainer */

struct trainer_raw {
    uint64_t world, gpn, pp_layers;
    int residence, dtype;
    const struct wb_ynode *mesh, *placements, *hardware, *dtypes;
};

static const char *const residence_names[] = {"gpu", "host", NULL};
/* The dtypes a trainer may hold its floating-point tensors in, indexed like enum wb_dtype's
 * first values: a rule's dtype is the choice's index (layout `dtype:` has "model", index 0,
 * for "as the model rules declare"). */
static const char *const held_dtype_names[] = {"model", "bf16", "fp16", "fp32", NULL};

static const struct wb_cfg_field trainer_table[] = {
    {"world_size", WB_CFG_U64, NULL, "number of trainer GPUs", offsetof(struct trainer_raw, world)},
    {"gpus_per_node", WB_CFG_U64, "8", "GPUs per trainer node (NVLink domain)",
     offsetof(struct trainer_raw, gpn)},
    {"pp_layers", WB_CFG_U64, "0",
     "layers split over a `layer` mesh dim (0: highest {layer} + 1 in the inventory)",
     offsetof(struct trainer_raw, pp_layers)},
    {"residence", WB_CFG_ENUM, "gpu",
     "where parameters live between updates (host = FSDP CPU offload: adds an H2D stage)",
     offsetof(struct trainer_raw, residence), residence_names},
    {"mesh", WB_CFG_NODE, NULL, "mesh dims, slowest first: - {name: fsdp, size: 16}",
     offsetof(struct trainer_raw, mesh)},
    {"placements", WB_CFG_NODE, NULL,
     "rules, first match wins: - {match: \"model.layers.{layer}.*\", place: {pp: layer, "
     "fsdp: shard(0)}}",
     offsetof(struct trainer_raw, placements)},
    {"hardware", WB_CFG_NODE, "", "hardware file (relative to this file) or inline mapping",
     offsetof(struct trainer_raw, hardware)},
    {"dtype", WB_CFG_ENUM, "model",
     "dtype the trainers hold their floating-point tensors in (FP32 masters: fp32); the "
     "rollout gets each cast to its own dtype",
     offsetof(struct trainer_raw, dtype), held_dtype_names},
    {"dtypes", WB_CFG_NODE, "",
     "per-tensor dtypes, first match wins, before `dtype`: - {match: \"*norm*\", dtype: fp32}",
     offsetof(struct trainer_raw, dtypes)},
    {0},
};

struct dtype_raw {
    char *match;
    int dtype;
};

static const struct wb_cfg_field dtype_table[] = {
    {"match", WB_CFG_STR, NULL, "name pattern: * and the captures {layer} {expert}",
     offsetof(struct dtype_raw, match)},
    {"dtype", WB_CFG_ENUM, NULL, "bf16, fp16 or fp32", offsetof(struct dtype_raw, dtype),
     held_dtype_names + 1},
    {0},
};

struct dim_raw {
    char *name;
    uint64_t size;
};

static const struct wb_cfg_field dim_table[] = {
    {"name", WB_CFG_STR, NULL, "mesh dim name", offsetof(struct dim_raw, name)},
    {"size", WB_CFG_U64, NULL, "ranks along the dim", offsetof(struct dim_raw, size)},
    {0},
};

struct rule_raw {
    char *match;
    const struct wb_ynode *place;
};

static const struct wb_cfg_field rule_table[] = {
    {"match", WB_CFG_STR, NULL, "name pattern: * and the captures {layer} {expert}",
     offsetof(struct rule_raw, match)},
    {"place", WB_CFG_NODE, "",
     "per mesh dim: replicate | shard(N) | layer | expert | N | last (absent: replicate)",
     offsetof(struct rule_raw, place)},
    {0},
};

static int parse_place_value(const char *s, uint32_t dimsize, struct wb_placement *out)
{
    if (strcmp(s, "replicate") == 0) {
        *out = (struct wb_placement){WB_PLACE_REPLICATE, 0};
        return 0;
    }
    if (strcmp(s, "layer") == 0) {
        *out = (struct wb_placement){WB_PLACE_LAYER, 0};
        return 0;
    }
    if (strcmp(s, "expert") == 0) {
        *out = (struct wb_placement){WB_PLACE_EXPERT, 0};
        return 0;
    }
    if (strcmp(s, "last") == 0) {
        *out = (struct wb_placement){WB_PLACE_INDEX, dimsize - 1};
        return 0;
    }
    uint64_t v;
    if (strncmp(s, "shard(", 6) == 0) {
        size_t n = strlen(s);
        char num[32];
        if (n < 7 || s[n - 1] != ')' || n - 7 >= sizeof(num))
            return -EBADE; /* shard( without a closing parenthesis, or absurdly long */
        memcpy(num, s + 6, n - 7);
        num[n - 7] = 0;
        if (wb_parse_u64(num, &v))
            return -EBADE;
        if (v >= WB_MAX_DIMS)
            return -EDOM;
        *out = (struct wb_placement){WB_PLACE_SHARD, (uint32_t)v};
        return 0;
    }
    if (wb_parse_u64(s, &v) == 0) {
        if (v >= dimsize)
            return -ERANGE;
        *out = (struct wb_placement){WB_PLACE_INDEX, (uint32_t)v};
        return 0;
    }
    return -EINVAL;
}

static bool pattern_has(const char *pat, const char *cap)
{
    return strstr(pat, cap) != NULL;
}

static void parse_rule_place(const struct wb_yaml *y, const struct wb_ynode *n, size_t idx,
                             struct wb_trainer_layout *t, struct wb_place_rule *rule,
                             struct wb_errlist *el, int *err)
{
    char where[512];
    for (uint32_t d = 0; d < t->ndims; d++)
        rule->place[d] = (struct wb_placement){WB_PLACE_REPLICATE, 0};
    if (!n)
        return;
    if (wb_ynode_kind(n) != WB_YNODE_MAP) {
        if (!(wb_ynode_kind(n) == WB_YNODE_SCALAR && !*wb_ynode_scalar(n))) {
            wb_errlist_add(el, "%s: placements[%zu].place: expected a mapping mesh dim -> value",
                           wb_yaml_where(y, n, where, sizeof(where)), idx);
            *err = -WB_E_CONFIG;
        }
        return;
    }
    bool seen[WB_MESH_MAX_DIMS] = {0};
    int nlayer = 0, nexpert = 0;
    for (size_t i = 0; i < wb_ynode_len(n); i++) {
        const struct wb_ynode *k, *v;
        wb_ynode_pair(y, n, i, &k, &v);
        const char *key = wb_ynode_scalar(k), *val = wb_ynode_scalar(v);
        uint32_t d = 0;
        while (key && d < t->ndims && strcmp(t->dim[d].name, key) != 0)
            d++;
        if (!key || d == t->ndims) {
            char names[128] = "";
            for (uint32_t j = 0; j < t->ndims; j++)
                snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s",
                         j ? ", " : "", t->dim[j].name);
            wb_errlist_add(el, "%s: placements[%zu].place: unknown mesh dim '%s' (mesh dims: %s)",
                           wb_yaml_where(y, k, where, sizeof(where)), idx, key ? key : "?", names);
            *err = -WB_E_CONFIG;
            continue;
        }
        if (seen[d]) {
            wb_errlist_add(el, "%s: placements[%zu].place.%s: duplicate key",
                           wb_yaml_where(y, k, where, sizeof(where)), idx, key);
            *err = -WB_E_CONFIG;
            continue;
        }
        seen[d] = true;
        int r = val ? parse_place_value(val, t->dim[d].size, &rule->place[d]) : -EINVAL;
        if (r == -EBADE) {
            wb_errlist_add(el,
                           "%s: placements[%zu].place.%s: '%s': shard takes the tensor dim it "
                           "splits, a number from 0 to %d, as in shard(0)",
                           wb_yaml_where(y, v, where, sizeof(where)), idx, key, val,
                           WB_MAX_DIMS - 1);
            *err = -WB_E_CONFIG;
            continue;
        }
        if (r == -EDOM) {
            wb_errlist_add(el,
                           "%s: placements[%zu].place.%s: '%s': tensors have at most %d dims, so "
                           "shard takes a dim from 0 to %d",
                           wb_yaml_where(y, v, where, sizeof(where)), idx, key, val, WB_MAX_DIMS,
                           WB_MAX_DIMS - 1);
            *err = -WB_E_CONFIG;
            continue;
        }
        if (r == -ERANGE) {
            wb_errlist_add(el, "%s: placements[%zu].place.%s: index %s out of range (size %u)",
                           wb_yaml_where(y, v, where, sizeof(where)), idx, key, val,
                           t->dim[d].size);
            *err = -WB_E_CONFIG;
            continue;
        }
        if (r) {
            wb_errlist_add(el,
                           "%s: placements[%zu].place.%s: expected replicate, shard(N), layer, "
                           "expert, N or last, got '%s'",
                           wb_yaml_where(y, v, where, sizeof(where)), idx, key,
                           val ? val : "a collection");
            *err = -WB_E_CONFIG;
            continue;
        }
        enum wb_place_kind kind = rule->place[d].kind;
        const char *what = kind == WB_PLACE_LAYER ? "layer" : "expert";
        const char *cap = kind == WB_PLACE_LAYER ? "{layer}" : "{expert}";
        if (kind != WB_PLACE_LAYER && kind != WB_PLACE_EXPERT)
            continue;
        if (++*(kind == WB_PLACE_LAYER ? &nlayer : &nexpert) > 1) {
            wb_errlist_add(el, "%s: placements[%zu].place.%s: only one mesh dim may take `%s`",
                           wb_yaml_where(y, v, where, sizeof(where)), idx, key, what);
            *err = -WB_E_CONFIG;
        } else if (!pattern_has(rule->pattern, cap)) {
            wb_errlist_add(
                el, "%s: placements[%zu].place.%s: `%s` needs a %s capture in match '%s'",
                wb_yaml_where(y, v, where, sizeof(where)), idx, key, what, cap, rule->pattern);
            *err = -WB_E_CONFIG;
        }
    }
}

static void trainer_parse_lists(const struct wb_yaml *y, const struct trainer_raw *raw,
                                struct wb_trainer_layout *t, struct wb_errlist *el, int *err)
{
    char where[512];
    const struct wb_ynode *m = raw->mesh;
    if (wb_ynode_kind(m) != WB_YNODE_SEQ || wb_ynode_len(m) == 0 ||
        wb_ynode_len(m) > WB_MESH_MAX_DIMS) {
        wb_errlist_add(el, "%s: mesh: expected a list of 1 to %d dims ({name: fsdp, size: 16})",
                       wb_yaml_where(y, m, where, sizeof(where)), WB_MESH_MAX_DIMS);
        *err = -WB_E_CONFIG;
        return;
    }
    t->ndims = (uint32_t)wb_ynode_len(m);
    for (uint32_t d = 0; d < t->ndims; d++) {
        const struct wb_ynode *it = wb_ynode_item(y, m, d);
        struct dim_raw dr;
        memset(&dr, 0, sizeof(dr));
        int r = wb_cfg_parse(y, it, dim_table, &dr, el);
        if (r) {
            *err = r; /* -WB_E_CONFIG, said; or -ENOMEM */
        } else if (strlen(dr.name) == 0 || strlen(dr.name) >= WB_MESH_NAME_MAX) {
            wb_errlist_add(el, "%s: mesh[%u].name: must be 1 to %d characters",
                           wb_yaml_where(y, it, where, sizeof(where)), d, WB_MESH_NAME_MAX - 1);
            *err = -WB_E_CONFIG;
        } else if (dr.size == 0 || dr.size > 65536) {
            wb_errlist_add(el, "%s: mesh[%u].size: must be between 1 and 65536, got %llu",
                           wb_yaml_where(y, it, where, sizeof(where)), d,
                           (unsigned long long)dr.size);
            *err = -WB_E_CONFIG;
        } else {
            snprintf(t->dim[d].name, WB_MESH_NAME_MAX, "%s", dr.name);
            t->dim[d].size = (uint32_t)dr.size;
            for (uint32_t e = 0; e < d; e++)
                if (strcmp(t->dim[e].name, dr.name) == 0) {
                    wb_errlist_add(el, "%s: mesh[%u].name: duplicate mesh dim '%s'",
                                   wb_yaml_where(y, it, where, sizeof(where)), d, dr.name);
                    *err = -WB_E_CONFIG;
                }
        }
        wb_cfg_free(dim_table, &dr);
    }
    if (*err)
        return;

    const struct wb_ynode *p = raw->placements;
    if (wb_ynode_kind(p) != WB_YNODE_SEQ || wb_ynode_len(p) == 0) {
        wb_errlist_add(el, "%s: placements: expected a non-empty list of rules",
                       wb_yaml_where(y, p, where, sizeof(where)));
        *err = -WB_E_CONFIG;
        return;
    }
    size_t n = wb_ynode_len(p);
    t->rules = calloc(n, sizeof(*t->rules));
    if (!t->rules) {
        *err = -ENOMEM;
        return;
    }
    t->nrules = n;
    for (size_t i = 0; i < n; i++) {
        const struct wb_ynode *it = wb_ynode_item(y, p, i);
        struct rule_raw rr;
        memset(&rr, 0, sizeof(rr));
        int r = wb_cfg_parse(y, it, rule_table, &rr, el);
        if (r) {
            *err = r;
            wb_cfg_free(rule_table, &rr);
            continue;
        }
        struct wb_place_rule *rule = &t->rules[i];
        rule->pattern = rr.match;
        rr.match = NULL;
        if (!*rule->pattern) {
            const struct wb_ynode *mn = wb_ynode_get(y, it, "match");
            wb_errlist_add(el,
                           "%s: placements[%zu].match: the empty pattern matches no tensor "
                           "(\"*\" matches every one)",
                           wb_yaml_where(y, mn ? mn : it, where, sizeof(where)), i);
            *err = -WB_E_CONFIG;
        }
        wb_yaml_where(y, it, where, sizeof(where));
        const char *colon = strchr(where, ':');
        rule->line = colon ? (uint32_t)strtoul(colon + 1, NULL, 10) : 0;
        parse_rule_place(y, rr.place, i, t, rule, el, err);
        wb_cfg_free(rule_table, &rr);
    }
}

/* `dtypes:` rules in order, then `dtype:` (other than "model") as a last rule matching every
 * name. */
static void trainer_parse_dtypes(const struct wb_yaml *y, const struct trainer_raw *raw,
                                 struct wb_trainer_layout *t, struct wb_errlist *el, int *err)
{
    char where[512];
    const struct wb_ynode *p = raw->dtypes;
    size_t n = 0;
    if (p && !(wb_ynode_kind(p) == WB_YNODE_SCALAR && !*wb_ynode_scalar(p))) {
        if (wb_ynode_kind(p) != WB_YNODE_SEQ) {
            wb_errlist_add(el, "%s: dtypes: expected a list of {match: PATTERN, dtype: fp32}",
                           wb_yaml_where(y, p, where, sizeof(where)));
            *err = -WB_E_CONFIG;
            return;
        }
        n = wb_ynode_len(p);
    }
    t->dtypes = calloc(n + 1, sizeof(*t->dtypes));
    if (!t->dtypes) {
        *err = -ENOMEM;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const struct wb_ynode *it = wb_ynode_item(y, p, i);
        struct dtype_raw dr;
        memset(&dr, 0, sizeof(dr));
        int r = wb_cfg_parse(y, it, dtype_table, &dr, el);
        if (r) {
            *err = r;
            wb_cfg_free(dtype_table, &dr);
            continue;
        }
        struct wb_dtype_rule *d = &t->dtypes[t->ndtypes++];
        d->pattern = dr.match;
        d->dtype = (enum wb_dtype)(dr.dtype + 1); /* bf16, fp16, fp32 */
        wb_yaml_where(y, it, where, sizeof(where));
        const char *colon = strchr(where, ':');
        d->line = colon ? (uint32_t)strtoul(colon + 1, NULL, 10) : 0;
        if (!*d->pattern) {
            const struct wb_ynode *mn = wb_ynode_get(y, it, "match");
            wb_errlist_add(el,
                           "%s: dtypes[%zu].match: the empty pattern matches no tensor (\"*\" "
                           "matches every one)",
                           wb_yaml_where(y, mn ? mn : it, where, sizeof(where)), i);
            *err = -WB_E_CONFIG;
        }
    }
    if (raw->dtype != 0) {
        struct wb_dtype_rule *d = &t->dtypes[t->ndtypes];
        if (!(d->pattern = strdup("*"))) {
            *err = -ENOMEM;
            return;
        }
        t->ndtypes++;
        d->dtype = (enum wb_dtype)raw->dtype;
        const struct wb_ynode *dn = wb_ynode_get(y, wb_yaml_root(y), "dtype");
        wb_yaml_where(y, dn ? dn : wb_yaml_root(y), where, sizeof(where));
        const char *colon = strchr(where, ':');
        d->line = colon ? (uint32_t)strtoul(colon + 1, NULL, 10) : 0;
    }
}

/* A rollout layout given as the trainer's (or the other way round) would be reported as a
 * list of unknown and missing keys; one line says what happened. */
static bool other_kind(const struct wb_yaml *y, const char *path, bool trainer,
                       struct wb_errlist *el)
{
    const struct wb_ynode *root = wb_yaml_root(y);
    if (wb_ynode_kind(root) != WB_YNODE_MAP)
        return false;
    bool has_mesh = wb_ynode_get(y, root, "mesh") || wb_ynode_get(y, root, "placements");
    bool has_replicas = wb_ynode_get(y, root, "replicas") != NULL;
    if (trainer && has_replicas && !has_mesh)
        wb_errlist_add(el,
                       "%s: a rollout layout (it has replicas:), given as the trainer layout "
                       "(world_size:, mesh:, placements:)",
                       path);
    else if (!trainer && has_mesh && !has_replicas)
        wb_errlist_add(el,
                       "%s: a trainer layout (it has mesh:), given as the rollout layout "
                       "(replicas:, tp:, ep:)",
                       path);
    else
        return false;
    return true;
}

int wb_trainer_layout_load(const char *path, struct wb_trainer_layout *out, struct wb_errlist *el)
{
    struct wb_yaml *y;
    int r = wb_yaml_load(path, el, &y);
    if (r)
        return r;
    if (other_kind(y, path, true, el)) {
        wb_yaml_free(y);
        memset(out, 0, sizeof(*out));
        return -WB_E_CONFIG;
    }
    struct wb_trainer_layout t;
    memset(&t, 0, sizeof(t));
    struct trainer_raw raw;
    memset(&raw, 0, sizeof(raw));
    int err = wb_cfg_parse(y, wb_yaml_root(y), trainer_table, &raw, el);
    char where[512];
    if (!err && (raw.world == 0 || raw.world > WB_MAX_GPUS)) {
        const struct wb_ynode *w = wb_ynode_get(y, wb_yaml_root(y), "world_size");
        wb_errlist_add(el, "%s: world_size: must be between 1 and %d, got %llu",
                       wb_yaml_where(y, w ? w : wb_yaml_root(y), where, sizeof(where)), WB_MAX_GPUS,
                       (unsigned long long)raw.world);
        err = -WB_E_CONFIG;
    }
    if (!err && (raw.gpn == 0 || raw.gpn > 1024)) {
        wb_errlist_add(el, "%s: gpus_per_node: must be between 1 and 1024",
                       wb_yaml_where(y, wb_yaml_root(y), where, sizeof(where)));
        err = -WB_E_CONFIG;
    }
    if (!err) {
        t.world = (uint32_t)raw.world;
        t.gpus_per_node = (uint32_t)raw.gpn;
        t.pp_layers = (uint32_t)raw.pp_layers;
        t.residence = raw.residence == 1 ? WB_RESIDE_HOST : WB_RESIDE_GPU;
        trainer_parse_lists(y, &raw, &t, el, &err);
        trainer_parse_dtypes(y, &raw, &t, el, &err);
    }
    if (!err)
        err = load_hw_ref(y, raw.hardware, path, &t.hw, el);
    if (!err && !(t.path = strdup(path)))
        err = -ENOMEM;
    wb_yaml_free(y);
    if (err) {
        wb_trainer_layout_free(&t);
        memset(out, 0, sizeof(*out));
        return err == -ENOMEM ? err : -WB_E_CONFIG;
    }
    *out = t;
    return 0;
}

void wb_trainer_layout_free(struct wb_trainer_layout *t)
{
    for (size_t i = 0; i < t->nrules; i++) {
        free(t->rules[i].pattern);
        free(t->rules[i].rows);
    }
    free(t->rules);
    for (size_t i = 0; i < t->nnamed; i++)
        free(t->named[i]);
    free(t->named);
    free(t->named_rule);
    for (size_t i = 0; i < t->ndtypes; i++)
        free(t->dtypes[i].pattern);
    free(t->dtypes);
    wb_hw_free(&t->hw);
    free(t->path);
    memset(t, 0, sizeof(*t));
}

/* ---------------------------------------------------------------- placements by name */

struct named {
    const char *name;
    uint32_t i;
};

static int cmp_named(const void *a, const void *b)
{
    return strcmp(((const struct named *)a)->name, ((const struct named *)b)->name);
}

/* The ROWS dim of a placement row (-1: none). */
static int rows_dim(const struct wb_placement *p, uint32_t ndims)
{
    for (uint32_t d = 0; d < ndims; d++)
        if (p[d].kind == WB_PLACE_ROWS)
            return (int)d;
    return -1;
}

int wb_trainer_layout_from_placements(uint32_t ndims, const struct wb_mesh_dim *dims,
                                      uint32_t gpus_per_node, enum wb_residence residence, size_t n,
                                      const char *const *names, const struct wb_placement *place,
                                      const uint64_t *const *rows, const char *origin,
                                      struct wb_trainer_layout *out, struct wb_errlist *el)
{
    struct wb_trainer_layout t;
    memset(&t, 0, sizeof(t));
    if (ndims == 0 || ndims > WB_MESH_MAX_DIMS) {
        wb_errlist_add(el, "%s: a mesh of %u dims (1 to %d)", origin, ndims, WB_MESH_MAX_DIMS);
        return -WB_E_CONFIG;
    }
    uint64_t world = 1;
    t.ndims = ndims;
    for (uint32_t d = 0; d < ndims; d++) {
        t.dim[d] = dims[d];
        world *= dims[d].size;
    }
    if (world == 0 || world > UINT32_MAX) {
        wb_errlist_add(el, "%s: mesh of %" PRIu64 " ranks", origin, world);
        return -WB_E_CONFIG;
    }
    t.world = (uint32_t)world;
    t.gpus_per_node = gpus_per_node ? gpus_per_node : (t.world < 8 ? t.world : 8);
    t.residence = residence;
    struct named *ord = calloc(n ? n : 1, sizeof(*ord));
    t.named = calloc(n ? n : 1, sizeof(char *));
    t.named_rule = calloc(n ? n : 1, sizeof(uint32_t));
    t.path = strdup(origin);
    int err = ord && t.named && t.named_rule && t.path ? 0 : -ENOMEM;
    for (size_t i = 0; !err && i < n; i++)
        ord[i] = (struct named){names[i], (uint32_t)i};
    if (!err)
        qsort(ord, n, sizeof(*ord), cmp_named);
    size_t cap = 0;
    for (size_t k = 0; !err && k < n; k++) {
        const struct wb_placement *p = &place[(size_t)ord[k].i * ndims];
        if (k && strcmp(ord[k].name, ord[k - 1].name) == 0) {
            wb_errlist_add(el, "%s: %s: placed twice", origin, ord[k].name);
            err = -WB_E_CONFIG;
            break;
        }
        /* explicit rows: size + 1 cuts of the ROWS dim */
        int rd = rows_dim(p, ndims);
        const uint64_t *cuts = rd >= 0 && rows ? rows[ord[k].i] : NULL;
        size_t ncuts = rd >= 0 ? dims[rd].size + 1 : 0;
        if (rd >= 0 && !cuts) {
            wb_errlist_add(el, "%s: %s: placed by explicit rows along mesh dim %s without them",
                           origin, ord[k].name, dims[rd].name);
            err = -WB_E_CONFIG;
            break;
        }
        size_t r = 0; /* one rule per distinct placement, so templates still see the classes */
        while (r < t.nrules &&
               (memcmp(t.rules[r].place, p, ndims * sizeof(*p)) != 0 ||
                (cuts && memcmp(t.rules[r].rows, cuts, ncuts * sizeof(*cuts)) != 0)))
            r++;
        if (r == t.nrules) {
            if (t.nrules == cap && wb_grow(&t.rules, &cap, 8, sizeof(*t.rules))) {
                err = -ENOMEM;
                break;
            }
            struct wb_place_rule *nr = &t.rules[t.nrules];
            memset(nr, 0, sizeof(*nr));
            memcpy(nr->place, p, ndims * sizeof(*p));
            nr->pattern = strdup(""); /* matches no name: only by name */
            if (!nr->pattern) {
                err = -ENOMEM;
                break;
            }
            t.nrules++;
            if (cuts) {
                nr->rows = malloc(ncuts * sizeof(*cuts));
                if (!nr->rows) {
                    err = -ENOMEM;
                    break;
                }
                memcpy(nr->rows, cuts, ncuts * sizeof(*cuts));
            }
        }
        t.named[k] = strdup(ord[k].name);
        t.named_rule[k] = (uint32_t)r;
        t.nnamed = k + 1;
        if (!t.named[k])
            err = -ENOMEM;
    }
    free(ord);
    if (err) {
        wb_trainer_layout_free(&t);
        memset(out, 0, sizeof(*out));
        return err;
    }
    *out = t;
    return 0;
}

/* ---------------------------------------------------------------- rollout */

struct rollout_raw {
    uint64_t replicas, gpr, tp, ep, gpn, world;
    const struct wb_ynode *hardware;
};

static const struct wb_cfg_field rollout_table[] = {
    {"replicas", WB_CFG_U64, NULL, "inference replicas (each holds the whole model)",
     offsetof(struct rollout_raw, replicas)},
    {"gpus_per_replica", WB_CFG_U64, "0", "GPUs per replica (0: the larger of tp and ep)",
     offsetof(struct rollout_raw, gpr)},
    {"tp", WB_CFG_U64, "1", "tensor-parallel size inside a replica",
     offsetof(struct rollout_raw, tp)},
    {"ep", WB_CFG_U64, "1",
     "expert-parallel size inside a replica: 1 (experts tensor-parallel) or gpus_per_replica "
     "(vLLM --enable-expert-parallel: tp x data-parallel size)",
     offsetof(struct rollout_raw, ep)},
    {"gpus_per_node", WB_CFG_U64, "8", "GPUs per rollout node", offsetof(struct rollout_raw, gpn)},
    {"world_size", WB_CFG_U64, "0", "total rollout GPUs, checked when given (0: not checked)",
     offsetof(struct rollout_raw, world)},
    {"hardware", WB_CFG_NODE, "", "hardware file (relative to this file) or inline mapping",
     offsetof(struct rollout_raw, hardware)},
    {0},
};

int wb_rollout_layout_load(const char *path, struct wb_rollout_layout *out, struct wb_errlist *el)
{
    struct wb_yaml *y;
    int r = wb_yaml_load(path, el, &y);
    if (r)
        return r;
    if (other_kind(y, path, false, el)) {
        wb_yaml_free(y);
        memset(out, 0, sizeof(*out));
        return -WB_E_CONFIG;
    }
    struct wb_rollout_layout t;
    memset(&t, 0, sizeof(t));
    struct rollout_raw raw;
    memset(&raw, 0, sizeof(raw));
    int err = wb_cfg_parse(y, wb_yaml_root(y), rollout_table, &raw, el);
    char where[512];
    wb_yaml_where(y, wb_yaml_root(y), where, sizeof(where));
    const uint64_t lim = 1u << 20;
    if (!err) {
        const char *bad = NULL;
        if (raw.replicas == 0 || raw.replicas > lim)
            bad = "replicas: must be between 1 and 1048576";
        else if (raw.tp == 0 || raw.tp > lim)
            bad = "tp: must be between 1 and 1048576";
        else if (raw.ep == 0 || raw.ep > lim)
            bad = "ep: must be between 1 and 1048576";
        else if (raw.gpr > lim)
            bad = "gpus_per_replica: must be at most 1048576";
        else if (raw.gpn == 0 || raw.gpn > 1024)
            bad = "gpus_per_node: must be between 1 and 1024";
        if (bad) {
            wb_errlist_add(el, "%s: %s", where, bad);
            err = -WB_E_CONFIG;
        }
    }
    if (!err) {
        t.replicas = (uint32_t)raw.replicas;
        t.tp = (uint32_t)raw.tp;
        t.ep = (uint32_t)raw.ep;
        t.gpus_per_replica = (uint32_t)(raw.gpr ? raw.gpr : (raw.tp > raw.ep ? raw.tp : raw.ep));
        t.gpus_per_node = (uint32_t)raw.gpn;
        if (raw.world && raw.world != (uint64_t)t.replicas * t.gpus_per_replica) {
            wb_errlist_add(el, "%s: world_size %llu != replicas %u x gpus_per_replica %u = %llu",
                           where, (unsigned long long)raw.world, t.replicas, t.gpus_per_replica,
                           (unsigned long long)t.replicas * t.gpus_per_replica);
            err = -WB_E_CONFIG;
        } else if ((uint64_t)t.replicas * t.gpus_per_replica > WB_MAX_GPUS) {
            wb_errlist_add(el,
                           "%s: replicas %u x gpus_per_replica %u = %llu rollout GPUs; at most %d "
                           "are supported",
                           where, t.replicas, t.gpus_per_replica,
                           (unsigned long long)t.replicas * t.gpus_per_replica, WB_MAX_GPUS);
            err = -WB_E_CONFIG;
        }
    }
    if (!err)
        err = load_hw_ref(y, raw.hardware, path, &t.hw, el);
    if (!err && !(t.path = strdup(path)))
        err = -ENOMEM;
    wb_yaml_free(y);
    if (err) {
        wb_rollout_layout_free(&t);
        memset(out, 0, sizeof(*out));
        return err == -ENOMEM ? err : -WB_E_CONFIG;
    }
    *out = t;
    return 0;
}

void wb_rollout_layout_free(struct wb_rollout_layout *r)
{
    wb_hw_free(&r->hw);
    free(r->path);
    memset(r, 0, sizeof(*r));
}

void wb_layout_dump_docs(FILE *f)
{
    fprintf(f, "# trainer layout (--trainer)\n");
    wb_cfg_dump(trainer_table, f);
    fprintf(f, "# one item of mesh:\n");
    wb_cfg_dump(dim_table, f);
    fprintf(f, "# one item of placements:\n");
    wb_cfg_dump(rule_table, f);
    fprintf(f, "# one item of dtypes:\n");
    wb_cfg_dump(dtype_table, f);
    fprintf(f, "\n# rollout layout (--rollout)\n");
    wb_cfg_dump(rollout_table, f);
    fprintf(f, "\n# hardware model (hardware: in either layout)\n");
    wb_cfg_dump(hw_table, f);
}

/* ---------------------------------------------------------------- checks */

int wb_layout_check(const struct wb_trainer_layout *tl, const struct wb_rollout_layout *rl,
                    struct wb_errlist *el)
{
    int err = 0;
    if (tl) {
        uint64_t prod = 1;
        char dims[256] = "";
        for (uint32_t d = 0; d < tl->ndims; d++) {
            prod *= tl->dim[d].size;
            snprintf(dims + strlen(dims), sizeof(dims) - strlen(dims), "%s%s %u", d ? " x " : "",
                     tl->dim[d].name, tl->dim[d].size);
        }
        if (prod != tl->world) {
            wb_errlist_add(el, "%s: world_size %u != product of mesh dims %s = %llu", tl->path,
                           tl->world, dims, (unsigned long long)prod);
            err = -WB_E_PLAN;
        }
        if (tl->world > tl->gpus_per_node && tl->world % tl->gpus_per_node) {
            wb_errlist_add(el, "%s: world_size %u is not a multiple of gpus_per_node %u", tl->path,
                           tl->world, tl->gpus_per_node);
            err = -WB_E_PLAN;
        }
        for (size_t i = 0; i < tl->nrules; i++)
            for (uint32_t d = 0; d < tl->ndims; d++) {
                const struct wb_placement *pl = &tl->rules[i].place[d];
                if (pl->kind == WB_PLACE_LAYER && tl->pp_layers &&
                    tl->pp_layers < tl->dim[d].size) {
                    wb_errlist_add(el, "%s:%u: %u layers cannot fill %s = %u pipeline stages",
                                   tl->path, tl->rules[i].line, tl->pp_layers, tl->dim[d].name,
                                   tl->dim[d].size);
                    err = -WB_E_PLAN;
                }
            }
    }
    if (rl) {
        if (rl->gpus_per_replica % rl->tp) {
            wb_errlist_add(el, "%s: tp %u does not divide gpus_per_replica %u", rl->path, rl->tp,
                           rl->gpus_per_replica);
            err = -WB_E_PLAN;
        }
        /* vLLM --enable-expert-parallel makes the expert-parallel group tp x data-parallel size:
         * every GPU of the replica; without it experts are tensor-parallel (ep 1) */
        if (rl->ep != 1 && rl->ep != rl->gpus_per_replica) {
            wb_errlist_add(el,
                           "%s: ep %u with gpus_per_replica %u: vLLM's expert parallelism is off "
                           "(ep 1) or spans the replica (ep = gpus_per_replica = tp x "
                           "data-parallel size)",
                           rl->path, rl->ep, rl->gpus_per_replica);
            err = -WB_E_PLAN;
        }
    }
    return err;
}
