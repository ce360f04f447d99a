/* pto's simpler-compatible headers: what a submit names besides its arguments. */
#ifndef PTO_SIMPLER_SUBMIT_TYPES_H
#define PTO_SIMPLER_SUBMIT_TYPES_H

#include <cstdint>

#include "tensor.h"

inline constexpr int32_t INVALID_KERNEL_ID = -1;

/* Subtask bits of a task's active mask. */
inline constexpr uint8_t PTO2_SUBTASK_MASK_AIC = 1u << 0;
inline constexpr uint8_t PTO2_SUBTASK_MASK_AIV0 = 1u << 1;
inline constexpr uint8_t PTO2_SUBTASK_MASK_AIV1 = 1u << 2;

/* Up to three kernels of one task: an AIC kernel and two AIV kernels (func ids; -1 unused). */
struct MixedKernels {
    int32_t aic_kernel_id{INVALID_KERNEL_ID};
    int32_t aiv0_kernel_id{INVALID_KERNEL_ID};
    int32_t aiv1_kernel_id{INVALID_KERNEL_ID};

    uint8_t active_mask() const {
        uint8_t m = 0;
        if (aic_kernel_id != INVALID_KERNEL_ID) m |= PTO2_SUBTASK_MASK_AIC;
        if (aiv0_kernel_id != INVALID_KERNEL_ID) m |= PTO2_SUBTASK_MASK_AIV0;
        if (aiv1_kernel_id != INVALID_KERNEL_ID) m |= PTO2_SUBTASK_MASK_AIV1;
        return m;
    }
};

/* SPMD launch parameters: how many logical blocks one task runs as. */
class PTO2LaunchSpec {
public:
    constexpr PTO2LaunchSpec() = default;
    int16_t block_num() const { return block_num_; }
    void set_block_num(int16_t n) { block_num_ = n; }
    bool require_sync_start() const { return require_sync_start_; }
    void set_require_sync_start(bool v) { require_sync_start_ = v; }

private:
    int16_t block_num_{1};
    bool require_sync_start_{false};
};

/* A dispatch predicate: run the task only if tensor[indices] OP target. */
enum class PredicateOp : uint8_t { NONE = 0, EQ, NE, GT, LT, GE, LE };

#endif /* PTO_SIMPLER_SUBMIT_TYPES_H */
