/* cudaipc.h — private header of the CUDA IPC backend (transport/cudaipc/).
 *
 * Data: a write is cudaMemcpyAsync from the local source into the peer's region, opened once per
 * (peer, region) with cudaIpcOpenMemHandle; between two GPUs with NVLink/P2P that is a peer copy.
 * Large writes are split into shards over `rails` streams. Completion: one event per stream used.
 *
 * Immediates: CUDA has no remote completion, so each transport owns a mailbox — a small POSIX
 * shared-memory segment (mode 0600) of per-writer rings (single producer, single consumer). A
 * writer pushes a write's note (transport/note.c: tag, attempt epoch, MAC) only after the
 * write's copy events have completed (the bytes are then in the destination GPU), and the owner
 * checks and counts the notes it drains in wb_tx_poll(): the same counter semantics as the
 * fabric backend. A ring's owner word names the writer (pid and uid), which is how the owner
 * knows which peer a note came from: a ring claimed by a process that is no peer is a
 * stranger's. Why rings per writer rather than one shared queue: a writer that dies halfway
 * through a push can only damage its own ring, never block the others. A full ring leaves the
 * note queued at the writer until the owner drains.
 *
 * What CUDA IPC cannot do: a writer maps the whole allocation a handle names and stores into it
 * itself, so neither a window nor the bounds of a tensor can be enforced at the destination;
 * the writer checks every write against the descriptor's bounds, and any process of the host
 * that holds a handle (and the rights to open it) can write. It is for GPUs of one host whose
 * processes trust each other.
 *
 * Liveness: peers announce pid and start time (wb_tx_addr); a writer checks its peers every
 * 100 ms while writes to them are in flight and fails those writes with -WB_E_PEER when the
 * process is gone. A killed owner leaves its segment in /dev/shm; the next mailbox created on
 * the host removes segments whose owner pid is dead (names carry the pid).
 *
 * Files: mbox.c (the mailbox, plain C, also built and tested without CUDA), cudaipc_cuda.c (the
 * backend), cudaipc_nocuda.c (open says "built without CUDA").
 */
#ifndef WB_TX_CUDAIPC_H
#define WB_TX_CUDAIPC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    WB_MBOX_RINGS = 64,   /* writers per mailbox */
    WB_MBOX_DEPTH = 1024, /* notes per ring, power of two */
    WB_MBOX_NOTE = 80,    /* bytes of a note (WB_TXN_WIRE) */
    WB_MBOX_NAME_MAX = 64,
};

struct wb_mbox_ring {
    /* The writer: its pid in the high half (to reclaim rings of dead writers), the low half of
     * its uid below; 0 = free. One word, so claiming is a single compare-and-swap. */
    _Atomic uint64_t owner;
    char pad0[56];
    _Atomic uint64_t tail; /* written by the writer */
    char pad1[56];
    _Atomic uint64_t head; /* written by the owner */
    char pad2[56];
    uint8_t notes[WB_MBOX_DEPTH][WB_MBOX_NOTE];
};

struct wb_mbox_shm {
    uint32_t magic, version;
    uint64_t owner_uid;
    char pad[48];
    struct wb_mbox_ring ring[WB_MBOX_RINGS];
};

/* One end of a mailbox: the owner's (created) or a writer's (opened, with its ring). */
struct wb_mbox {
    struct wb_mbox_shm *shm;
    char name[WB_MBOX_NAME_MAX];
    bool owner;
    int ring; /* writer: the claimed ring */
};

/* Creates the mailbox of transport `uid` (name "/wb-tx-<pid>-<uid>"), first removing the
 * segments of dead processes. 0, or a negative errno. */
int mbox_create(struct wb_mbox *mb, uint64_t uid);
/* Opens a peer's mailbox and claims a ring for writer `uid` of this process (reclaiming a
 * drained ring of a dead process when all are taken). -ENOENT (no such mailbox), -EBUSY (no
 * ring free), -EBADMSG. */
int mbox_open(struct wb_mbox *mb, const char *name, uint64_t uid);
/* Writer: queues one note (WB_MBOX_NOTE bytes). -EAGAIN when the ring is full. */
int mbox_push(struct wb_mbox *mb, const void *note);
/* Owner: hands every queued note of every ring to fn with the ring's owner word (the writer's
 * pid << 32 | the low half of its uid); returns how many. */
size_t mbox_drain(struct wb_mbox *mb, void (*fn)(void *arg, uint64_t owner, const void *note),
                  void *arg);
/* The owner word a writer of transport `uid` in this process claims rings with. */
uint64_t mbox_writer_id(uint64_t uid);
/* Writer: releases its ring (tags already pushed are still drained). Owner: unlinks the
 * segment. Both unmap. NULL-safe on a zeroed struct. */
void mbox_close(struct wb_mbox *mb);

#endif /* WB_TX_CUDAIPC_H */
