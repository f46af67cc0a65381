/* bpriv.h — what the files of bcast/ share and nobody else sees (bc_ prefix: made local when
 * the library is built). */
#ifndef WB_BPRIV_H
#define WB_BPRIV_H

#include "bcast/bcast.h"

/* Decimal bytes ("1.07 GB", "512 B") and a duration as m:ss or h:mm:ss. */
char *bc_fmt_dec(uint64_t bytes, char *buf, size_t cap);
char *bc_fmt_secs(double s, char *buf, size_t cap);

#endif /* WB_BPRIV_H */
