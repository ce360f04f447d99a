/* pto's simpler-compatible headers: what a kernel finds beyond its arguments.
 *
 * kernel_entry(int64_t *args) receives the task's tensor descriptors (args[0..T), pointers to
 * ChipTensor), its scalars (args[T..T+S)), the LocalContext at args[48] and the GlobalContext at
 * args[49]. The accessors below read them. */
#ifndef PTO_SIMPLER_INTRINSIC_H
#define PTO_SIMPLER_INTRINSIC_H

#include <cstdint>

#include "aicore_completion_mailbox_types.h"
#include "common/dma_workspace.h"
#include "pto_task_id.h"

#ifndef __gm__
#define __gm__
#endif
#ifndef __aicore__
#define __aicore__
#endif

static constexpr int32_t PTO2_EXT_PARAMS_COUNT = 2;
static constexpr int32_t SPMD_LOCAL_CONTEXT_INDEX = 48;
static constexpr int32_t SPMD_GLOBAL_CONTEXT_INDEX = 49;
static constexpr int32_t PAYLOAD_LOCAL_CONTEXT_INDEX = SPMD_LOCAL_CONTEXT_INDEX;
static constexpr int32_t PAYLOAD_GLOBAL_CONTEXT_INDEX = SPMD_GLOBAL_CONTEXT_INDEX;

struct GlobalContext {
    int32_t sub_block_id;
    uint64_t dma_workspace[DMA_WORKSPACE_KIND_COUNT];
};

/* Where a deferred task's kernel appends its completion conditions. task_token is invalid when
 * the task is not deferred. */
struct AsyncCtx {
    volatile __gm__ uint32_t *completion_count;
    volatile __gm__ int32_t *completion_error_code;
    volatile __gm__ DeferredCompletionEntry *completion_entries;
    uint32_t completion_capacity;
    PTO2TaskId task_token;

    static inline AsyncCtx make(PTO2TaskId task_token, volatile __gm__ DeferredCompletionSlab *slab) {
        AsyncCtx ctx{};
        ctx.task_token = task_token;
        if (slab == nullptr) {
            ctx.task_token = PTO2TaskId::invalid();
            return ctx;
        }
        ctx.completion_count = &slab->count;
        ctx.completion_error_code = &slab->error_code;
        ctx.completion_entries = &slab->entries[0];
        ctx.completion_capacity = MAX_COMPLETIONS_PER_TASK;
        return ctx;
    }
};

struct LocalContext {
    int32_t block_idx; /* this block, in [0, block_num) */
    int32_t block_num; /* the task's SPMD width */
    AsyncCtx async_ctx;
};

static __aicore__ inline __gm__ LocalContext *pto_simpler_local_context(__gm__ int64_t *args) {
    return reinterpret_cast<__gm__ LocalContext *>(static_cast<uint64_t>(args[SPMD_LOCAL_CONTEXT_INDEX]));
}

static __aicore__ inline __gm__ GlobalContext *pto_simpler_global_context(__gm__ int64_t *args) {
    return reinterpret_cast<__gm__ GlobalContext *>(static_cast<uint64_t>(args[SPMD_GLOBAL_CONTEXT_INDEX]));
}

static __aicore__ inline int32_t get_block_idx(__gm__ int64_t *args) {
    return pto_simpler_local_context(args)->block_idx;
}

static __aicore__ inline int32_t get_block_num(__gm__ int64_t *args) {
    return pto_simpler_local_context(args)->block_num;
}

static __aicore__ inline int32_t get_sub_block_id(__gm__ int64_t *args) {
    return pto_simpler_global_context(args)->sub_block_id;
}

static __aicore__ inline __gm__ uint8_t *get_dma_workspace(__gm__ int64_t *args, int kind) {
    if (kind < 0 || kind >= DMA_WORKSPACE_KIND_COUNT) return nullptr;
    return reinterpret_cast<__gm__ uint8_t *>(pto_simpler_global_context(args)->dma_workspace[kind]);
}

#endif /* PTO_SIMPLER_INTRINSIC_H */
