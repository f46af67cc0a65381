/* launch.c — the launcher-environment reader: the rank and local GPU of a process started by
 * torchrun or srun, so that one command line serves every process of a job. */
#include "agent/agent.h"

#include <errno.h>
#include <stdlib.h>

static int env_int(const char *var, int64_t *out, const char **bad)
{
    const char *s = getenv(var);
    int64_t v;
    if (!s || !*s) {
        *out = -1;
        return 0;
    }
    if (wb_parse_i64(s, &v) || v < 0) {
        *bad = var;
        return -EINVAL;
    }
    *out = v;
    return 0;
}

int wb_launch_env_read(struct wb_launch_env *out, const char **bad)
{
    struct wb_launch_env e = {.rank = -1, .local_rank = -1, .world = -1, .source = "none"};
    const char *b = NULL;
    int err;
    if (getenv("RANK")) {
        e.source = "torchrun";
        err = env_int("RANK", &e.rank, &b);
        err = err ? err : env_int("LOCAL_RANK", &e.local_rank, &b);
        err = err ? err : env_int("WORLD_SIZE", &e.world, &b);
    } else if (getenv("SLURM_PROCID")) {
        e.source = "slurm";
        err = env_int("SLURM_PROCID", &e.rank, &b);
        err = err ? err : env_int("SLURM_LOCALID", &e.local_rank, &b);
        err = err ? err : env_int("SLURM_NTASKS", &e.world, &b);
    } else {
        err = 0;
    }
    if (err) {
        if (bad)
            *bad = b;
        return err;
    }
    *out = e;
    return 0;
}
