/* bcast_test.c — wb-broadcast end to end, with real processes over the libfabric tcp provider:
 * checkpoints written by the project's writer (ckpt/write.c) are broadcast by 2 reader
 * processes into 4 rollout agents, and every rollout byte is compared with the independent
 * reference (controller/verify.c: the synthetic source the checkpoint was written from, the
 * quant CPU reference, the rollout layout's boxes — no planner, executor or reader code).
 *
 * Cases: the demo model as BF16 and as an FP8 checkpoint (values and scales passed through);
 * a 1.28 GB checkpoint, with the readers' peak memory under their share; every kind of bad
 * file refused with its exact message and nothing listening; a reader killed mid-transfer and
 * restarted, the attempt resumed; a byte flipped at a rollout, named by the checksum; the
 * live progress line under a real terminal (script(1)). */
#include "ckpt/ckpt.h"
#include "controller/controller.h"
#include "tests/func/e2e_proc.h"

#include <fcntl.h>
#include <regex.h>
#include <sys/resource.h>
#include <sys/stat.h>

static const char TOKEN_ENV[] = "WB_TOKEN=bcast-tok";
static const char *const DEMO_RULES = "configs/models/qwen3_moe.yaml";
static const char *const DEMO_CONFIG = "configs/jobs/demo/config.json";
/* The demo model into 2 FP8 replicas of TP 2: what every rollout holds (the plan's bytes). */
enum { DEMO_WRITE_BYTES = 6847616, DEMO_CKPT_BYTES = 5774848 };

struct bc {
    char url[64], job[700], ckpt[700], dump[700];
    int readers, rollouts;
    pid_t coord, rd[4], ro[8];
};

static char cwd[600];

/* A checkpoint of the model written by the project's writer, seed 42 version 1 (the values a
 * synthetic trainer of the job's seed holds at version 1). */
static void write_ckpt(const char *dir, const char *rules, const char *config, uint32_t files,
                       enum wb_ckpt_form form)
{
    struct wb_errlist el;
    struct wb_model md;
    struct wb_inventory inv;
    wb_errlist_init(&el);
    wb_inv_init(&inv);
    struct wb_model_src src = {.rules = rules, .config = config};
    struct wb_ckpt_write_opts wo = {.seed = 42, .version = 1, .files = files};
    if (wb_model_load(&src, &md, &el) || wb_ckpt_expected(&md, form, &inv, &el) ||
        wb_ckpt_write(dir, &inv, &wo, &el)) {
        wb_errlist_print(&el, "    ", stderr);
        wb_test_fail(__FILE__, __LINE__, "cannot write the checkpoint %s", dir);
    }
    wb_model_free(&md);
    wb_inv_free(&inv);
    wb_errlist_free(&el);
}

/* The job: the model, the rollout layout (replicas x tp), `readers` trainers, seed 42. */
static void setup(struct bc *b, const char *name, unsigned salt, const char *rules,
                  const char *config, uint32_t replicas, uint32_t tp, const char *extra)
{
    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    memset(b, 0, sizeof(*b));
    b->readers = 2;
    b->rollouts = (int)(replicas * tp);
    snprintf(b->url, sizeof(b->url), "tcp://127.0.0.1:%u", e2e_port(salt));
    char text[2048], fname[64];
    snprintf(text, sizeof(text), "replicas: %u\ngpus_per_replica: %u\ntp: %u\n", replicas, tp, tp);
    snprintf(fname, sizeof(fname), "%s-rollout.yaml", name);
    const char *rl = wb_test_write_file(fname, text);
    snprintf(text, sizeof(text),
             "name: %s\nlisten: %s\nmodel:\n  rules: %s/%s\n  hf_config: %s/%s\n"
             "trainers: 2\nrollout_layout: %s\nseed: 42\nprovider: tcp\n%s",
             name, b->url, cwd, rules, cwd, config, rl, extra ? extra : "");
    snprintf(fname, sizeof(fname), "%s-job.yaml", name);
    snprintf(b->job, sizeof(b->job), "%s", wb_test_write_file(fname, text));
    snprintf(b->ckpt, sizeof(b->ckpt), "%s/%s-ckpt", wb_test_tmpdir(), name);
    snprintf(b->dump, sizeof(b->dump), "%s/%s-dump", wb_test_tmpdir(), name);
    mkdir(b->dump, 0755);
}

static pid_t spawn(const char *log, char *const argv[])
{
    static char tok[sizeof(TOKEN_ENV)];
    memcpy(tok, TOKEN_ENV, sizeof(TOKEN_ENV));
    char *env[] = {tok, NULL};
    return e2e_spawn(log, env, argv);
}

static void start_coordinator(struct bc *b, const char *log, const char *period)
{
    char *argv[16] = {"wb-broadcast", "--checkpoint", b->ckpt,  "--job", b->job,
                      "--progress",   "plain",        "--wait", "60s"};
    if (period) {
        argv[9] = "--period";
        argv[10] = (char *)period;
    }
    b->coord = spawn(log, argv);
}

static pid_t start_reader(struct bc *b, int r, const char *pace)
{
    char log[32], rk[16], n[16];
    snprintf(log, sizeof(log), "reader%d.log", r);
    snprintf(rk, sizeof(rk), "%d", r);
    snprintf(n, sizeof(n), "%d", b->readers);
    char *argv[16] = {"wb-broadcast", "--reader", "--checkpoint", b->ckpt, "--controller", b->url,
                      "--rank",       rk,         "--readers",    n};
    if (pace) {
        argv[10] = "--pace";
        argv[11] = (char *)pace;
    }
    return b->rd[r] = spawn(log, argv);
}

static void start_rollouts(struct bc *b, const char *corrupt_rank2)
{
    for (int r = 0; r < b->rollouts; r++) {
        char log[32], rk[16];
        snprintf(log, sizeof(log), "rollout%d.log", r);
        snprintf(rk, sizeof(rk), "%d", r);
        char *argv[16] = {"wb-agent",     "--role", "rollout", "--rank", rk,
                          "--controller", b->url,   "--dump",  b->dump};
        if (corrupt_rank2 && r == 2) {
            argv[9] = "--corrupt";
            argv[10] = (char *)corrupt_rank2;
        }
        b->ro[r] = spawn(log, argv);
    }
}

/* Every rollout's dump of version 1 against the reference; returns the bytes compared. */
static uint64_t verify(const struct bc *b)
{
    struct wb_errlist el;
    struct wb_job job;
    struct wb_ref *ref = NULL;
    wb_errlist_init(&el);
    setenv("WB_TOKEN", "bcast-tok", 1);
    CHECK_INT(wb_job_load(b->job, &job, &el), 0);
    CHECK_INT(wb_ref_load(&job, &ref, &el), 0);
    CHECK_INT(wb_ref_nrollouts(ref), b->rollouts);
    uint64_t total = 0;
    for (int r = 0; r < b->rollouts; r++) {
        char path[800], msg[512];
        uint64_t bytes = 0;
        snprintf(path, sizeof(path), "%s/rollout%d.v1.bin", b->dump, r);
        if (wb_ref_check_dump(ref, (uint32_t)r, 1, path, msg, sizeof(msg), &bytes))
            wb_test_fail(__FILE__, __LINE__, "%s", msg);
        total += bytes;
    }
    wb_ref_free(ref);
    wb_job_free(&job);
    wb_errlist_free(&el);
    return total;
}

/* Waits for pid and returns its exit status, with its peak resident memory in *maxrss_kb. */
static int wait_rss(pid_t pid, unsigned ms, long *maxrss_kb)
{
    for (unsigned t = 0; t < ms; t += 10) {
        int st;
        struct rusage ru;
        pid_t r = wait4(pid, &st, WNOHANG, &ru);
        if (r == pid) {
            for (int i = 0; i < e2e_nchildren; i++)
                if (e2e_children[i] == pid)
                    e2e_children[i] = 0;
            *maxrss_kb = ru.ru_maxrss;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        e2e_sleep_ms(10);
    }
    wb_test_fail(__FILE__, __LINE__, "process %d did not exit within %u ms", (int)pid, ms);
}

/* The coordinator ends 0 and every agent exits with it (the job's shutdown). */
static char *finish_ok(struct bc *b, unsigned ms, long *reader_rss_kb)
{
    int rc = e2e_wait(b->coord, ms);
    char *out = e2e_slurp("coord.log");
    if (rc != 0)
        wb_test_fail(__FILE__, __LINE__, "wb-broadcast exited %d:\n%s", rc, out);
    for (int r = 0; r < b->readers; r++) {
        long kb = 0;
        CHECK_INT(wait_rss(b->rd[r], 60000, &kb), 0);
        if (reader_rss_kb)
            reader_rss_kb[r] = kb;
    }
    for (int r = 0; r < b->rollouts; r++)
        CHECK_INT(e2e_wait(b->ro[r], 60000), 0);
    return out;
}

static void expect_line(const char *out, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void expect_line(const char *out, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    CHECK_CONTAINS(out, line);
}

/* ---------------------------------------------------------------- the demo model */

static bool matches(const char *text, const char *re);

static void broadcast_demo(enum wb_ckpt_form form, uint32_t files, unsigned salt)
{
    struct bc b;
    setup(&b, form == WB_CKPT_FORM_FP8 ? "fp8" : "bf16", salt, DEMO_RULES, DEMO_CONFIG, 2, 2,
          "mem_cap: 4MiB\n");
    write_ckpt(b.ckpt, DEMO_RULES, DEMO_CONFIG, files, form);
    start_coordinator(&b, "coord.log", NULL);
    start_rollouts(&b, NULL);
    start_reader(&b, 0, NULL);
    start_reader(&b, 1, NULL);
    char *out = finish_ok(&b, 60000, NULL);
    bool fp8 = form == WB_CKPT_FORM_FP8;
    expect_line(out,
                "wb-broadcast: checkpoint %s: %u files, %d tensors, %s; every tensor matches the "
                "model\n",
                b.ckpt, files, fp8 ? 77 : 45, fp8 ? "3.42 MB" : "5.77 MB");
    expect_line(out,
                "wb-broadcast: plan: 2 readers -> 4 rollouts, 6.85 MB to write, 4.19 MB memory "
                "cap per reader; controller on %s\n",
                b.url);
    CHECK_CONTAINS(out, "wb-broadcast: version 1 complete on 4 rollouts in ");
    CHECK_CONTAINS(out, " (1 attempt)\n");
    /* the plan's bytes, exactly, per reader */
    if (fp8) {
        CHECK_CONTAINS(out, "wb-broadcast: reader 0: read 1.71 MB, wrote 3420480 bytes");
        CHECK_CONTAINS(out, "wb-broadcast: reader 1: read 1.71 MB, wrote 3427136 bytes");
    } else {
        CHECK_CONTAINS(out, "wb-broadcast: reader 0: read 2.89 MB, wrote 3959232 bytes");
        CHECK_CONTAINS(out, "wb-broadcast: reader 1: read 2.89 MB, wrote 2888384 bytes");
    }
    CHECK_CONTAINS(out, "wb-broadcast: verified: every reader's share hashed equal to the "
                        "checkpoint and every write's checksum matched at its rollout\n");
    /* the coordinator hashed its own checkpoint: the ground truth the readers are held to */
    if (!matches(out,
                 "\nwb-broadcast: content: 5\\.77 MB hashed in [0-9]+\\.[0-9]{3} s \\(XXH3-128 "
                 "of each reader's share\\)\n") &&
        !matches(out,
                 "\nwb-broadcast: content: 3\\.42 MB hashed in [0-9]+\\.[0-9]{3} s \\(XXH3-128 "
                 "of each reader's share\\)\n"))
        wb_test_fail(__FILE__, __LINE__, "no content line:\n%s", out);
    free(out);
    CHECK_U64(verify(&b), DEMO_WRITE_BYTES);
}

static void test_demo_bf16(void)
{
    broadcast_demo(WB_CKPT_FORM_MODEL, 3, 1);
}

/* The official -FP8 form: fp8_e4m3 values and FP32 scale tensors, copied as they are into FP8
 * rollouts — bit for bit what quantizing the BF16 values gives (the reference). */
static void test_demo_fp8(void)
{
    broadcast_demo(WB_CKPT_FORM_FP8, 2, 2);
}

/* ---------------------------------------------------------------- tensors the model ignores */

/* A DeepSeek-V3 checkpoint with its MTP layer (mtp=1): the layer's copy of the embedding
 * (model.layers.2.embed_tokens.weight) is in the trainer inventory but ignored by the family
 * (vLLM's draft shares the target's). The reader whose share holds it registers it; before,
 * the controller refused that reader ("registered, but the plan gives this rank no such
 * tensor") and no DeepSeek checkpoint with MTP could be broadcast. */
static void test_mtp_ignored(void)
{
    struct bc b;
    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    memset(&b, 0, sizeof(b));
    b.readers = 2;
    b.rollouts = 2;
    snprintf(b.url, sizeof(b.url), "tcp://127.0.0.1:%u", e2e_port(14));
    char cfg[700], rl[700];
    snprintf(
        cfg, sizeof(cfg), "%s",
        wb_test_write_file(
            "dsv3-mtp.json",
            "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", "
            "\"first_k_dense_replace\": 1, \"hidden_size\": 256, \"intermediate_size\": 512, "
            "\"kv_lora_rank\": 128, \"moe_intermediate_size\": 256, \"moe_layer_freq\": 1, "
            "\"n_group\": 1, \"n_routed_experts\": 4, \"n_shared_experts\": 1, "
            "\"num_attention_heads\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2, "
            "\"num_key_value_heads\": 4, \"num_nextn_predict_layers\": 1, \"q_lora_rank\": 256, "
            "\"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128, "
            "\"vocab_size\": 1024, \"tie_word_embeddings\": false}\n"));
    snprintf(rl, sizeof(rl), "%s",
             wb_test_write_file("mtp-rollout.yaml", "replicas: 1\ngpus_per_replica: 2\ntp: 2\n"));
    char text[3072];
    snprintf(text, sizeof(text),
             "name: mtp\nlisten: %s\nmodel:\n  rules: %s/configs/models/deepseek_v3.yaml\n"
             "  hf_config: %s\n  vars: \"mtp=1\"\ntrainers: 2\nrollout_layout: %s\nseed: 42\n"
             "provider: tcp\n",
             b.url, cwd, cfg, rl);
    snprintf(b.job, sizeof(b.job), "%s", wb_test_write_file("mtp-job.yaml", text));
    snprintf(b.ckpt, sizeof(b.ckpt), "%s/mtp-ckpt", wb_test_tmpdir());
    snprintf(b.dump, sizeof(b.dump), "%s/mtp-dump", wb_test_tmpdir());
    mkdir(b.dump, 0755);
    struct wb_errlist el;
    struct wb_model md;
    struct wb_inventory inv;
    wb_errlist_init(&el);
    wb_inv_init(&inv);
    char rules[700];
    snprintf(rules, sizeof(rules), "%s/configs/models/deepseek_v3.yaml", cwd);
    struct wb_model_src src = {.rules = rules, .config = cfg, .vars = "mtp=1"};
    struct wb_ckpt_write_opts wo = {.seed = 42, .version = 1, .files = 1};
    if (wb_model_load(&src, &md, &el) || wb_ckpt_expected(&md, WB_CKPT_FORM_MODEL, &inv, &el)) {
        wb_errlist_print(&el, "    ", stderr);
        wb_test_fail(__FILE__, __LINE__, "cannot load the model");
    }
    CHECK(wb_inv_find(&inv, "model.layers.2.embed_tokens.weight") >= 0);
    CHECK_INT(wb_ckpt_write(b.ckpt, &inv, &wo, &el), 0);
    wb_model_free(&md);
    wb_inv_free(&inv);
    wb_errlist_free(&el);
    start_coordinator(&b, "coord.log", NULL);
    start_rollouts(&b, NULL);
    start_reader(&b, 0, NULL);
    start_reader(&b, 1, NULL);
    char *out = finish_ok(&b, 60000, NULL);
    CHECK_CONTAINS(out, ": 1 file, 73 tensors, 10.5 MB; every tensor matches the model\n");
    CHECK_CONTAINS(out, "wb-broadcast: version 1 complete on 2 rollouts in ");
    free(out);
    char *log = e2e_slurp("reader1.log");
    CHECK(!strstr(log, "no such tensor"));
    free(log);
    CHECK(verify(&b) > 0);
}

/* ---------------------------------------------------------------- >= 1 GB */

static void test_one_gb(void)
{
    struct bc b;
    /* Qwen3 dense, hidden 2048, 10 layers: 1.28 GB of BF16 in 4 files, into one BF16 replica of
     * TP 4. Writing the rollouts' 1.28 GB of dumps takes longer than the default dead_after. */
    setup(&b, "big", 3, "configs/models/qwen3.yaml", "tests/fixtures/ckpt/qwen3-1g.json", 1, 4,
          "mem_cap: 32MiB\ndead_after: 20s\n");
    write_ckpt(b.ckpt, "configs/models/qwen3.yaml", "tests/fixtures/ckpt/qwen3-1g.json", 4,
               WB_CKPT_FORM_MODEL);
    start_coordinator(&b, "coord.log", NULL);
    start_rollouts(&b, NULL);
    start_reader(&b, 0, NULL);
    start_reader(&b, 1, NULL);
    long rss[2] = {0, 0};
    char *out = finish_ok(&b, 1000000, rss); /* 42 s alone; ten times that under load */
    expect_line(out,
                "wb-broadcast: checkpoint %s: 4 files, 113 tensors, 1.28 GB; every tensor matches "
                "the model\n",
                b.ckpt);
    /* the embedding (32768 x 2048 BF16, whole on reader 0) is the largest task: the cap is
     * raised to it, and it bounds the readers' memory, not the checkpoint's size */
    expect_line(out,
                "wb-broadcast: plan: 2 readers -> 4 rollouts, 1.28 GB to write, 134 MB memory "
                "cap per reader (raised to the largest task); controller on %s\n",
                b.url);
    CHECK_CONTAINS(out, "wb-broadcast: reader 0: read 638 MB, wrote 637698048 bytes, peak "
                        "memory 134 MB of a 134 MB cap\n");
    CHECK_CONTAINS(out, "wb-broadcast: reader 1: read 638 MB, wrote 637734912 bytes");
    free(out);
    /* each reader read 638 MB and never held it: its peak resident memory stays under its
     * share (AddressSanitizer's own overhead included) */
    for (int r = 0; r < 2; r++)
        if (rss[r] <= 0 || (uint64_t)rss[r] * 1024 >= 637000000ull)
            wb_test_fail(__FILE__, __LINE__, "reader %d peak resident memory %ld kB", r, rss[r]);
    CHECK_U64(verify(&b), 1275432960); /* the local tensors, vocab padding included */
}

/* ---------------------------------------------------------------- bad files */

/* Rewrites a file's header: the first `from` becomes `to` (the data area stays). */
static void patch_header(const char *dir, const char *file, const char *from, const char *to)
{
    char path[900];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)size + 1);
    CHECK(fread(buf, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | buf[i];
    char *hdr = strndup((char *)buf + 8, hl);
    char *at = strstr(hdr, from);
    if (!at)
        wb_test_fail(__FILE__, __LINE__, "%s: no \"%s\" in the header", file, from);
    size_t nl = hl - strlen(from) + strlen(to);
    f = fopen(path, "wb");
    CHECK(f != NULL);
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(nl >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(hdr, 1, (size_t)(at - hdr), f);
    fwrite(to, 1, strlen(to), f);
    fwrite(at + strlen(from), 1, strlen(at + strlen(from)), f);
    fwrite(buf + 8 + hl, 1, (size_t)size - 8 - hl, f);
    CHECK_INT(fclose(f), 0);
    free(hdr);
    free(buf);
}

/* Replaces the first `from` of a text file (the index) by `to`. */
static void patch_text(const char *dir, const char *file, const char *from, const char *to)
{
    char path[900];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    char *text = NULL;
    size_t cap = 0;
    ssize_t n = getdelim(&text, &cap, 0, f); /* the whole file: it holds no NUL */
    fclose(f);
    CHECK(n > 0);
    char *at = strstr(text, from);
    if (!at)
        wb_test_fail(__FILE__, __LINE__, "%s: no \"%s\"", file, from);
    f = fopen(path, "wb");
    CHECK(f != NULL);
    fwrite(text, 1, (size_t)(at - text), f);
    fputs(to, f);
    fputs(at + strlen(from), f);
    CHECK_INT(fclose(f), 0);
    free(text);
}

/* The coordinator refuses the checkpoint: exit 1, exactly `want` on stderr, and nothing
 * listens (no rollout or reader could have been sent anything). */
static void refused(struct bc *b, const char *log, const char *want)
{
    start_coordinator(b, log, NULL);
    CHECK_INT(e2e_wait(b->coord, 30000), 1);
    char *out = e2e_slurp(log);
    CHECK_STR(out, want);
    free(out);
    CHECK_INT(e2e_run(&out, "%s wb-ctl -c %s --timeout 1s status", TOKEN_ENV, b->url), 1);
    char none[200];
    snprintf(none, sizeof(none), "wb-ctl: controller %s: no answer (timed out)\n", b->url);
    CHECK_STR(out, none);
    free(out);
}

static void test_bad_files(void)
{
    struct bc b;
    setup(&b, "bad", 4, DEMO_RULES, DEMO_CONFIG, 2, 2, NULL);
    char want[2048];
    const char *f1 = "model-00001-of-00003.safetensors", *f3 = "model-00003-of-00003.safetensors";
    /* each case: a fresh checkpoint, broken one way */

    /* truncated: the last file lost its last 1000 bytes */
    write_ckpt(b.ckpt, DEMO_RULES, DEMO_CONFIG, 3, WB_CKPT_FORM_MODEL);
    char path[900];
    snprintf(path, sizeof(path), "%s/%s", b.ckpt, f3);
    struct stat st;
    CHECK_INT(stat(path, &st), 0);
    CHECK_INT(truncate(path, st.st_size - 1000), 0);
    snprintf(want, sizeof(want), "%s",
             "wb-broadcast: 1 problem; nothing was sent\n"
             "  model-00003-of-00003.safetensors: tensor "
             "\"model.layers.1.mlp.experts.3.down_proj.weight\": data_offsets [1703936, 1835008] "
             "run past the data area (1834008 bytes)\n");
    refused(&b, "truncated.log", want);
    /* a header lying about offsets: a tensor said to lie past the end of the file */
    write_ckpt(b.ckpt, DEMO_RULES, DEMO_CONFIG, 3, WB_CKPT_FORM_MODEL);
    patch_header(b.ckpt, f1, "\"data_offsets\":[524288,524800]",
                 "\"data_offsets\":[9524288,9524800]");
    snprintf(want, sizeof(want), "%s",
             "wb-broadcast: 1 problem; nothing was sent\n"
             "  model-00001-of-00003.safetensors: tensor \"model.norm.weight\": data_offsets "
             "[9524288, 9524800] run past the data area (2100224 bytes)\n");
    refused(&b, "offsets.log", want);
    /* overlapping tensors: model.norm.weight moved into the embedding's bytes */
    write_ckpt(b.ckpt, DEMO_RULES, DEMO_CONFIG, 3, WB_CKPT_FORM_MODEL);
    patch_header(b.ckpt, f1, "\"data_offsets\":[524288,524800]",
                 "\"data_offsets\":[524000,524512]");
    snprintf(want, sizeof(want), "%s",
             "wb-broadcast: 1 problem; nothing was sent\n"
             "  model-00001-of-00003.safetensors: tensors \"model.embed_tokens.weight\" [0, "
             "524288) and \"model.norm.weight\" [524000, 524512) overlap\n");
    refused(&b, "overlap.log", want);
    /* a dtype and a shape the model does not have (the bytes still add up) */
    write_ckpt(b.ckpt, DEMO_RULES, DEMO_CONFIG, 3, WB_CKPT_FORM_MODEL);
    patch_header(b.ckpt, f1, "\"model.norm.weight\":{\"dtype\":\"BF16\"",
                 "\"model.norm.weight\":{\"dtype\":\"F16\"");
    patch_header(b.ckpt, f1, "\"shape\":[1024,256],\"data_offsets\":[0,524288]",
                 "\"shape\":[512,512],\"data_offsets\":[0,524288]");
    snprintf(want, sizeof(want), "%s",
             "wb-broadcast: 2 problems; nothing was sent\n"
             "  tensor \"model.embed_tokens.weight\" (in model-00001-of-00003.safetensors): "
             "shape [512, 512], the model expects [1024, 256]\n"
             "  tensor \"model.norm.weight\" (in model-00001-of-00003.safetensors): dtype "
             "fp16, the model expects bf16\n");
    refused(&b, "model.log", want);
    /* a missing shard */
    write_ckpt(b.ckpt, DEMO_RULES, DEMO_CONFIG, 3, WB_CKPT_FORM_MODEL);
    snprintf(path, sizeof(path), "%s/model-00002-of-00003.safetensors", b.ckpt);
    CHECK_INT(unlink(path), 0);
    snprintf(want, sizeof(want), "%s",
             "wb-broadcast: 1 problem; nothing was sent\n"
             "  model.safetensors.index.json: model-00002-of-00003.safetensors does not exist "
             "(the index puts 17 tensors there, "
             "\"model.layers.0.mlp.experts.0.down_proj.weight\" first)\n");
    refused(&b, "missing.log", want);
}

/* What the files could do to the programs reading them: a FIFO named by the index (it would
 * block open(2) forever), a shard linked to a file outside the checkpoint folder (read and sent
 * to the rollouts), a tensor name with a newline and a terminal escape sequence (printed raw):
 * each refused or escaped with its exact message, nothing listening. And --io mmap, gone (a
 * file that shrank while mapped killed the reader with SIGBUS), refused at the command line. */
static void test_bad_inputs(void)
{
    struct bc b;
    setup(&b, "inputs", 9, DEMO_RULES, DEMO_CONFIG, 2, 2, NULL);
    char want[4096], path[900], target[900];
    const char *f2 = "model-00002-of-00003.safetensors";
    /* a FIFO where a shard should be */
    write_ckpt(b.ckpt, DEMO_RULES, DEMO_CONFIG, 3, WB_CKPT_FORM_MODEL);
    snprintf(path, sizeof(path), "%s/%s", b.ckpt, f2);
    CHECK_INT(unlink(path), 0);
    CHECK_INT(mkfifo(path, 0644), 0);
    refused(&b, "fifo.log",
            "wb-broadcast: 1 problem; nothing was sent\n"
            "  model-00002-of-00003.safetensors: a FIFO, not a regular file\n");
    /* a shard that is a link to a file outside the folder (the writer would block on the FIFO) */
    CHECK_INT(unlink(path), 0);
    write_ckpt(b.ckpt, DEMO_RULES, DEMO_CONFIG, 3, WB_CKPT_FORM_MODEL);
    snprintf(target, sizeof(target), "%s/elsewhere.safetensors", wb_test_tmpdir());
    snprintf(path, sizeof(path), "%s/%s", b.ckpt, f2);
    CHECK_INT(rename(path, target), 0);
    CHECK_INT(symlink(target, path), 0);
    char *rt = realpath(target, NULL), *rd = realpath(b.ckpt, NULL);
    snprintf(want, sizeof(want),
             "wb-broadcast: 1 problem; nothing was sent\n"
             "  model-00002-of-00003.safetensors: leads to %s, outside the checkpoint folder %s\n",
             rt, rd);
    free(rt);
    free(rd);
    refused(&b, "link.log", want);
    /* a tensor name with a newline and a terminal escape sequence (the writer would follow
     * the link) */
    CHECK_INT(unlink(path), 0);
    write_ckpt(b.ckpt, DEMO_RULES, DEMO_CONFIG, 3, WB_CKPT_FORM_MODEL);
    patch_header(b.ckpt, "model-00001-of-00003.safetensors",
                 "\"model.norm.weight\":", "\"model.norm.weight\\n  fake line\\u001b[2J\":");
    patch_text(b.ckpt, "model.safetensors.index.json",
               "\"model.norm.weight\":", "\"model.norm.weight\\n  fake line\\u001b[2J\":");
    refused(&b, "name.log",
            "wb-broadcast: 2 problems; nothing was sent\n"
            "  extra tensor \"model.norm.weight\\n  fake line\\x1b[2J\" (bf16 [256], in "
            "model-00001-of-00003.safetensors): the model has no such tensor\n"
            "  missing tensor \"model.norm.weight\": the model expects bf16 [256]\n");
    /* --io mmap */
    char *out;
    CHECK_INT(e2e_run(&out,
                      "%s wb-broadcast --reader --checkpoint %s --controller %s --rank 0 "
                      "--io mmap",
                      TOKEN_ENV, b.ckpt, b.url),
              2);
    CHECK_STR(out, "wb-broadcast: --io mmap is no longer offered: a checkpoint file that shrinks "
                   "while it is mapped kills the reader (SIGBUS); pread (the default) reads the "
                   "same page cache\n");
    free(out);
}

/* A dry run sends nothing and needs no cluster token (the job file has none, $WB_TOKEN is
 * unset); a real run without one is refused before anything starts, naming the job file. */
static void test_token(void)
{
    struct bc b;
    setup(&b, "token", 23, DEMO_RULES, DEMO_CONFIG, 2, 2, NULL);
    write_ckpt(b.ckpt, DEMO_RULES, DEMO_CONFIG, 3, WB_CKPT_FORM_MODEL);
    char *out, want[1200];
    CHECK_INT(e2e_run(&out, "env -u WB_TOKEN wb-broadcast --checkpoint %s --dry-run --job %s",
                      b.ckpt, b.job),
              0);
    CHECK_CONTAINS(out, "every tensor matches the");
    free(out);
    CHECK_INT(e2e_run(&out, "env -u WB_TOKEN wb-broadcast --checkpoint %s --job %s --wait 1s",
                      b.ckpt, b.job),
              1);
    snprintf(want, sizeof(want),
             "wb-broadcast: %s: token: no cluster token (give --token, set token: in the job file "
             "or $WB_TOKEN)\n",
             b.job);
    CHECK_STR(out, want);
    free(out);
}

/* A reader that opened other files is refused at registration, naming both checkpoints; the
 * coordinator fails at once naming the reader and why. */
static void test_wrong_reader(void)
{
    struct bc b;
    setup(&b, "wrong", 8, DEMO_RULES, DEMO_CONFIG, 2, 2, NULL);
    write_ckpt(b.ckpt, DEMO_RULES, DEMO_CONFIG, 3, WB_CKPT_FORM_MODEL);
    char other[800];
    snprintf(other, sizeof(other), "%s/other-ckpt", wb_test_tmpdir());
    write_ckpt(other, DEMO_RULES, DEMO_CONFIG, 2, WB_CKPT_FORM_MODEL); /* same tensors, 2 files */
    char *cargv[] = {"wb-broadcast", "--checkpoint", b.ckpt, "--job", b.job, "--wait", "3s", NULL};
    b.coord = spawn("coord.log", cargv);
    char *rargv[] = {"wb-broadcast",
                     "--reader",
                     "--checkpoint",
                     other,
                     "--controller",
                     b.url,
                     "--rank",
                     "0",
                     "--readers",
                     "2",
                     NULL};
    pid_t r = spawn("reader0.log", rargv);
    CHECK_INT(e2e_wait(r, 30000), 1);
    char *out = e2e_slurp("reader0.log");
    if (!matches(out, "^wb-broadcast: reader 0: 1 problem\n  trainer rank 0: controller "
                      "tcp://127\\.0\\.0\\.1:[0-9]+: register: trainer rank 0 reads "
                      "safetensors [0-9a-f]{16} \\(2 files, 5774848 bytes\\) share 0/2 content "
                      "[0-9a-f]{32}, the job moves safetensors [0-9a-f]{16} \\(3 files, 5774848 "
                      "bytes\\) share 0/2 content [0-9a-f]{32}\n$"))
        wb_test_fail(__FILE__, __LINE__, "the reader was not refused as expected:\n%s", out);
    free(out);
    CHECK_INT(e2e_wait(b.coord, 30000), 1);
    out = e2e_slurp("coord.log");
    /* the refusal ends the run at once (no wait for a reader that will not do) */
    if (!matches(out, "wb-broadcast: the broadcast failed\n  reader 0: register: trainer rank 0 "
                      "reads safetensors [0-9a-f]{16} \\(2 files, 5774848 bytes\\) share 0/2 "
                      "content [0-9a-f]{32}, the job moves safetensors [0-9a-f]{16} \\(3 files, "
                      "5774848 bytes\\) share 0/2 content [0-9a-f]{32}\n"))
        wb_test_fail(__FILE__, __LINE__, "the coordinator did not name the refused reader:\n%s",
                     out);
    free(out);
}

/* The hash of reader k's share of the checkpoint in dir as wb-broadcast registers it, computed
 * here through the library's reader; with flip, first changes one byte of the first and of the
 * last piece of share k (what each is into t0 and t1: its tensor's name, and its rows where it
 * holds part of the tensor): another checkpoint of the same model, same names, shapes and
 * headers, different values. *npieces: how many pieces the share has. */
static void share_hash(const char *dir, uint32_t k, bool flip, char hex[33], char *t0, char *t1,
                       size_t cap, size_t *npieces)
{
    struct wb_errlist el;
    struct wb_ckpt *ck = NULL;
    struct wb_ckpt_shares sh = {0};
    struct wb_ckpt_reader *rd = NULL;
    struct wb_ckpt_io_opts io = {0};
    struct wb_hash128 h;
    wb_errlist_init(&el);
    CHECK_INT(wb_ckpt_open(dir, &ck, &el), 0);
    CHECK_INT(wb_ckpt_shares_make(ck, 2, &sh), 0);
    const struct wb_ckpt_share *s = &sh.share[k];
    CHECK(s->n >= 2);
    if (flip) {
        const struct wb_ckpt_piece *p[2] = {&s->piece[0], &s->piece[s->n - 1]};
        CHECK(p[0]->tensor != p[1]->tensor);
        for (int i = 0; i < 2; i++) {
            const struct wb_ckpt_loc *l = &ck->loc[p[i]->tensor];
            int fd = open(ck->files[l->file].path, O_RDWR);
            CHECK(fd >= 0);
            uint8_t b = 0;
            off_t at = (off_t)(l->offset + p[i]->offset + p[i]->bytes / 2);
            CHECK_INT((int)pread(fd, &b, 1, at), 1);
            b ^= 0x01; /* one bit: as small a difference as there is */
            CHECK_INT((int)pwrite(fd, &b, 1, at), 1);
            CHECK_INT(close(fd), 0);
            const struct wb_param *t = &ck->inv.p[p[i]->tensor];
            int n = (int)strnlen(t->name, cap / 2);
            if (t->shape.ndim == 0 || p[i]->rows == t->shape.dim[0])
                snprintf(i ? t1 : t0, cap, "%.*s", n, t->name);
            else
                snprintf(i ? t1 : t0, cap, "%.*s (rows %" PRIu64 "-%" PRIu64 ")", n, t->name,
                         p[i]->row0, p[i]->row0 + p[i]->rows - 1);
        }
    }
    *npieces = s->n;
    CHECK_INT(wb_ckpt_reader_open(ck, &io, &rd), 0);
    CHECK_INT(wb_ckpt_share_hash(ck, s, rd, &h, NULL), 0);
    wb_hash128_hex(&h, hex);
    wb_ckpt_reader_close(rd);
    wb_ckpt_shares_free(&sh);
    wb_ckpt_close(ck);
    wb_errlist_free(&el);
}

/* A reader holding another checkpoint of the same model (same files, names, shapes and
 * headers: the fingerprint alike; two tensors of its share one bit different) is refused at
 * registration with both content hashes; the coordinator fails at once naming it, and no
 * rollout was sent anything. */
static void test_other_checkpoint(void)
{
    struct bc b;
    setup(&b, "otherck", 31, DEMO_RULES, DEMO_CONFIG, 2, 2, NULL);
    write_ckpt(b.ckpt, DEMO_RULES, DEMO_CONFIG, 3, WB_CKPT_FORM_MODEL);
    struct bc o = b;
    snprintf(o.ckpt, sizeof(o.ckpt), "%s/otherck-other", wb_test_tmpdir());
    write_ckpt(o.ckpt, DEMO_RULES, DEMO_CONFIG, 3, WB_CKPT_FORM_MODEL);
    char want[33], have[33], t0[200] = "", t1[200] = "", fa[200], fb[200];
    size_t npieces = 0;
    share_hash(b.ckpt, 1, false, want, t0, t1, sizeof(t0), &npieces);
    share_hash(o.ckpt, 1, true, have, t0, t1, sizeof(t0), &npieces);
    CHECK(strcmp(want, have) != 0);
    /* the fingerprint (files, names, sizes, headers) cannot tell the two apart */
    {
        struct wb_errlist el;
        struct wb_ckpt *c1 = NULL, *c2 = NULL;
        wb_errlist_init(&el);
        CHECK_INT(wb_ckpt_open(b.ckpt, &c1, &el), 0);
        CHECK_INT(wb_ckpt_open(o.ckpt, &c2, &el), 0);
        CHECK_INT(wb_ckpt_fingerprint(c1, fa, sizeof(fa)), 0);
        CHECK_INT(wb_ckpt_fingerprint(c2, fb, sizeof(fb)), 0);
        CHECK_STR(fa, fb);
        wb_ckpt_close(c1);
        wb_ckpt_close(c2);
        wb_errlist_free(&el);
    }
    start_coordinator(&b, "coord.log", NULL);
    start_rollouts(&b, NULL);
    start_reader(&b, 0, NULL);
    b.rd[1] = start_reader(&o, 1, NULL);
    CHECK_INT(e2e_wait(b.rd[1], 30000), 1);
    /* both hashes, and which tensors differ: the first of the two by name, in the share's order */
    char line[1024];
    snprintf(line, sizeof(line),
             "register: trainer rank 1 reads %s share 1/2 content %s, the job moves %s share "
             "1/2 content %s; 2 of the share's %zu tensors differ, the first: %s\n",
             fa, have, fa, want, npieces, t0);
    char *out = e2e_slurp("reader1.log");
    CHECK_CONTAINS(out, line);
    free(out);
    CHECK_INT(e2e_wait(b.coord, 30000), 1);
    out = e2e_slurp("coord.log");
    char full[1200];
    snprintf(full, sizeof(full), "wb-broadcast: the broadcast failed\n  reader 1: %s", line);
    CHECK_CONTAINS(out, full);
    CHECK(strstr(out, "verified") == NULL);
    CHECK(strstr(out, "complete on") == NULL);
    free(out);
    /* the job ended: every agent was told to exit, and none had received a byte */
    CHECK_INT(e2e_wait(b.rd[0], 30000), 0);
    for (int r = 0; r < b.rollouts; r++) {
        CHECK_INT(e2e_wait(b.ro[r], 30000), 0);
        char path[800];
        struct stat st;
        snprintf(path, sizeof(path), "%s/rollout%d.v1.bin", b.dump, r);
        CHECK(stat(path, &st) != 0);
    }
}

/* ---------------------------------------------------------------- resume, checksums */

/* Whether text has a match of the extended regular expression re. */
static bool matches(const char *text, const char *re)
{
    regex_t rx;
    if (regcomp(&rx, re, REG_EXTENDED | REG_NEWLINE))
        wb_test_fail(__FILE__, __LINE__, "bad regex %s", re);
    bool m = regexec(&rx, text, 0, NULL, 0) == 0;
    regfree(&rx);
    return m;
}

/* Waits until the file's text contains needle. */
static char *await_log(const char *log, const char *needle, unsigned ms)
{
    for (unsigned t = 0;; t += 50) {
        char *out = e2e_slurp(log);
        if (strstr(out, needle))
            return out;
        if (t >= ms)
            wb_test_fail(__FILE__, __LINE__, "%s lacks \"%s\" after %u ms:\n%s", log, needle, ms,
                         out);
        free(out);
        e2e_sleep_ms(50);
    }
}

/* A reader killed in the middle of the transfer: the attempt fails, the coordinator waits for
 * it, and once it is restarted the next attempt sends only the rollout tensors that had not
 * landed; every rollout byte is right all the same, and nothing was published before. */
static void test_kill_reader_resume(void)
{
    struct bc b;
    setup(&b, "kill", 5, DEMO_RULES, DEMO_CONFIG, 2, 2, "mem_cap: 4MiB\n");
    write_ckpt(b.ckpt, DEMO_RULES, DEMO_CONFIG, 3, WB_CKPT_FORM_MODEL);
    start_coordinator(&b, "coord.log", "100ms");
    start_rollouts(&b, NULL);
    start_reader(&b, 0, "150ms"); /* paced: about 3.5 s for their 23 tasks each */
    start_reader(&b, 1, "150ms");
    free(await_log("coord.log", "] ", 30000)); /* the transfer runs: a progress line */
    e2e_sleep_ms(300);
    CHECK_INT(kill(b.rd[1], SIGKILL), 0);
    CHECK_INT(e2e_wait(b.rd[1], 5000), 128 + SIGKILL);
    char *out = await_log("coord.log", "to resume; only what has not landed is sent again", 30000);
    CHECK_CONTAINS(out, "wb-broadcast: attempt 1 failed: transfer 1 failed: ");
    CHECK_CONTAINS(out, "wb-broadcast: restart reader 1 (dead) to resume");
    free(out);
    char path[800];
    snprintf(path, sizeof(path), "%s/rollout0.v1.bin", b.dump);
    CHECK(access(path, F_OK) != 0); /* not published with a piece missing */
    start_reader(&b, 1, NULL);
    out = finish_ok(&b, 60000, NULL);
    CHECK_CONTAINS(out, "wb-broadcast: attempt 2: resuming version 1\n");
    CHECK_CONTAINS(out, " (2 attempts)\n");
    /* plain progress lines: elapsed, bytes, rate, ETA, slowest reader */
    if (!matches(out, "^wb-broadcast: \\[ *[0-9]+\\.[0-9] s\\] [0-9.]+ (B|kB|MB) / 6\\.85 MB +"
                      "[0-9]+\\.[0-9]%  [0-9.]+ (B|kB|MB)/s  ETA ([0-9]:[0-9]{2}|-:--)  slowest "
                      "reader [01] [0-9]+\\.[0-9]%$"))
        wb_test_fail(__FILE__, __LINE__, "no plain progress line:\n%s", out);
    const char *r = strstr(out, "resumed: the later attempts wrote ");
    unsigned long long resent = 0, plan = 0;
    CHECK(r && sscanf(r, "resumed: the later attempts wrote %llu of the plan's %llu bytes", &resent,
                      &plan) == 2);
    CHECK_U64(plan, DEMO_WRITE_BYTES);
    if (resent == 0 || resent >= plan)
        wb_test_fail(__FILE__, __LINE__, "the resumed attempt wrote %llu of %llu bytes", resent,
                     plan);
    free(out);
    CHECK_U64(verify(&b), DEMO_WRITE_BYTES);
}

/* A reader's file written to after its content was checked (the transfer under way): the next
 * read from it fails the transfer naming the file, nothing is retried, nothing published. */
static void test_changed_after_check(void)
{
    struct bc b;
    setup(&b, "changed", 32, DEMO_RULES, DEMO_CONFIG, 2, 2, "mem_cap: 4MiB\n");
    write_ckpt(b.ckpt, DEMO_RULES, DEMO_CONFIG, 3, WB_CKPT_FORM_MODEL);
    /* the file holding the last piece of reader 1's share, and where that piece is */
    struct wb_errlist el;
    struct wb_ckpt *ck = NULL;
    struct wb_ckpt_shares sh = {0};
    wb_errlist_init(&el);
    CHECK_INT(wb_ckpt_open(b.ckpt, &ck, &el), 0);
    CHECK_INT(wb_ckpt_shares_make(ck, 2, &sh), 0);
    const struct wb_ckpt_piece *p = &sh.share[1].piece[sh.share[1].n - 1];
    const struct wb_ckpt_loc *l = &ck->loc[p->tensor];
    char path[900], name[200];
    snprintf(path, sizeof(path), "%s", ck->files[l->file].path);
    snprintf(name, sizeof(name), "%s", ck->files[l->file].name);
    off_t at = (off_t)(l->offset + p->offset);
    wb_ckpt_shares_free(&sh);
    wb_ckpt_close(ck);
    wb_errlist_free(&el);

    start_coordinator(&b, "coord.log", "100ms");
    start_rollouts(&b, NULL);
    start_reader(&b, 0, "150ms"); /* paced: about 3.5 s for their 23 tasks each */
    start_reader(&b, 1, "150ms");
    free(await_log("coord.log", "] ", 30000)); /* the transfer runs: a progress line */
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    uint8_t byte = 0;
    CHECK_INT((int)pread(fd, &byte, 1, at), 1);
    byte ^= 0x80;
    CHECK_INT((int)pwrite(fd, &byte, 1, at), 1);
    CHECK_INT(close(fd), 0);
    CHECK_INT(e2e_wait(b.coord, 60000), 1);
    char *out = e2e_slurp("coord.log");
    char want[600];
    snprintf(want, sizeof(want),
             ": %s: the file changed after its content was checked (written to since): its "
             "bytes are not the ones proven equal to the coordinator's checkpoint\n",
             name);
    CHECK_CONTAINS(out, "wb-broadcast: the broadcast failed\n  transfer 1 failed: ");
    CHECK_CONTAINS(out, want);
    CHECK(!strstr(out, "attempt 2"));
    CHECK(!strstr(out, "verified"));
    free(out);
    for (int r = 0; r < b.rollouts; r++) {
        CHECK_INT(e2e_wait(b.ro[r], 20000), 0);
        snprintf(path, sizeof(path), "%s/rollout%d.v1.bin", b.dump, r);
        CHECK(access(path, F_OK) != 0);
    }
    for (int r = 0; r < b.readers; r++)
        CHECK_INT(e2e_wait(b.rd[r], 20000), 0);
}

/* A byte flipped at rollout 2 after it landed: its checksum names the tensor, the bytes and
 * both ranks, the version fails, and no rollout publishes it. */
static void test_checksum_mismatch(void)
{
    struct bc b;
    setup(&b, "sum", 6, DEMO_RULES, DEMO_CONFIG, 2, 2, "mem_cap: 4MiB\n");
    write_ckpt(b.ckpt, DEMO_RULES, DEMO_CONFIG, 3, WB_CKPT_FORM_MODEL);
    start_coordinator(&b, "coord.log", NULL);
    start_rollouts(&b, "model.layers.0.self_attn.qkv_proj.weight");
    start_reader(&b, 0, NULL);
    start_reader(&b, 1, NULL);
    CHECK_INT(e2e_wait(b.coord, 60000), 1);
    char *out = e2e_slurp("coord.log");
    if (!matches(out, "^wb-broadcast: the broadcast failed\n  transfer 1 failed: rollout rank 2: "
                      "model\\.layers\\.0\\.self_attn\\.qkv_proj\\.weight: bytes \\[0, 65536\\) "
                      "written by trainer rank 0 do not match their checksum: sum64 [0-9a-f]{16} "
                      "landed, [0-9a-f]{16} sent\n$"))
        wb_test_fail(__FILE__, __LINE__, "no checksum failure:\n%s", out);
    CHECK(!strstr(out, "attempt 2")); /* a mismatch is not retried */
    free(out);
    for (int r = 0; r < b.readers; r++)
        CHECK_INT(e2e_wait(b.rd[r], 20000), 0);
    for (int r = 0; r < b.rollouts; r++) {
        CHECK_INT(e2e_wait(b.ro[r], 20000), 0);
        char path[800];
        snprintf(path, sizeof(path), "%s/rollout%d.v1.bin", b.dump, r);
        CHECK(access(path, F_OK) != 0);
    }
}

/* ---------------------------------------------------------------- a real terminal */

/* The coordinator under script(1), so its output is a pseudo-terminal: one progress line
 * rewritten in place (carriage return, erase to the end of the line). */
static void test_progress_terminal(void)
{
    if (system("script --version >/dev/null 2>&1") != 0)
        wb_test_skip("no script(1) (util-linux / bsdutils): scripts/deps.sh installs it");
    char why[300];
    if (!e2e_pty_possible(why, sizeof(why)))
        wb_test_skip("no pseudo-terminal can be made here (%s): script(1) needs one", why);
    struct bc b;
    setup(&b, "tty", 7, DEMO_RULES, DEMO_CONFIG, 2, 2, "mem_cap: 4MiB\n");
    write_ckpt(b.ckpt, DEMO_RULES, DEMO_CONFIG, 3, WB_CKPT_FORM_MODEL);
    char cmd[3000];
    snprintf(cmd, sizeof(cmd), "%s/wb-broadcast --checkpoint %s --job %s --wait 60s", e2e_bin(),
             b.ckpt, b.job);
    char *argv[] = {"/usr/bin/env", "script", "-qfec", cmd, "/dev/null", NULL};
    b.coord = spawn("coord.log", argv);
    start_rollouts(&b, NULL);
    start_reader(&b, 0, "40ms");
    start_reader(&b, 1, "40ms");
    char *out = finish_ok(&b, 60000, NULL);
    /* updates while it runs, and the last one at 100% before the summary */
    if (!matches(out, "\r[0-9.]+ (B|kB|MB) / 6\\.85 MB +[0-9]+\\.[0-9]%  [0-9.]+ (B|kB|MB)/s  ETA "
                      "[0-9]:[0-9]{2}  slowest reader [01] [0-9]+\\.[0-9]%\033\\[K\r"))
        wb_test_fail(__FILE__, __LINE__, "no live progress update:\n%s", out);
    if (!matches(out, "\r6\\.85 MB / 6\\.85 MB  100\\.0%  [0-9.]+ (kB|MB)/s  ETA -:--  slowest "
                      "reader [01] 100\\.0%\033\\[K\r?\n"))
        wb_test_fail(__FILE__, __LINE__, "no final progress line:\n%s", out);
    CHECK_CONTAINS(out, "wb-broadcast: version 1 complete on 4 rollouts in ");
    CHECK(!strstr(out, "] 6.85 MB")); /* no plain lines on a terminal */
    free(out);
    CHECK_U64(verify(&b), DEMO_WRITE_BYTES);
}

/* Where no pseudo-terminal can be made, progress_terminal skips saying why instead of failing
 * on script(1)'s error: run again in a mount namespace whose /dev/pts is an empty tmpfs. */
static void test_progress_terminal_no_pty(void)
{
    char *out;
    if (geteuid() != 0 || system("unshare -m true >/dev/null 2>&1") != 0)
        wb_test_skip("cannot make a mount namespace here (unshare -m needs root)");
    char *self = realpath("/proc/self/exe", NULL);
    CHECK(self != NULL);
    CHECK_INT(e2e_run(&out,
                      "unshare -m sh -c 'mount -t tmpfs none /dev/pts && exec %s "
                      "progress_terminal'",
                      self),
              0);
    free(self);
    CHECK_CONTAINS(out, "\nskipped: no pseudo-terminal can be made here (posix_openpt: No such "
                        "device): script(1) needs one\nSKIP bcast progress_terminal (");
    CHECK_CONTAINS(out, "\n0 passed, 0 failed, 1 skipped\n");
    free(out);
}

const struct wb_test wb_tests[] = {
    {"demo_bf16", test_demo_bf16, 120},
    {"demo_fp8", test_demo_fp8, 120},
    {"one_gb", test_one_gb, 1200}, /* 42 s on a quiet 2-core machine; near 400 s under load */
    {"bad_files", test_bad_files, 120},
    {"bad_inputs", test_bad_inputs, 120},
    {"token", test_token, 60},
    {"wrong_reader", test_wrong_reader, 60},
    {"other_checkpoint", test_other_checkpoint, 120},
    {"changed_after_check", test_changed_after_check, 120},
    {"kill_reader_resume", test_kill_reader_resume, 180},
    {"checksum_mismatch", test_checksum_mismatch, 120},
    {"progress_terminal", test_progress_terminal, 120},
    {"progress_terminal_no_pty", test_progress_terminal_no_pty, 60},
    {"mtp_ignored", test_mtp_ignored, 120},
    {0},
};
