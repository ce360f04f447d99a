/* pto's simpler-compatible headers: a kernel's "wait for my stores" helper.
 *
 * On pto a kernel's stores are plain CPU stores, so this is a full memory fence (and, where
 * pto-isa's flag primitives are in scope, the same flag pair a device kernel would use). */
#ifndef PTO_SIMPLER_PIPE_SYNC_H
#define PTO_SIMPLER_PIPE_SYNC_H

#ifndef __aicore__
#define __aicore__
#endif

static __aicore__ inline void pipe_sync() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

#endif /* PTO_SIMPLER_PIPE_SYNC_H */
