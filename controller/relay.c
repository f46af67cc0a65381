/* relay.c — the relay forest of a transfer attempt: which rollout replicas the trainers write
 * (the roots) and, for every other replica of the attempt, the replica that forwards the
 * version to it (its parent). Replicas are congruent (the same receive lists at every local
 * rank), so a parent's local rank l writes its child's local rank l, at the same offsets.
 *
 * The shape is the job's (relay: chain | tree, relay_fanout, relay_roots) and the forest is
 * made per attempt over the attempt's replicas, in replica order: the first `roots` are
 * written by the trainers and the one at position m >= roots is the child of position
 * (m - roots) / fanout (a chain is a tree of fanout 1: 0 -> 1 -> 2 -> 3). A replica left out
 * of an attempt (a dead relay, once replicas can be dropped) is simply not in the list, and
 * the replicas after it move up: the next attempt's forest routes around it. */
#include "controller/ctl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ctl_relay_forest(int shape, uint32_t fanout, uint32_t roots, const uint8_t *member,
                     uint32_t replicas, uint32_t *parent)
{
    if (shape != WB_RELAY_OFF && shape != WB_RELAY_CHAIN && shape != WB_RELAY_TREE)
        return -EINVAL;
    uint32_t k = shape == WB_RELAY_CHAIN ? 1 : fanout;
    if (shape != WB_RELAY_OFF && (k == 0 || roots == 0))
        return -EINVAL;
    uint32_t *pos = malloc((replicas ? replicas : 1) * sizeof(uint32_t));
    if (!pos)
        return -ENOMEM;
    uint32_t n = 0;
    for (uint32_t r = 0; r < replicas; r++) {
        parent[r] = CTL_RELAY_ROOT;
        if (!member || member[r])
            pos[n++] = r; /* position -> replica */
    }
    for (uint32_t m = roots; shape != WB_RELAY_OFF && m < n; m++)
        parent[pos[m]] = pos[(m - roots) / k];
    free(pos);
    return 0;
}

void ctl_relay_put(struct wb_mpw *w, uint32_t per_replica, const uint32_t *parent,
                   uint32_t replicas)
{
    wb_mpw_array(w, 2);
    wb_mpw_u64(w, per_replica);
    wb_mpw_array(w, replicas);
    for (uint32_t r = 0; r < replicas; r++) {
        uint32_t n = 0;
        for (uint32_t c = 0; c < replicas; c++)
            n += parent[c] == r;
        wb_mpw_array(w, n);
        for (uint32_t c = 0; c < replicas; c++)
            if (parent[c] == r)
                wb_mpw_u64(w, c);
    }
}

/* Whether replica c lies below replica r (r is an ancestor of c). The forest has no cycle:
 * every parent sits at an earlier position than its child. */
static bool below(const uint32_t *parent, uint32_t replicas, uint32_t c, uint32_t r)
{
    for (uint32_t hops = 0; hops < replicas && c < replicas && parent[c] != CTL_RELAY_ROOT;
         hops++) {
        c = parent[c];
        if (c == r)
            return true;
    }
    return false;
}

uint32_t ctl_relay_downstream(const uint32_t *parent, uint32_t replicas, uint32_t r, char *buf,
                              size_t cap)
{
    uint32_t n = 0;
    size_t at = 0;
    if (cap)
        buf[0] = 0;
    for (uint32_t c = 0; parent && c < replicas; c++) {
        if (!below(parent, replicas, c, r))
            continue;
        int k = snprintf(buf + at, at < cap ? cap - at : 0, "%s%u", n ? ", " : "", c);
        at += k > 0 ? (size_t)k : 0;
        n++;
    }
    if (cap && at >= cap)
        buf[cap - 1] = 0;
    return n;
}
