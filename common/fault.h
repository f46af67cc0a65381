/* fault.h — fault injection for the unwind paths (make fault: -DWB_FAULT, build/fault).
 *
 * In the fault build every allocation our code makes (malloc and friends, wrapped at link time
 * with -Wl,--wrap), every data-plane post to a provider and every CUDA runtime call through our
 * wrappers is a numbered point of its kind; WB_FAULT=alloc:N|post:N|cuda:N fails the Nth one of
 * the process (counting from 1) and only it, the way the real call fails. WB_FAULT_COUNT=FILE
 * appends "alloc=<n> post=<n> cuda=<n> fired=<0|1>" to FILE at exit, so a script learns how
 * many points a run passes (tests/sh/fault_test.sh). In every other build the hooks are
 * constant false and compile to nothing. */
#ifndef WB_FAULT_H
#define WB_FAULT_H

#include <stdbool.h>

enum wb_fault_kind { WB_FAULT_ALLOC, WB_FAULT_POST, WB_FAULT_CUDA, WB_FAULT_NKINDS };

#ifdef WB_FAULT
#ifdef __cplusplus
extern "C"
#endif
    bool
    wb_fault_hit(enum wb_fault_kind kind);
#define WB_FAULT_HIT(kind) wb_fault_hit(kind)
/* A CUDA runtime call through our wrappers: the Nth fails as cudaErrorUnknown, not called. */
#define WB_CUDA(call) (wb_fault_hit(WB_FAULT_CUDA) ? cudaErrorUnknown : (call))
#else
#define WB_FAULT_HIT(kind) false
#define WB_CUDA(call)      (call)
#endif

#endif
