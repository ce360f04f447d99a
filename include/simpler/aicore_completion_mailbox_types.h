/* pto's simpler-compatible headers: the deferred-completion slab a kernel appends to.
 *
 * A kernel of a deferred task appends {addr, cookie, expected, engine, type} entries; after the
 * kernel returns, pto completes the task only when every counter at `addr` (a u32) holds at
 * least `expected`, and fails it with `error_code` if that is set. */
#ifndef PTO_SIMPLER_COMPLETION_MAILBOX_TYPES_H
#define PTO_SIMPLER_COMPLETION_MAILBOX_TYPES_H

#include <cstdint>

#include "pto_constants.h"

inline constexpr int32_t MAX_COMPLETIONS_PER_TASK = 64;

#define COMPLETION_ENGINE_SDMA 0u
#define COMPLETION_ENGINE_ROCE 1u
#define COMPLETION_ENGINE_URMA 2u
#define COMPLETION_ENGINE_CCU 3u

#define COMPLETION_TYPE_COUNTER 0
#define COMPLETION_TYPE_SDMA_EVENT_RECORD 1

struct DeferredCompletionEntry {
    uint64_t addr;
    uint64_t backend_cookie;
    uint32_t expected_value;
    uint32_t engine;
    int32_t completion_type;
    uint32_t _pad;
};
static_assert(sizeof(DeferredCompletionEntry) == 32, "DeferredCompletionEntry layout");

struct alignas(PTO2_ALIGN_SIZE) DeferredCompletionSlab {
    volatile uint32_t count;
    volatile int32_t error_code;
    DeferredCompletionEntry entries[MAX_COMPLETIONS_PER_TASK];
};
static_assert(sizeof(DeferredCompletionSlab) % PTO2_ALIGN_SIZE == 0, "slab size keeps cache lines apart");

#endif /* PTO_SIMPLER_COMPLETION_MAILBOX_TYPES_H */
