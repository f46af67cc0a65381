/* msg_fuzz.c — the control plane's decoder on hostile bytes: every message an agent, wb-ctl or
 * the controller could receive is opened (envelope, token), its body decoded into a buffer of
 * exactly its struct's size (so a write past it is caught), and a COMMANDS body's commands and
 * nested maps decoded one by one, as the agents and wb-ctl do. */
#include "proto/proto.h"

#include <stdlib.h>
#include <string.h>

/* A body struct's size: the end of its last field. */
static size_t body_size(uint32_t type)
{
    size_t n = 0, end = 1;
    const struct wb_field *f = wb_msg_fields(type, &n);
    for (size_t i = 0; f && i < n; i++)
        if (f[i].off + f[i].size > end)
            end = f[i].off + f[i].size;
    return end;
}

static void decode_map(struct wb_mpr *r, uint32_t type)
{
    void *b = malloc(body_size(type));
    char why[256];
    if (b && wb_body_get(r, type, b, why, sizeof(why)) == 0 && type == WB_MSG_RESULT) {
        const struct wb_body_result *res = b;
        struct wb_mpr s;
        uint32_t n;
        wb_mpr_init(&s, res->trainers.p, res->trainers.n);
        if (wb_mpr_array(&s, WB_RANKS_MAX, &n) == 0)
            for (uint32_t i = 0; i < n; i++) {
                struct wb_xfer_stats st;
                if (wb_body_get(&s, WB_BODY_STATS, &st, why, sizeof(why)))
                    break;
            }
    }
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct wb_msg m;
    const char *why;
    if (wb_msg_open(data, size, "fuzz-token", &m, &why))
        return 0;
    void *b = malloc(body_size(m.type));
    char w[256];
    if (b && wb_msg_decode(&m, b, w, sizeof(w)) == 0 && m.type == WB_MSG_COMMANDS) {
        struct wb_cmd_reader cr;
        if (wb_cmd_reader_init(&cr, &((struct wb_body_commands *)b)->cmds) == 0) {
            uint64_t seq;
            uint32_t type;
            struct wb_mpr body;
            while (wb_cmd_next(&cr, &seq, &type, &body) == 1)
                decode_map(&body, type);
        }
    } else if (b && m.type == WB_MSG_RESULT) {
        struct wb_msg again = m;
        decode_map(&again.r, WB_MSG_RESULT);
    }
    free(b);
    return 0;
}
