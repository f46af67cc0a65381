/* safetensors_fuzz.c — a safetensors file from hostile bytes (ckpt/: the header's length, its
 * JSON, dtypes, shapes, offsets): it opens or lists its problems; an opened one is read tensor by
 * tensor (every offset the header gave must hold). */
#include "ckpt/ckpt.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct wb_ckpt *ck = NULL;
    struct wb_errlist el;
    wb_errlist_init(&el);
    if (wb_ckpt_open(fuzz_file(data, size, ".safetensors"), &ck, &el) == 0) {
        struct wb_ckpt_io_opts o = {0};
        struct wb_ckpt_reader *r = NULL;
        if (wb_ckpt_reader_open(ck, &o, &r) == 0) {
            for (size_t i = 0; i < ck->inv.n; i++) {
                uint64_t n = ck->loc[i].bytes < (1u << 20) ? ck->loc[i].bytes : (1u << 20);
                void *buf = malloc(n + 1);
                uint64_t h;
                if (buf)
                    wb_ckpt_read(r, i, 0, n, buf, &h);
                free(buf);
            }
            wb_ckpt_reader_close(r);
        }
        wb_ckpt_close(ck);
    }
    wb_errlist_free(&el);
    return 0;
}
