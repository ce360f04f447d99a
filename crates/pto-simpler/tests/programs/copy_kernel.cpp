// out[i] = in[i] + rank + 1 (the consumer of the deferred test: it runs only after the deferred
// task completed). tensor 0: in (float), tensor 1: the token, tensor 2: out (float), scalar 0:
// rank
#include <cstdint>

#include "tensor.h"

extern "C" void kernel_entry(int64_t *args) {
    ChipTensor *i_t = reinterpret_cast<ChipTensor *>(args[0]);
    ChipTensor *o_t = reinterpret_cast<ChipTensor *>(args[2]);
    const float *in = reinterpret_cast<const float *>(i_t->buffer.addr) + i_t->start_offset;
    float *out = reinterpret_cast<float *>(o_t->buffer.addr) + o_t->start_offset;
    for (uint64_t i = 0; i < o_t->numel(); i++) out[i] = in[i] + static_cast<float>(args[3]) + 1.0f;
}
