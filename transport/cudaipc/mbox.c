/* mbox.c — the immediate mailbox of the CUDA IPC backend: a POSIX shared-memory segment owned
 * by the receiving transport, with one single-producer ring per writer. Plain C so it builds and
 * is tested without CUDA; see cudaipc.h for why it exists and how it is shaped. */
#include "transport/cudaipc/cudaipc.h"
#include "transport/tx_priv.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum { MBOX_MAGIC = 0x57424d42u, MBOX_VERSION = 2 /* 2: notes */ };
_Static_assert((int)WB_MBOX_NOTE == (int)WB_TXN_WIRE, "a mailbox entry is a note");

/* 1 while pid names a live, non-zombie process. */
static int pid_alive(int64_t pid)
{
    uint64_t st;
    bool zombie;
    return txi_proc_stat(pid, &st, &zombie) == 0 && !zombie;
}

/* Removes /dev/shm/wb-tx-<pid>-* segments whose pid is gone (owners killed before close). */
static void sweep_stale(void)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long long pid;
        char rest[32];
        if (sscanf(e->d_name, "wb-tx-%lld-%31s", &pid, rest) != 2 || pid <= 0)
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char name[300];
        snprintf(name, sizeof(name), "/%s", e->d_name);
        shm_unlink(name);
    }
    closedir(d);
}

static int map(const char *name, int flags, struct wb_mbox_shm **out)
{
    int fd = shm_open(name, flags, 0600);
    if (fd < 0)
        return -errno;
    int r = 0;
    if ((flags & O_CREAT) && ftruncate(fd, sizeof(struct wb_mbox_shm)) != 0)
        r = -errno;
    struct stat st;
    if (!r && fstat(fd, &st) != 0)
        r = -errno;
    if (!r && (size_t)st.st_size < sizeof(struct wb_mbox_shm))
        r = -EBADMSG;
    void *p = MAP_FAILED;
    if (!r) {
        p = mmap(NULL, sizeof(struct wb_mbox_shm), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            r = -errno;
    }
    close(fd);
    if (!r)
        *out = p;
    return r;
}

int mbox_create(struct wb_mbox *mb, uint64_t uid)
{
    memset(mb, 0, sizeof(*mb));
    sweep_stale();
    snprintf(mb->name, sizeof(mb->name), "/wb-tx-%d-%016" PRIx64, (int)getpid(), uid);
    struct wb_mbox_shm *s;
    int r = map(mb->name, O_RDWR | O_CREAT | O_EXCL, &s);
    if (r)
        return r;
    /* ftruncate zero-fills: every ring free, head == tail == 0. */
    s->owner_uid = uid;
    s->version = MBOX_VERSION;
    atomic_thread_fence(memory_order_release);
    s->magic = MBOX_MAGIC;
    mb->shm = s;
    mb->owner = true;
    mb->ring = -1;
    return 0;
}

static bool claim(struct wb_mbox_ring *rg, uint64_t expect, uint64_t me)
{
    /* Only a drained ring is handed over, so a new writer never mixes with old tags. */
    if (atomic_load_explicit(&rg->head, memory_order_acquire) !=
        atomic_load_explicit(&rg->tail, memory_order_acquire))
        return false;
    return atomic_compare_exchange_strong(&rg->owner, &expect, me);
}

int mbox_open(struct wb_mbox *mb, const char *name, uint64_t uid)
{
    memset(mb, 0, sizeof(*mb));
    mb->ring = -1;
    if (strlen(name) >= sizeof(mb->name))
        return -EINVAL;
    struct wb_mbox_shm *s;
    int r = map(name, O_RDWR, &s);
    if (r)
        return r;
    if (s->magic != MBOX_MAGIC || s->version != MBOX_VERSION) {
        munmap(s, sizeof(*s));
        return -EBADMSG;
    }
    uint64_t me = mbox_writer_id(uid);
    int got = -1;
    for (int i = 0; i < WB_MBOX_RINGS && got < 0; i++)
        if (claim(&s->ring[i], 0, me))
            got = i;
    for (int i = 0; i < WB_MBOX_RINGS && got < 0; i++) {
        uint64_t o = atomic_load(&s->ring[i].owner);
        if (o && !pid_alive((int64_t)(o >> 32)) && claim(&s->ring[i], o, me))
            got = i;
    }
    if (got < 0) {
        munmap(s, sizeof(*s));
        return -EBUSY;
    }
    snprintf(mb->name, sizeof(mb->name), "%s", name);
    mb->shm = s;
    mb->ring = got;
    return 0;
}

uint64_t mbox_writer_id(uint64_t uid)
{
    return ((uint64_t)getpid() << 32) | (uid & 0xffffffffu);
}

int mbox_push(struct wb_mbox *mb, const void *note)
{
    struct wb_mbox_ring *rg = &mb->shm->ring[mb->ring];
    uint64_t t = atomic_load_explicit(&rg->tail, memory_order_relaxed);
    uint64_t h = atomic_load_explicit(&rg->head, memory_order_acquire);
    if (t - h >= WB_MBOX_DEPTH)
        return -EAGAIN;
    memcpy(rg->notes[t & (WB_MBOX_DEPTH - 1)], note, WB_MBOX_NOTE);
    atomic_store_explicit(&rg->tail, t + 1, memory_order_release);
    return 0;
}

size_t mbox_drain(struct wb_mbox *mb, void (*fn)(void *arg, uint64_t owner, const void *note),
                  void *arg)
{
    size_t n = 0;
    for (int i = 0; i < WB_MBOX_RINGS; i++) {
        struct wb_mbox_ring *rg = &mb->shm->ring[i];
        uint64_t h = atomic_load_explicit(&rg->head, memory_order_relaxed);
        uint64_t t = atomic_load_explicit(&rg->tail, memory_order_acquire);
        if (h == t)
            continue;
        if (t - h > WB_MBOX_DEPTH) /* a corrupt ring: skip what cannot be valid */
            h = t - WB_MBOX_DEPTH;
        uint64_t owner = atomic_load_explicit(&rg->owner, memory_order_acquire);
        for (; h != t; h++, n++) {
            uint8_t note[WB_MBOX_NOTE]; /* the writer may reuse the slot once head moves */
            memcpy(note, rg->notes[h & (WB_MBOX_DEPTH - 1)], sizeof(note));
            fn(arg, owner, note);
        }
        atomic_store_explicit(&rg->head, h, memory_order_release);
    }
    return n;
}

void mbox_close(struct wb_mbox *mb)
{
    if (!mb->shm)
        return;
    if (mb->owner)
        shm_unlink(mb->name);
    else if (mb->ring >= 0)
        atomic_store(&mb->shm->ring[mb->ring].owner, 0);
    munmap(mb->shm, sizeof(*mb->shm));
    mb->shm = NULL;
}
