/* txtest.h — what the programs that open transports in tests share. Include it in one file of
 * a test program (it defines LeakSanitizer's hooks).
 *
 * LeakSanitizer: libfabric 1.17's tcp;ofi_rxm keeps about 190 bytes per accepted connection
 * after fi_close (allocated inside fi_cq_read's progress; a raw libfabric program closing the
 * same objects in the same order does not show it, and it could not be narrowed further without
 * the library's symbols). Only allocations made inside libfabric are exempt; everything this
 * project allocates is still checked. */
#ifndef WB_TESTS_TXTEST_H
#define WB_TESTS_TXTEST_H

#include "common/common.h"
#include "transport/transport.h"

#include <string.h>

const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libfabric.so\n";
}
const char *__lsan_default_options(void);
const char *__lsan_default_options(void)
{
    return "print_suppressions=0";
}

/* A transport opened from the YAML text of its configuration; problems go to el. */
static inline int wb_test_tx_open(const char *yaml, struct wb_errlist *el, struct wb_tx **tx)
{
    struct wb_yaml *y = NULL;
    struct wb_tx_cfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    int r = wb_yaml_load_string("transport.yaml", yaml, el, &y);
    if (!r)
        r = wb_cfg_parse(y, wb_yaml_root(y), wb_tx_cfg_fields, &cfg, el);
    if (!r)
        r = wb_tx_open(&cfg, el, tx);
    wb_cfg_free(wb_tx_cfg_fields, &cfg);
    wb_yaml_free(y);
    return r;
}

#endif
