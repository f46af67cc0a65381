/* job.c — the job file: one table of documented rows (common's table-driven loader) saying
 * which model and layouts to plan, how the control plane times out, and how agents execute.
 * `wb-controller --dump-config` prints the same rows, so the docs never drift from the code. */
#include "controller/ctl.h"
#include "route/route.h"

#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static const struct wb_cfg_field model_fields[] = {
    {"rules", WB_CFG_STR, "", "model rules YAML (configs/models/...)",
     offsetof(struct wb_job, model.rules) - offsetof(struct wb_job, model)},
    {"hf_config", WB_CFG_STR, "",
     "Hugging Face config.json: inventories generated from it and the rules' family entries",
     offsetof(struct wb_job, model.hf_config) - offsetof(struct wb_job, model)},
    {"vars", WB_CFG_STR, "",
     "values of the rules file's vars for this job, NAME=VALUE[,...] (mtp=1: DeepSeek MTP layer)",
     offsetof(struct wb_job, model.vars) - offsetof(struct wb_job, model)},
    {"naming", WB_CFG_STR, "",
     "the trainer naming, one of the rules file's namings (megatron, fused, ...); empty: the "
     "one whose names the trainers register, else the file's first",
     offsetof(struct wb_job, model.naming) - offsetof(struct wb_job, model)},
    {"trainer_inventory", WB_CFG_STR, "", "trainer parameters: YAML/JSON name -> dtype, shape",
     offsetof(struct wb_job, model.trainer_inventory) - offsetof(struct wb_job, model)},
    {"rollout_inventory", WB_CFG_STR, "", "rollout parameters: YAML/JSON name -> dtype, shape",
     offsetof(struct wb_job, model.rollout_inventory) - offsetof(struct wb_job, model)},
    {0},
};

static const struct wb_cfg_field tls_fields[] = {
    {"cert", WB_CFG_STR, "",
     "PEM certificate (chain) the controller presents on a tls+tcp:// listen URL; agents and "
     "clients check it against the CA file in $WB_TLS_CA",
     offsetof(struct wb_job, tls.cert) - offsetof(struct wb_job, tls)},
    {"key", WB_CFG_STR, "", "PEM private key of tls.cert",
     offsetof(struct wb_job, tls.key) - offsetof(struct wb_job, tls)},
    {0},
};

const struct wb_cfg_field wb_job_fields[] = {
    {"name", WB_CFG_STR, "job", "job name, shown in status and traces",
     offsetof(struct wb_job, name)},
    {"listen", WB_CFG_STR, "tcp://127.0.0.1:7420", "nng URL the controller listens on",
     offsetof(struct wb_job, listen)},
    {"token", WB_CFG_STR, "", "cluster token every message carries (empty: $WB_TOKEN)",
     offsetof(struct wb_job, token)},
    {"model", WB_CFG_SECTION, "", "what moves: rules and the two inventories",
     offsetof(struct wb_job, model), NULL, model_fields},
    {"trainer_layout", WB_CFG_STR, "",
     "trainer cluster layout YAML (configs/clusters/...); empty with trainers: N: derived from "
     "the placements the trainers register (DTensor)",
     offsetof(struct wb_job, trainer_layout)},
    {"rollout_layout", WB_CFG_STR, "", "rollout cluster layout YAML",
     offsetof(struct wb_job, rollout_layout)},
    {"mode", WB_CFG_ENUM, "auto", "how pieces are produced", offsetof(struct wb_job, mode),
     wb_plan_mode_names},
    {"mem_cap", WB_CFG_SIZE, "0", "temporary-memory cap of each trainer's executor (0: 1 GiB)",
     offsetof(struct wb_job, mem_cap)},
    {"seed", WB_CFG_U64, "1", "seed of the synthetic parameter source",
     offsetof(struct wb_job, seed)},
    {"provider", WB_CFG_STR, "tcp", "transport provider agents use (tcp, shm, cuda_ipc, ...)",
     offsetof(struct wb_job, provider)},
    {"heartbeat", WB_CFG_DURATION, "200ms", "agents send a heartbeat this often",
     offsetof(struct wb_job, heartbeat_ns)},
    {"suspect_after", WB_CFG_DURATION, "1500ms",
     "an agent silent this long is suspect (wb-ctl status says so; a transfer waits for it); "
     "at or past dead_after there is no suspect stage",
     offsetof(struct wb_job, suspect_ns)},
    {"dead_after", WB_CFG_DURATION, "10s",
     "an agent silent this long is dead (a transfer that needs it fails); a closed connection "
     "(a process that exited or was killed) is a death at once",
     offsetof(struct wb_job, dead_ns)},
    {"transfer_timeout", WB_CFG_DURATION, "60s", "a transfer not done by then fails",
     offsetof(struct wb_job, transfer_ns)},
    {"poll_hold", WB_CFG_DURATION, "500ms", "how long the controller holds an idle agent poll",
     offsetof(struct wb_job, poll_hold_ns)},
    {"trainers", WB_CFG_U64, "0", "trainer agents expected (0: from trainer_layout)",
     offsetof(struct wb_job, trainers)},
    {"rollouts", WB_CFG_U64, "0", "rollout agents expected (0: from rollout_layout)",
     offsetof(struct wb_job, rollouts)},
    {"trace", WB_CFG_STR, "",
     "directory where every agent writes a Chrome trace (Perfetto) of each version it took "
     "part in, <role><rank>.v<version>.json, named by tensor (empty: none; an agent that "
     "cannot write there says so and goes on without)",
     offsetof(struct wb_job, trace)},
    {"trace_keep", WB_CFG_U64, "8",
     "versions of traces each agent keeps in the trace directory; older ones are removed",
     offsetof(struct wb_job, trace_keep)},
    {"verify", WB_CFG_BOOL, "false",
     "rollouts check every write against its checksum computed at the writer (costs a hash of "
     "every byte on both sides; on the GPU for GPU memory)",
     offsetof(struct wb_job, verify)},
    {"delta", WB_CFG_BOOL, "false",
     "delta updates: a trainer sends a rollout only the bytes of its writes that changed since "
     "the version the rollout holds whole (positions and values into a delta inbox the rollout "
     "applies before the version counts); full updates every delta_full_every versions, after "
     "a failed attempt and to a rollout that is torn or holds another version. Pipeline writes "
     "from host memory only; the direct path and GPU trainers send full updates",
     offsetof(struct wb_job, delta)},
    {"delta_full_every", WB_CFG_U64, "16",
     "with delta: every version that is a multiple of this is sent full to every rollout "
     "(1: always full)",
     offsetof(struct wb_job, delta_full_every)},
    {"synthetic_change", WB_CFG_F64, "0",
     "synthetic agents: the fraction of elements whose value changes from one version to the "
     "next (0: every element, each version its own values; 0.002: a fine-tuning step's "
     "pattern, for delta updates), rounded to one in a whole number of elements",
     offsetof(struct wb_job, synthetic_change)},
    {"max_connections", WB_CFG_U64, "0",
     "control connections introduced with the token (HELLO) the controller holds at once; "
     "one over it is closed (0: 4 per agent + 64)",
     offsetof(struct wb_job, max_connections)},
    {"handshake", WB_CFG_DURATION, "2s",
     "a control connection that has not shown the token (HELLO) by then is closed, TLS "
     "handshake included",
     offsetof(struct wb_job, handshake_ns)},
    {"max_pending", WB_CFG_U64, "0",
     "control connections not introduced yet, held apart from max_connections; a newer one "
     "evicts the oldest (0: 3 per agent + 64)",
     offsetof(struct wb_job, max_pending)},
    {"max_pending_per_peer", WB_CFG_U64, "0",
     "of those, from one peer address (0: 3 per agent + 16)",
     offsetof(struct wb_job, max_pending_per_peer)},
    {"version_step", WB_CFG_U64, "4294967296",
     "a transfer's version may be at most this far past the last complete one (2^32 by "
     "default), so that no member can push the versions to the end of their range and block "
     "every later one",
     offsetof(struct wb_job, version_step)},
    {"metrics", WB_CFG_STR, "",
     "HOST:PORT (127.0.0.1:9420; [::1]:9420; port 0: any free one, logged) where the controller "
     "serves Prometheus text at GET /metrics: versions complete and failed, failures by cause, "
     "transfer durations and bytes, agents per role and state, ready (empty: off, nothing "
     "listens)",
     offsetof(struct wb_job, metrics)},
    {"tls", WB_CFG_SECTION, "", "the control plane over TLS (listen: tls+tcp://HOST:PORT)",
     offsetof(struct wb_job, tls), NULL, tls_fields},
    {0},
};

/* Where a top-level key of the job file is ("file:line:col"), or the file when it is absent
 * (a default). */
static char *key_at(const struct wb_yaml *y, const char *key, char *buf, size_t cap)
{
    const struct wb_ynode *root = wb_yaml_root(y);
    return wb_yaml_where(y, root ? wb_ynode_get(y, root, key) : NULL, buf, cap);
}

/* A relative path in the job file is relative to the file's directory. */
static int resolve(char **p, const char *dir)
{
    if (!*p || !**p || (*p)[0] == '/')
        return 0;
    size_t n = strlen(dir) + strlen(*p) + 2;
    char *s = malloc(n);
    if (!s)
        return -ENOMEM;
    snprintf(s, n, "%s/%s", dir, *p);
    free(*p);
    *p = s;
    return 0;
}

int wb_job_load(const char *path, struct wb_job *job, struct wb_errlist *el)
{
    struct wb_yaml *y;
    struct wb_job j;
    memset(&j, 0, sizeof(j));
    int err = wb_yaml_load(path, el, &y);
    if (err)
        return err;
    err = wb_cfg_parse(y, wb_yaml_root(y), wb_job_fields, &j, el);
    if (err)
        goto err_free;
    char *dup = strdup(path);
    if (!dup) {
        err = -ENOMEM;
        goto err_free;
    }
    const char *dir = dirname(dup);
    err = resolve(&j.model.rules, dir);
    err = err ? err : resolve(&j.model.hf_config, dir);
    err = err ? err : resolve(&j.model.trainer_inventory, dir);
    err = err ? err : resolve(&j.model.rollout_inventory, dir);
    err = err ? err : resolve(&j.trainer_layout, dir);
    err = err ? err : resolve(&j.rollout_layout, dir);
    err = err ? err : resolve(&j.trace, dir);
    err = err ? err : resolve(&j.tls.cert, dir);
    err = err ? err : resolve(&j.tls.key, dir);
    free(dup);
    if (err)
        goto err_free;
    /* The token falls back to $WB_TOKEN but is not demanded here: what reads a job without
     * sending anything (wb-ctl verify, wb-broadcast --dry-run) needs none. What serves it
     * does: wb_controller_create() refuses a job without one. */
    const char *tok = wb_token_resolve(j.token);
    if (tok && tok != j.token) {
        free(j.token);
        if (!(j.token = strdup(tok))) {
            err = -ENOMEM;
            goto err_free;
        }
    }
    /* TLS: a tls+tcp:// listen URL and the certificate pair go together. */
    bool tls_url = strncmp(j.listen, "tls+tcp://", 10) == 0;
    if (tls_url && (!*j.tls.cert || !*j.tls.key)) {
        wb_errlist_add(el, "%s: tls: listen %s needs tls.cert and tls.key (PEM files)", path,
                       j.listen);
        err = -WB_E_CONFIG;
        goto err_free;
    }
    if (!tls_url && (*j.tls.cert || *j.tls.key)) {
        wb_errlist_add(el, "%s: tls: a certificate is given but listen %s is not tls+tcp://", path,
                       j.listen);
        err = -WB_E_CONFIG;
        goto err_free;
    }
    /* Either a whole model (rules, inventories, layouts) or none: a job without a model runs
     * the control plane alone with the agent counts given by trainers:/rollouts:. */
    static const char *const need[] = {"model.rules", "model.trainer_inventory",
                                       "model.rollout_inventory", "trainer_layout",
                                       "rollout_layout"};
    const char *gen = *j.model.hf_config ? "(from hf_config)" : "";
    /* No trainer layout: it is derived from what the trainers register (DTensor placements),
     * which needs their count. */
    const char *derived =
        *j.model.rules && !*j.trainer_layout && j.trainers ? "(from the registrations)" : "";
    const char *have[] = {j.model.rules, *gen ? gen : j.model.trainer_inventory,
                          *gen ? gen : j.model.rollout_inventory,
                          *derived ? derived : j.trainer_layout, j.rollout_layout};
    bool any = false;
    for (size_t i = 0; i < WB_ARRAY_LEN(need); i++)
        any |= *have[i] != 0;
    for (size_t i = 0; any && i < WB_ARRAY_LEN(need); i++)
        if (!*have[i]) {
            wb_errlist_add(el,
                           "%s: %s: required key missing (a model needs all of %s, %s, %s, "
                           "%s and %s)",
                           path, need[i], need[0], need[1], need[2], need[3], need[4]);
            err = -WB_E_CONFIG;
        }
    if (!any && (j.trainers == 0 || j.rollouts == 0)) {
        wb_errlist_add(el, "%s: trainers, rollouts: a job without a model needs both counts", path);
        err = -WB_E_CONFIG;
    }
    const struct {
        const char *key;
        uint64_t ns;
    } durs[] = {{"heartbeat", j.heartbeat_ns}, {"suspect_after", j.suspect_ns},
                {"dead_after", j.dead_ns},     {"transfer_timeout", j.transfer_ns},
                {"poll_hold", j.poll_hold_ns}, {"handshake", j.handshake_ns}};
    for (size_t i = 0; i < WB_ARRAY_LEN(durs); i++)
        if (durs[i].ns > WB_JOB_MAX_NS) {
            wb_errlist_add(el, "%s: %s: %.0f s is longer than the longest duration, %d days", path,
                           durs[i].key, (double)durs[i].ns / 1e9, WB_JOB_MAX_DAYS);
            err = -WB_E_CONFIG;
        }
    enum wb_plan_mode asked;
    if (wb_plan_mode_parse(wb_plan_mode_name((enum wb_plan_mode)j.mode), &asked)) {
        char mat[1200];
        wb_errlist_add(el,
                       "%s: mode: %s is what the planner chooses where FP8 blocks straddle owners, "
                       "not a request: ask for direct (it falls back to amax there)",
                       key_at(y, "mode", mat, sizeof(mat)),
                       wb_plan_mode_name((enum wb_plan_mode)j.mode));
        err = -WB_E_CONFIG;
    }
    if (*j.metrics) {
        struct sockaddr_storage ss;
        unsigned sslen;
        char why[300], mat[1200];
        if (ctl_metrics_addr(j.metrics, &ss, &sslen, why, sizeof(why))) {
            wb_errlist_add(el, "%s: metrics: %s", key_at(y, "metrics", mat, sizeof(mat)), why);
            err = -WB_E_CONFIG;
        }
    }
    if (j.handshake_ns == 0) {
        wb_errlist_add(el, "%s: handshake: must be longer than 0", path);
        err = -WB_E_CONFIG;
    }
    if (j.trace_keep == 0 || j.trace_keep > 1000000) {
        char mat[1200];
        wb_errlist_add(el, "%s: trace_keep: %" PRIu64 " versions (1 to 1000000)",
                       key_at(y, "trace_keep", mat, sizeof(mat)), j.trace_keep);
        err = -WB_E_CONFIG;
    }
    if (j.delta_full_every == 0) {
        char mat[1200];
        wb_errlist_add(el, "%s: delta_full_every: must be at least 1",
                       key_at(y, "delta_full_every", mat, sizeof(mat)));
        err = -WB_E_CONFIG;
    }
    if (!(j.synthetic_change >= 0 && j.synthetic_change <= 1)) {
        char mat[1200];
        wb_errlist_add(el, "%s: synthetic_change: %g is not a fraction (0 to 1)",
                       key_at(y, "synthetic_change", mat, sizeof(mat)), j.synthetic_change);
        err = -WB_E_CONFIG;
    }
    if (j.version_step == 0) {
        wb_errlist_add(el, "%s: version_step: must be at least 1", path);
        err = -WB_E_CONFIG;
    }
    /* A silence shorter than a beat's gap says nothing: suspicion and death start beyond it. */
    char at[1200];
    if (j.heartbeat_ns == 0 || j.dead_ns <= j.heartbeat_ns) {
        wb_errlist_add(el, "%s: dead_after: must be longer than heartbeat",
                       key_at(y, "dead_after", at, sizeof(at)));
        err = -WB_E_CONFIG;
    }
    if (j.suspect_ns <= j.heartbeat_ns && j.suspect_ns < j.dead_ns) {
        wb_errlist_add(el, "%s: suspect_after: must be longer than heartbeat",
                       key_at(y, "suspect_after", at, sizeof(at)));
        err = -WB_E_CONFIG;
    }
    if (err)
        goto err_free;
    wb_yaml_free(y);
    *job = j;
    return 0;

err_free:
    wb_cfg_free(wb_job_fields, &j);
    wb_yaml_free(y);
    return err;
}

void wb_job_free(struct wb_job *job)
{
    wb_cfg_free(wb_job_fields, job);
}
