/* transport_conf_test.c — the transport conformance suite (transport_suite.h) against every
 * backend configuration of this host: fabric over tcp (1 and 2 rails), shm, tcp with the
 * bounce/staging path on host memory, tcp and shm with GPU memory (bounce path; need a GPU),
 * cudaipc (needs two GPUs). Rows that need absent hardware are skipped with the reason. */
#include "tests/func/transport_suite.h"

static void run(const struct bk *bk, enum case_id c)
{
    struct run rn = {.bk = bk, .c = c};
    run_pair(&rn);
}

/* ---------------------------------------------------------------- the table
 *
 * One row per (backend, case) so the tally counts cases; the rows are one-line calls.
 */

// clang-format off

static void tcp_sizes(void) { run(&TCP, C_SIZES); }
static void tcp_imm(void) { run(&TCP, C_IMM); }
static void tcp_zero(void) { run(&TCP, C_ZERO); }
static void tcp_bounds(void) { run(&TCP, C_BOUNDS); }
static void tcp_eagain(void) { run(&TCP, C_EAGAIN); }
static void tcp_killed(void) { run(&TCP, C_KILLED); }
static void tcp_two(void) { run(&TCP, C_TWO); }
static void tcp_view(void) { run(&TCP, C_VIEW); }
static void tcp_fence(void) { run(&TCP, C_FENCE); }
static void tcp2_sizes(void) { run(&TCP2, C_SIZES); }
static void tcp2_imm(void) { run(&TCP2, C_IMM); }
static void tcp2_zero(void) { run(&TCP2, C_ZERO); }
static void tcp2_bounds(void) { run(&TCP2, C_BOUNDS); }
static void tcp2_eagain(void) { run(&TCP2, C_EAGAIN); }
static void tcp2_killed(void) { run(&TCP2, C_KILLED); }
static void tcp2_two(void) { run(&TCP2, C_TWO); }
static void tcp2_view(void) { run(&TCP2, C_VIEW); }
static void tcp2_fence(void) { run(&TCP2, C_FENCE); }
static void shm_sizes(void) { run(&SHM, C_SIZES); }
static void shm_imm(void) { run(&SHM, C_IMM); }
static void shm_zero(void) { run(&SHM, C_ZERO); }
static void shm_bounds(void) { run(&SHM, C_BOUNDS); }
static void shm_eagain(void) { run(&SHM, C_EAGAIN); }
static void shm_killed(void) { run(&SHM, C_KILLED); }
static void shm_two(void) { run(&SHM, C_TWO); }
static void shm_view(void) { run(&SHM, C_VIEW); }
static void shm_fence(void) { run(&SHM, C_FENCE); }
static void staged_sizes(void) { run(&STAGED, C_SIZES); }
static void staged_imm(void) { run(&STAGED, C_IMM); }
static void staged_zero(void) { run(&STAGED, C_ZERO); }
static void staged_bounds(void) { run(&STAGED, C_BOUNDS); }
static void staged_eagain(void) { run(&STAGED, C_EAGAIN); }
static void staged_killed(void) { run(&STAGED, C_KILLED); }
static void staged_two(void) { run(&STAGED, C_TWO); }
static void staged_view(void) { run(&STAGED, C_VIEW); }
static void tcpgpu_sizes(void) { run(&TCP_GPU, C_SIZES); }
static void tcpgpu_imm(void) { run(&TCP_GPU, C_IMM); }
static void tcpgpu_zero(void) { run(&TCP_GPU, C_ZERO); }
static void tcpgpu_bounds(void) { run(&TCP_GPU, C_BOUNDS); }
static void tcpgpu_eagain(void) { run(&TCP_GPU, C_EAGAIN); }
static void tcpgpu_killed(void) { run(&TCP_GPU, C_KILLED); }
static void tcpgpu_two(void) { run(&TCP_GPU, C_TWO); }
static void tcpgpu_view(void) { run(&TCP_GPU, C_VIEW); }
static void shmgpu_sizes(void) { run(&SHM_GPU, C_SIZES); }
static void shmgpu_imm(void) { run(&SHM_GPU, C_IMM); }
static void shmgpu_zero(void) { run(&SHM_GPU, C_ZERO); }
static void shmgpu_bounds(void) { run(&SHM_GPU, C_BOUNDS); }
static void shmgpu_eagain(void) { run(&SHM_GPU, C_EAGAIN); }
static void shmgpu_killed(void) { run(&SHM_GPU, C_KILLED); }
static void shmgpu_two(void) { run(&SHM_GPU, C_TWO); }
static void shmgpu_view(void) { run(&SHM_GPU, C_VIEW); }
static void ipc_sizes(void) { run(&IPC, C_SIZES); }
static void ipc_imm(void) { run(&IPC, C_IMM); }
static void ipc_zero(void) { run(&IPC, C_ZERO); }
static void ipc_bounds(void) { run(&IPC, C_BOUNDS); }
static void ipc_eagain(void) { run(&IPC, C_EAGAIN); }
static void ipc_killed(void) { run(&IPC, C_KILLED); }
static void ipc_two(void) { run(&IPC, C_TWO); }
static void ipc_view(void) { run(&IPC, C_VIEW); }
static void ipc_fence(void) { run(&IPC, C_FENCE); }
// clang-format on

const struct wb_test wb_tests[] = {
    {"tcp_sizes", tcp_sizes, 180},
    {"tcp_imm", tcp_imm, 180},
    {"tcp_zero", tcp_zero, 180},
    {"tcp_bounds", tcp_bounds, 180},
    {"tcp_eagain", tcp_eagain, 180},
    {"tcp_killed", tcp_killed, 180},
    {"tcp_two", tcp_two, 180},
    {"tcp_view", tcp_view, 180},
    {"tcp_fence", tcp_fence, 180},
    {"tcp2_sizes", tcp2_sizes, 180},
    {"tcp2_imm", tcp2_imm, 180},
    {"tcp2_zero", tcp2_zero, 180},
    {"tcp2_bounds", tcp2_bounds, 180},
    {"tcp2_eagain", tcp2_eagain, 180},
    {"tcp2_killed", tcp2_killed, 180},
    {"tcp2_two", tcp2_two, 180},
    {"tcp2_view", tcp2_view, 180},
    {"tcp2_fence", tcp2_fence, 180},
    {"shm_sizes", shm_sizes, 180},
    {"shm_imm", shm_imm, 180},
    {"shm_zero", shm_zero, 180},
    {"shm_bounds", shm_bounds, 180},
    {"shm_eagain", shm_eagain, 180},
    {"shm_killed", shm_killed, 180},
    {"shm_two", shm_two, 180},
    {"shm_view", shm_view, 180},
    {"shm_fence", shm_fence, 180},
    {"staged_sizes", staged_sizes, 180},
    {"staged_imm", staged_imm, 180},
    {"staged_zero", staged_zero, 180},
    {"staged_bounds", staged_bounds, 180},
    {"staged_eagain", staged_eagain, 180},
    {"staged_killed", staged_killed, 180},
    {"staged_two", staged_two, 180},
    {"staged_view", staged_view, 180},
    {"tcpgpu_sizes", tcpgpu_sizes, 180},
    {"tcpgpu_imm", tcpgpu_imm, 180},
    {"tcpgpu_zero", tcpgpu_zero, 180},
    {"tcpgpu_bounds", tcpgpu_bounds, 180},
    {"tcpgpu_eagain", tcpgpu_eagain, 180},
    {"tcpgpu_killed", tcpgpu_killed, 180},
    {"tcpgpu_two", tcpgpu_two, 180},
    {"tcpgpu_view", tcpgpu_view, 180},
    {"shmgpu_sizes", shmgpu_sizes, 180},
    {"shmgpu_imm", shmgpu_imm, 180},
    {"shmgpu_zero", shmgpu_zero, 180},
    {"shmgpu_bounds", shmgpu_bounds, 180},
    {"shmgpu_eagain", shmgpu_eagain, 180},
    {"shmgpu_killed", shmgpu_killed, 180},
    {"shmgpu_two", shmgpu_two, 180},
    {"shmgpu_view", shmgpu_view, 180},
    {"ipc_sizes", ipc_sizes, 180},
    {"ipc_imm", ipc_imm, 180},
    {"ipc_zero", ipc_zero, 180},
    {"ipc_bounds", ipc_bounds, 180},
    {"ipc_eagain", ipc_eagain, 180},
    {"ipc_killed", ipc_killed, 180},
    {"ipc_two", ipc_two, 180},
    {"ipc_view", ipc_view, 180},
    {"ipc_fence", ipc_fence, 180},
    {0},
};
