/* config_test.c — the YAML document helpers and the table-driven config loader: values,
 * defaults, nested sections, and exact file:line:col messages for every kind of mistake. */
#include "common/common.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

struct net_cfg {
    char *provider;
    int64_t rails;
    uint64_t chunk;
};

struct job_cfg {
    char *name;
    int64_t world_size;
    uint64_t replicas;
    double quant_gbps;
    bool verify;
    uint64_t mem_cap;
    uint64_t heartbeat;
    int mode;
    struct net_cfg net;
    const struct wb_ynode *placement;
};

static const char *const modes[] = {"auto", "direct", "gather", NULL};

static const struct wb_cfg_field net_fields[] = {
    {"provider", WB_CFG_STR, "tcp", "libfabric provider", offsetof(struct net_cfg, provider)},
    {"rails", WB_CFG_I64, "1", "endpoints per GPU", offsetof(struct net_cfg, rails)},
    {"chunk", WB_CFG_SIZE, "1MiB", "write shard size", offsetof(struct net_cfg, chunk)},
    {0},
};

static const struct wb_cfg_field job_fields[] = {
    {"name", WB_CFG_STR, NULL, "job name", offsetof(struct job_cfg, name)},
    {"world_size", WB_CFG_I64, NULL, "trainer GPUs", offsetof(struct job_cfg, world_size)},
    {"replicas", WB_CFG_U64, "1", "rollout replicas", offsetof(struct job_cfg, replicas)},
    {"quant_gbps", WB_CFG_F64, "2000", "quantization GB/s", offsetof(struct job_cfg, quant_gbps)},
    {"verify", WB_CFG_BOOL, "false", "check every byte", offsetof(struct job_cfg, verify)},
    {"mem_cap", WB_CFG_SIZE, "1GiB", "temporary memory cap", offsetof(struct job_cfg, mem_cap)},
    {"heartbeat", WB_CFG_DURATION, "500ms", "heartbeat period",
     offsetof(struct job_cfg, heartbeat)},
    {"mode", WB_CFG_ENUM, "auto", "routing mode", offsetof(struct job_cfg, mode), modes},
    {"net", WB_CFG_SECTION, "", "transport", offsetof(struct job_cfg, net), NULL, net_fields},
    {"placement", WB_CFG_NODE, "", "placement rules", offsetof(struct job_cfg, placement)},
    {0},
};

/* Parses text as file "job.yaml"; returns the status and leaves messages in el. */
static int parse(const char *text, struct job_cfg *cfg, struct wb_errlist *el,
                 struct wb_yaml **yout)
{
    const char *path = wb_test_write_file("job.yaml", text);
    struct wb_yaml *y = NULL;
    memset(cfg, 0, sizeof(*cfg));
    int r = wb_yaml_load(path, el, &y);
    if (r)
        return r;
    r = wb_cfg_parse(y, wb_yaml_root(y), job_fields, cfg, el);
    if (yout)
        *yout = y;
    else
        wb_yaml_free(y);
    return r;
}

/* The n-th message with the temporary directory replaced by "T". */
static const char *msg(const struct wb_errlist *el, size_t i)
{
    static char buf[1024];
    CHECK(i < el->n);
    const char *dir = wb_test_tmpdir();
    const char *m = el->msgs[i];
    size_t dl = strlen(dir);
    if (strncmp(m, dir, dl) == 0)
        snprintf(buf, sizeof(buf), "T%s", m + dl);
    else
        snprintf(buf, sizeof(buf), "%s", m);
    return buf;
}

static void test_values_and_defaults(void)
{
    struct job_cfg c;
    struct wb_errlist el;
    struct wb_yaml *y;
    wb_errlist_init(&el);
    CHECK_INT(parse("name: kimi\n"
                    "world_size: 256\n"
                    "mem_cap: 1.5GiB\n"
                    "heartbeat: 2s\n"
                    "mode: gather\n"
                    "verify: yes\n"
                    "net:\n"
                    "  provider: shm\n"
                    "  chunk: 4MB\n"
                    "placement:\n"
                    "  - {pattern: '*.experts.*', fsdp: shard0}\n",
                    &c, &el, &y),
              0);
    CHECK_INT(el.n, 0);
    CHECK_STR(c.name, "kimi");
    CHECK_INT(c.world_size, 256);
    CHECK_U64(c.replicas, 1);
    CHECK(c.quant_gbps == 2000.0);
    CHECK(c.verify);
    CHECK_U64(c.mem_cap, 1610612736);
    CHECK_U64(c.heartbeat, 2000000000);
    CHECK_INT(c.mode, 2);
    CHECK_STR(c.net.provider, "shm");
    CHECK_INT(c.net.rails, 1);
    CHECK_U64(c.net.chunk, 4000000);
    CHECK_INT(wb_ynode_kind(c.placement), WB_YNODE_SEQ);
    CHECK_INT(wb_ynode_len(c.placement), 1);
    const struct wb_ynode *item = wb_ynode_item(y, c.placement, 0);
    CHECK_STR(wb_ynode_scalar(wb_ynode_get(y, item, "fsdp")), "shard0");
    char where[256];
    wb_yaml_where(y, item, where, sizeof(where));
    CHECK(strstr(where, "job.yaml:11:5") != NULL);
    wb_cfg_free(job_fields, &c);
    CHECK(c.name == NULL && c.net.provider == NULL);
    wb_yaml_free(y);
    wb_errlist_free(&el);
}

static void test_every_error_reported(void)
{
    struct job_cfg c;
    struct wb_errlist el;
    wb_errlist_init(&el);
    CHECK_INT(parse("wrold_size: 256\n"
                    "replicas: -2\n"
                    "mem_cap: lots\n"
                    "mode: fastest\n"
                    "verify: maybe\n"
                    "net:\n"
                    "  rails: two\n"
                    "  provder: tcp\n"
                    "heartbeat: [1, 2]\n"
                    "replicas: 3\n",
                    &c, &el, NULL),
              -WB_E_CONFIG);
    CHECK_INT(el.n, 11);
    CHECK_STR(msg(&el, 0), "T/job.yaml:1:1: wrold_size: unknown key");
    CHECK_STR(msg(&el, 1), "T/job.yaml:2:11: replicas: expected a non-negative integer, got '-2'");
    CHECK_STR(msg(&el, 2),
              "T/job.yaml:3:10: mem_cap: expected a size such as 4096, 64KiB or 1GiB, got 'lots'");
    CHECK_STR(msg(&el, 3),
              "T/job.yaml:4:7: mode: expected one of auto|direct|gather, got 'fastest'");
    CHECK_STR(msg(&el, 4), "T/job.yaml:5:9: verify: expected true or false, got 'maybe'");
    CHECK_STR(msg(&el, 5), "T/job.yaml:7:10: net.rails: expected an integer, got 'two'");
    CHECK_STR(msg(&el, 6), "T/job.yaml:8:3: net.provder: unknown key");
    CHECK_STR(
        msg(&el, 7),
        "T/job.yaml:9:12: heartbeat: expected a duration such as 250ms or 2s, got a sequence");
    CHECK_STR(msg(&el, 8), "T/job.yaml:10:1: replicas: duplicate key");
    CHECK_STR(msg(&el, 9), "T/job.yaml:1:1: name: required key missing");
    CHECK_STR(msg(&el, 10), "T/job.yaml:1:1: world_size: required key missing");
    wb_cfg_free(job_fields, &c);
    wb_errlist_free(&el);
}

static void test_syntax_error_location(void)
{
    struct job_cfg c;
    struct wb_errlist el;
    wb_errlist_init(&el);
    CHECK_INT(parse("name: a\nworld_size: [1, 2\nmode: auto\n", &c, &el, NULL), -WB_E_CONFIG);
    CHECK_INT(el.n, 1);
    CHECK_STR(msg(&el, 0),
              "T/job.yaml:3:5: did not find expected ',' or ']' while parsing a flow sequence");
    wb_errlist_free(&el);
    wb_errlist_init(&el);
    CHECK_INT(parse("- just\n- a list\n", &c, &el, NULL), -WB_E_CONFIG);
    CHECK_STR(msg(&el, 0), "T/job.yaml:1:1: expected a mapping of keys");
    wb_errlist_free(&el);
    wb_errlist_init(&el);
    struct wb_yaml *y = NULL;
    CHECK_INT(wb_yaml_load("/nonexistent/job.yaml", &el, &y), -ENOENT);
    CHECK_STR(msg(&el, 0), "/nonexistent/job.yaml: cannot open: No such file or directory");
    CHECK(y == NULL);
    wb_errlist_free(&el);
}

static void test_section_type_error(void)
{
    struct job_cfg c;
    struct wb_errlist el;
    wb_errlist_init(&el);
    CHECK_INT(parse("name: a\nworld_size: 2\nnet: tcp\n", &c, &el, NULL), -WB_E_CONFIG);
    CHECK_INT(el.n, 1);
    CHECK_STR(msg(&el, 0), "T/job.yaml:3:6: net: expected a mapping");
    wb_cfg_free(job_fields, &c);
    wb_errlist_free(&el);
    /* an empty section keeps its defaults */
    wb_errlist_init(&el);
    CHECK_INT(parse("name: a\nworld_size: 2\nnet:\n", &c, &el, NULL), 0);
    CHECK_STR(c.net.provider, "tcp");
    wb_cfg_free(job_fields, &c);
    wb_errlist_free(&el);
}

static void test_dump_config(void)
{
    const char *path = wb_test_write_file("dump.txt", "");
    FILE *f = fopen(path, "w");
    CHECK(f);
    wb_cfg_dump(job_fields, f);
    fclose(f);
    f = fopen(path, "r");
    char text[2048];
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = 0;
    CHECK_STR(text, "name: <required>                 # job name\n"
                    "world_size: <required>           # trainer GPUs\n"
                    "replicas: 1                      # rollout replicas\n"
                    "quant_gbps: 2000                 # quantization GB/s\n"
                    "verify: false                    # check every byte\n"
                    "mem_cap: 1GiB                    # temporary memory cap\n"
                    "heartbeat: 500ms                 # heartbeat period\n"
                    "mode: auto                       # routing mode (auto|direct|gather)\n"
                    "net:                             # transport\n"
                    "  provider: tcp                  # libfabric provider\n"
                    "  rails: 1                       # endpoints per GPU\n"
                    "  chunk: 1MiB                    # write shard size\n"
                    "placement: <optional>            # placement rules\n");
}

static void test_scalar_parsers(void)
{
    uint64_t u;
    int64_t i;
    double d;
    bool b;
    CHECK_INT(wb_parse_size("64KiB", &u), 0);
    CHECK_U64(u, 65536);
    CHECK_INT(wb_parse_size("512M", &u), 0);
    CHECK_U64(u, 536870912);
    CHECK_INT(wb_parse_size("2GB", &u), 0);
    CHECK_U64(u, 2000000000);
    CHECK_INT(wb_parse_size("4096", &u), 0);
    CHECK_U64(u, 4096);
    CHECK_INT(wb_parse_size("1.5B", &u), -EINVAL);
    CHECK_INT(wb_parse_size("-1KiB", &u), -EINVAL);
    CHECK_INT(wb_parse_size("1 XB", &u), -EINVAL);
    CHECK_INT(wb_parse_duration("250ms", &u), 0);
    CHECK_U64(u, 250000000);
    CHECK_INT(wb_parse_duration("1.5", &u), 0);
    CHECK_U64(u, 1500000000);
    CHECK_INT(wb_parse_duration("10us", &u), 0);
    CHECK_U64(u, 10000);
    CHECK_INT(wb_parse_duration("soon", &u), -EINVAL);
    CHECK_INT(wb_parse_i64("-42", &i), 0);
    CHECK_INT(i, -42);
    CHECK_INT(wb_parse_i64("0x10", &i), 0);
    CHECK_INT(i, 16);
    CHECK_INT(wb_parse_i64("12abc", &i), -EINVAL);
    CHECK_INT(wb_parse_i64("99999999999999999999", &i), -EINVAL);
    CHECK_INT(wb_parse_u64("-1", &u), -EINVAL);
    CHECK_INT(wb_parse_u64(" 1", &u), -EINVAL);
    CHECK_INT(wb_parse_f64("2.5e3", &d), 0);
    CHECK(d == 2500.0);
    CHECK_INT(wb_parse_f64("inf", &d), -EINVAL);
    CHECK_INT(wb_parse_bool("On", &b), 0);
    CHECK(b);
    CHECK_INT(wb_parse_bool("nope", &b), -EINVAL);
}

const struct wb_test wb_tests[] = {
    {"values_and_defaults", test_values_and_defaults, 0},
    {"every_error_reported", test_every_error_reported, 0},
    {"syntax_error_location", test_syntax_error_location, 0},
    {"section_type_error", test_section_type_error, 0},
    {"dump_config", test_dump_config, 0},
    {"scalar_parsers", test_scalar_parsers, 0},
    {0},
};
