/* pto's simpler-compatible headers: an output the runtime allocates.
 *
 * 64 bytes laid out like the first cache line of a ChipTensor, so that the runtime can turn it
 * into the task's output descriptor; an optional initial value fills the new tensor. */
#ifndef PTO_SIMPLER_TENSOR_CREATE_INFO_H
#define PTO_SIMPLER_TENSOR_CREATE_INFO_H

#include <cstddef>
#include <cstdint>

#include "data_type.h"
#include "pto_simpler_check.h"
#include "tensor.h"

class alignas(64) TensorCreateInfo {
public:
    TensorCreateInfo() = default;

    TensorCreateInfo(const uint32_t shapes_in[], uint32_t ndims_in, DataType dtype_in = DataType::FLOAT32,
                     bool manual_dep_in = false)
        : initial_value(0), has_initial_value(false), reserved1_{}, reserved2_(0), start_offset(0), version(0),
          ndims(ndims_in), dtype(dtype_in), manual_dep(manual_dep_in), is_contiguous(true), reserved3_(0), shapes{} {
        PTO_SIMPLER_CHECK(ndims_in > 0 && ndims_in <= static_cast<uint32_t>(MAX_TENSOR_DIMS));
        for (uint32_t i = 0; i < ndims_in; i++) shapes[i] = shapes_in[i];
    }

    void copy(const TensorCreateInfo &other) { *this = other; }

    /* Every element of the new tensor starts as `value` (its bits, zero-extended). */
    template <typename T = uint64_t>
    void set_initial_value(T value) {
        has_initial_value = true;
        initial_value = to_u64(value);
    }

    uint64_t buffer_size_bytes() const {
        uint64_t n = 1;
        for (uint32_t i = 0; i < ndims; i++) n *= shapes[i];
        return n * get_element_size(dtype);
    }

    uint64_t initial_value;
    bool has_initial_value;
    uint8_t reserved1_[7];
    uint64_t reserved2_;
    uint64_t start_offset; /* always 0 */
    int32_t version;       /* always 0 */
    uint32_t ndims;
    DataType dtype;
    bool manual_dep;
    bool is_contiguous; /* always true */
    uint8_t reserved3_;
    uint32_t shapes[MAX_TENSOR_DIMS];
};

static_assert(sizeof(TensorCreateInfo) == 64, "TensorCreateInfo is one cache line");
static_assert(offsetof(TensorCreateInfo, start_offset) == offsetof(ChipTensor, start_offset), "layout");
static_assert(offsetof(TensorCreateInfo, version) == offsetof(ChipTensor, version), "layout");
static_assert(offsetof(TensorCreateInfo, ndims) == offsetof(ChipTensor, ndims), "layout");
static_assert(offsetof(TensorCreateInfo, dtype) == offsetof(ChipTensor, dtype), "layout");
static_assert(offsetof(TensorCreateInfo, manual_dep) == offsetof(ChipTensor, manual_dep), "layout");
static_assert(offsetof(TensorCreateInfo, is_contiguous) == offsetof(ChipTensor, is_contiguous), "layout");
static_assert(offsetof(TensorCreateInfo, shapes) == offsetof(ChipTensor, shapes), "layout");

#endif /* PTO_SIMPLER_TENSOR_CREATE_INFO_H */
