// y = x * factor over the whole tensor (SPMD: each block takes its share of rows).
//   tensor 0: x (float, n), tensor 1: y (float, n), scalar 0: factor (float bits)
#include <cstdint>
#include <cstring>

#include "intrinsic.h"
#include "tensor.h"

extern "C" void kernel_entry(int64_t *args) {
    ChipTensor *x_t = reinterpret_cast<ChipTensor *>(args[0]);
    ChipTensor *y_t = reinterpret_cast<ChipTensor *>(args[1]);
    float factor;
    uint32_t bits = static_cast<uint32_t>(args[2]);
    std::memcpy(&factor, &bits, 4);
    const float *x = reinterpret_cast<const float *>(x_t->buffer.addr) + x_t->start_offset;
    float *y = reinterpret_cast<float *>(y_t->buffer.addr) + y_t->start_offset;
    uint64_t n = x_t->numel();
    int32_t b = get_block_idx(args), nb = get_block_num(args);
    uint64_t lo = n * b / nb, hi = n * (b + 1) / nb;
    for (uint64_t i = lo; i < hi; i++) y[i] = x[i] * factor;
}
