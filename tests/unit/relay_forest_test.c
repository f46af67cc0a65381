/* relay_forest_test.c — the relay forest of an attempt (controller/relay.c) and how an agent
 * reads it back from TRANSFER.relay (agent/data.c, ag_relay_parse): the shapes the job asks for
 * (chain, tree with a fanout, several roots), replicas left out of an attempt, the replicas
 * below a lost relay as a failure names them, and the malformed forests an agent refuses
 * (a child of two parents, a cycle, a replica out of range). */
#include "agent/xfer.h"
#include "controller/ctl.h"
#include "tests/wbtest.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum { R = CTL_RELAY_ROOT };

static void check_parent(const uint32_t *got, const uint32_t *want, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        CHECK_U64(got[i], want[i]);
}

static void test_shapes(void)
{
    uint32_t p[8];
    CHECK_INT(ctl_relay_forest(WB_RELAY_CHAIN, 2, 1, NULL, 4, p), 0); /* fanout unused */
    check_parent(p, (const uint32_t[]){R, 0, 1, 2}, 4);
    CHECK_INT(ctl_relay_forest(WB_RELAY_TREE, 2, 1, NULL, 7, p), 0);
    check_parent(p, (const uint32_t[]){R, 0, 0, 1, 1, 2, 2}, 7);
    CHECK_INT(ctl_relay_forest(WB_RELAY_TREE, 3, 2, NULL, 8, p), 0);
    check_parent(p, (const uint32_t[]){R, R, 0, 0, 0, 1, 1, 1}, 8);
    CHECK_INT(ctl_relay_forest(WB_RELAY_CHAIN, 1, 2, NULL, 5, p), 0); /* two chains */
    check_parent(p, (const uint32_t[]){R, R, 0, 1, 2}, 5);
    CHECK_INT(ctl_relay_forest(WB_RELAY_OFF, 2, 1, NULL, 3, p), 0);
    check_parent(p, (const uint32_t[]){R, R, R}, 3);
    CHECK_INT(ctl_relay_forest(WB_RELAY_TREE, 0, 1, NULL, 3, p), -EINVAL);
    CHECK_INT(ctl_relay_forest(WB_RELAY_CHAIN, 1, 0, NULL, 3, p), -EINVAL);
    CHECK_INT(ctl_relay_forest(7, 1, 1, NULL, 3, p), -EINVAL);
}

/* A replica not in the attempt has no parent and no child; the ones after it move up. */
static void test_members(void)
{
    uint32_t p[5];
    const uint8_t member[5] = {1, 0, 1, 1, 1};
    CHECK_INT(ctl_relay_forest(WB_RELAY_CHAIN, 1, 1, member, 5, p), 0);
    check_parent(p, (const uint32_t[]){R, R, 0, 2, 3}, 5);
    const uint8_t no_first[4] = {0, 1, 1, 1};
    CHECK_INT(ctl_relay_forest(WB_RELAY_TREE, 2, 1, no_first, 4, p), 0);
    check_parent(p, (const uint32_t[]){R, R, 1, 1}, 4);
}

static void test_downstream(void)
{
    uint32_t p[7];
    char buf[64];
    CHECK_INT(ctl_relay_forest(WB_RELAY_TREE, 2, 1, NULL, 7, p), 0);
    CHECK_U64(ctl_relay_downstream(p, 7, 1, buf, sizeof(buf)), 2);
    CHECK_STR(buf, "3, 4");
    CHECK_U64(ctl_relay_downstream(p, 7, 0, buf, sizeof(buf)), 6);
    CHECK_STR(buf, "1, 2, 3, 4, 5, 6");
    CHECK_U64(ctl_relay_downstream(p, 7, 6, buf, sizeof(buf)), 0);
    CHECK_STR(buf, "");
    CHECK_INT(ctl_relay_forest(WB_RELAY_CHAIN, 1, 1, NULL, 4, p), 0);
    CHECK_U64(ctl_relay_downstream(p, 4, 1, buf, sizeof(buf)), 2);
    CHECK_STR(buf, "2, 3");
    CHECK_U64(ctl_relay_downstream(p, 4, 1, buf, 3), 2); /* cut, still terminated */
    CHECK_STR(buf, "2,");
}

/* What the controller puts in TRANSFER.relay, read back by an agent. */
static void test_wire(void)
{
    uint32_t p[4], replicas, per, *parent;
    CHECK_INT(ctl_relay_forest(WB_RELAY_TREE, 2, 1, NULL, 4, p), 0);
    struct wb_mpw w;
    wb_mpw_init(&w);
    ctl_relay_put(&w, 2, p, 4);
    CHECK_INT(wb_mpw_finish(&w), 0);
    CHECK_INT(ag_relay_parse(&(struct wb_bytes){w.buf, w.len}, &replicas, &per, &parent), 0);
    CHECK_U64(replicas, 4);
    CHECK_U64(per, 2);
    check_parent(parent, (const uint32_t[]){UINT32_MAX, 0, 0, 1}, 4);
    free(parent);
    wb_mpw_free(&w);
    /* absent: no relay */
    CHECK_INT(ag_relay_parse(&(struct wb_bytes){NULL, 0}, &replicas, &per, &parent), 0);
    CHECK_U64(replicas, 0);
    CHECK(parent == NULL);
}

/* [per, forest] as msgpack, written by hand: the forests no controller makes. */
static int parse_raw(uint32_t per, uint32_t n, const uint32_t *const *children, const uint32_t *k)
{
    struct wb_mpw w;
    uint32_t replicas, pr, *parent = NULL;
    wb_mpw_init(&w);
    wb_mpw_array(&w, 2);
    wb_mpw_u64(&w, per);
    wb_mpw_array(&w, n);
    for (uint32_t i = 0; i < n; i++) {
        wb_mpw_array(&w, k[i]);
        for (uint32_t j = 0; j < k[i]; j++)
            wb_mpw_u64(&w, children[i][j]);
    }
    CHECK_INT(wb_mpw_finish(&w), 0);
    int rc = ag_relay_parse(&(struct wb_bytes){w.buf, w.len}, &replicas, &pr, &parent);
    if (rc == 0)
        CHECK(parent != NULL);
    else
        CHECK(parent == NULL);
    free(parent);
    wb_mpw_free(&w);
    return rc;
}

static void test_malformed(void)
{
    const uint32_t c1[] = {1}, c0[] = {0}, c2[] = {2}, c12[] = {1, 2}, c5[] = {5}, cself[] = {1};
    CHECK_INT(parse_raw(2, 3, (const uint32_t *const[]){c12, NULL, NULL}, (uint32_t[]){2, 0, 0}),
              0);
    /* two parents of replica 1 */
    CHECK_INT(parse_raw(2, 3, (const uint32_t *const[]){c1, NULL, c1}, (uint32_t[]){1, 0, 1}),
              -EBADMSG);
    /* a cycle: 0 -> 1 -> 0 */
    CHECK_INT(parse_raw(2, 2, (const uint32_t *const[]){c1, c0}, (uint32_t[]){1, 1}), -EBADMSG);
    /* 1 -> 2 -> 1, no root above them */
    CHECK_INT(parse_raw(2, 3, (const uint32_t *const[]){NULL, c2, c1}, (uint32_t[]){0, 1, 1}),
              -EBADMSG);
    /* its own child, a replica out of range, no ranks per replica */
    CHECK_INT(parse_raw(2, 2, (const uint32_t *const[]){NULL, cself}, (uint32_t[]){0, 1}),
              -EBADMSG);
    CHECK_INT(parse_raw(2, 2, (const uint32_t *const[]){c5, NULL}, (uint32_t[]){1, 0}), -EBADMSG);
    CHECK_INT(parse_raw(0, 2, (const uint32_t *const[]){c1, NULL}, (uint32_t[]){1, 0}), -EBADMSG);
}

const struct wb_test wb_tests[] = {
    {"shapes", test_shapes, 0},         {"members", test_members, 0},
    {"downstream", test_downstream, 0}, {"wire", test_wire, 0},
    {"malformed", test_malformed, 0},   {0},
};
