/* ckpriv.h — what the files of ckpt/ share and nobody else sees (ck_ prefix: made local when
 * the library is built). */
#ifndef WB_CKPRIV_H
#define WB_CKPRIV_H

#include "ckpt/ckpt.h"

/* pread(2) until len bytes are in: 0, -errno, or -EIO when the file ends first. */
int ck_read_full(int fd, void *buf, size_t len, uint64_t off);

/* The safetensors name of a dtype ("BF16", "F16", "F32", "F8_E4M3", "I32", "I64"), or NULL. */
const char *ck_st_dtype(enum wb_dtype dt);

#endif /* WB_CKPRIV_H */
