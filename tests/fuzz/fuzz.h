/* fuzz.h — what the fuzz targets (tests/fuzz/<name>_fuzz.c, libFuzzer entry points built by
 * `make fuzz`) share: the input as a file, for loaders that read paths. Header-only. */
#ifndef WB_FUZZ_H
#define WB_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Writes the input to a per-process file in /dev/shm (or $TMPDIR) and returns its path. */
static inline const char *fuzz_file(const uint8_t *data, size_t size, const char *suffix)
{
    static char path[256];
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
    snprintf(path, sizeof(path), "%s/wb-fuzz-%d%s", dir ? dir : "/tmp", (int)getpid(), suffix);
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    if (size && fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);
    return path;
}

#endif /* WB_FUZZ_H */
