/* pto's simpler-compatible headers: deferred completion from inside a kernel.
 *
 * get_async_ctx(args) gives the task's slab; save_expected_notification_counter(ctx, addr, n)
 * registers "complete this task when the u32 at addr reaches n"; send_notification(addr, v, op)
 * raises a (peer's) counter. pto turns each registered entry into one of its deferred-completion
 * conditions once the kernel returns. With pto-isa on the include path the notification is its
 * TNOTIFY; without it, the same atomic operation. */
#ifndef PTO_SIMPLER_ASYNC_KERNEL_API_H
#define PTO_SIMPLER_ASYNC_KERNEL_API_H

#include <cstdint>

#include "aicore_completion_mailbox_types.h"
#include "intrinsic.h"
#include "pto_completion_token.h"

#if defined(__has_include)
#if __has_include(<pto/comm/pto_comm_inst.hpp>)
#include <pto/comm/comm_types.hpp>
#include <pto/comm/pto_comm_inst.hpp>
#define PTO_SIMPLER_HAVE_PTO_ISA_COMM 1
#endif
#endif

#ifndef __aicore__
#define __aicore__
#endif
#ifndef __gm__
#define __gm__
#endif

inline __aicore__ AsyncCtx get_async_ctx(__gm__ int64_t *args) {
    __gm__ LocalContext *lc = pto_simpler_local_context(args);
    AsyncCtx ctx = lc->async_ctx;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return ctx;
}

inline __aicore__ bool async_ctx_is_deferred(const AsyncCtx &ctx) { return ctx.task_token.is_valid(); }

/* Appends `token` to the task's slab; false when the task is not deferred or the slab is full
 * (which fails the task). */
inline __aicore__ bool register_completion_condition(AsyncCtx &ctx, const CompletionToken &token) {
    if (ctx.task_token.is_invalid() || ctx.completion_count == nullptr || ctx.completion_entries == nullptr) {
        return false;
    }
    uint32_t i = *ctx.completion_count;
    if (i >= ctx.completion_capacity) {
        if (ctx.completion_error_code != nullptr) *ctx.completion_error_code = 1;
        return false;
    }
    volatile __gm__ DeferredCompletionEntry *e = &ctx.completion_entries[i];
    e->addr = token.addr;
    e->backend_cookie = token.backend_cookie;
    e->expected_value = token.expected_value;
    e->engine = token.engine;
    e->completion_type = token.completion_type;
    e->_pad = 0;
    __atomic_thread_fence(__ATOMIC_RELEASE);
    *ctx.completion_count = i + 1;
    return true;
}

inline __aicore__ void save_expected_notification_counter(AsyncCtx &ctx, volatile __gm__ void *counter_addr,
                                                          uint32_t expected_value) {
    CompletionToken token{reinterpret_cast<uint64_t>(counter_addr), expected_value, COMPLETION_ENGINE_SDMA,
                          COMPLETION_TYPE_COUNTER, 0};
    (void)register_completion_condition(ctx, token);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

#if defined(PTO_SIMPLER_HAVE_PTO_ISA_COMM)
inline __aicore__ void send_notification(volatile __gm__ void *remote_counter_addr, int32_t value,
                                         pto::comm::NotifyOp notify_op) {
    __gm__ int32_t *counter = reinterpret_cast<__gm__ int32_t *>(const_cast<__gm__ void *>(remote_counter_addr));
    pto::comm::Signal signal(counter);
    pto::comm::TNOTIFY(signal, value, notify_op);
}
#else
/* Without pto-isa: the two notification kinds kernels use, as atomics on the counter. */
enum class PtoSimplerNotifyOp : int32_t { AtomicAdd = 0, Set = 1 };
inline __aicore__ void send_notification(volatile __gm__ void *remote_counter_addr, int32_t value,
                                         PtoSimplerNotifyOp notify_op = PtoSimplerNotifyOp::AtomicAdd) {
    int32_t *counter = reinterpret_cast<int32_t *>(const_cast<void *>(remote_counter_addr));
    if (notify_op == PtoSimplerNotifyOp::Set) {
        __atomic_store_n(counter, value, __ATOMIC_SEQ_CST);
    } else {
        __atomic_fetch_add(counter, value, __ATOMIC_SEQ_CST);
    }
}
#endif

#endif /* PTO_SIMPLER_ASYNC_KERNEL_API_H */
