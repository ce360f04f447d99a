// z = a + b, element by element. tensor 0: a, tensor 1: b, tensor 2: z (floats).
#include <cstdint>

#include "tensor.h"

extern "C" void kernel_entry(int64_t *args) {
    ChipTensor *a_t = reinterpret_cast<ChipTensor *>(args[0]);
    ChipTensor *b_t = reinterpret_cast<ChipTensor *>(args[1]);
    ChipTensor *z_t = reinterpret_cast<ChipTensor *>(args[2]);
    const float *a = reinterpret_cast<const float *>(a_t->buffer.addr) + a_t->start_offset;
    const float *b = reinterpret_cast<const float *>(b_t->buffer.addr) + b_t->start_offset;
    float *z = reinterpret_cast<float *>(z_t->buffer.addr) + z_t->start_offset;
    for (uint64_t i = 0; i < z_t->numel(); i++) z[i] = a[i] + b[i];
}
