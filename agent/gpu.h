/* gpu.h — private to agent/: the CUDA helpers the executor uses (gpu.cu; gpu_nocuda.c in
 * builds without CUDA): a stream, events polled from the CPU loop, asynchronous copies, the
 * partial-amax merge kernel and pinned host memory. Plain C declarations, also read by nvcc. */
#ifndef WB_AGENT_GPU_H
#define WB_AGENT_GPU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* All return 0, -WB_E_NOGPU (no CUDA in this build) or -WB_E_CUDA. */
int ag_gpu_use(int device);
int ag_stream_create(void **out);
void ag_stream_destroy(void *s);
/* Records an event on the stream; *out is a new event (destroy it when done). */
int ag_event_record(void *stream, void **out);
/* 1 when the event completed, 0 when not yet, negative on a CUDA error. */
int ag_event_done(void *ev);
void ag_event_destroy(void *ev);
/* Orders streams: work enqueued on `to` from now on starts after everything enqueued on `from`
 * so far (an event in between; the CPU does not wait). */
int ag_stream_order(void *from, void *to);
/* Waits until everything enqueued on the stream so far is done. */
int ag_stream_sync(void *stream);
/* Asynchronous copy between any memory kinds on the stream. */
int ag_copy_async(void *dst, const void *src, size_t n, void *stream);
int ag_memset_async(void *dst, int v, size_t n, void *stream);
/* acc[i] = max(acc[i], part[i]) (NaN wins) on device memory, on the stream. */
int ag_amax_merge_async(float *acc, const float *part, size_t n, void *stream);
/* For every element of `in` (a box inside both a's and b's index spaces), on the stream:
 * b_arr[its row-major index in b] = a_arr[its index in a] (merge 0), or the max of the two
 * (merge 1, NaN wins). Device (or device-accessible) memory: the amax steps' block arrays. */
struct wb_box;
int ag_box_move_async(float *b_arr, const struct wb_box *b, const float *a_arr,
                      const struct wb_box *a, const struct wb_box *in, int merge, void *stream);
/* A transpose on the stream (the PERMUTE op; wb_permute() is the host's): dst, a packed
 * array of extent ext[perm_k] along dim k, gets src (packed, extents ext[0..ndim)) with
 * dst element i = src element j, j[perm_k] = i_k, where perm_k = (perm >> 4k) & 15.
 * elem: 1, 2, 4 or 8 bytes. Device memory. */
int ag_permute_async(void *dst, const void *src, size_t elem, uint32_t ndim, const uint64_t *ext,
                     uint32_t perm, void *stream);
/* The allocation (cudaMalloc'd block) device pointer p lies in: its base and size, from the
 * driver's cuMemGetAddressRange (reached through the runtime, so nothing links libcuda). */
int ag_gpu_addr_range(const void *p, uintptr_t *base, uint64_t *size);
/* Pinned host memory (plain malloc'd memory in builds without CUDA). */
int ag_host_alloc(size_t n, void **out);
void ag_host_free(void *p);

#ifdef __cplusplus
}
#endif

#endif /* WB_AGENT_GPU_H */
