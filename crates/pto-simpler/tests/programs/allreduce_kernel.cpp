// An allreduce kernel in the style of simpler's L3 examples, in plain C++ over the kernel ABI:
// stage the input into this rank's scratch (a window buffer), raise signal[my_rank] on every
// peer, wait for every peer's signal here, then sum every rank's scratch into the output.
//   tensor 0: input (n floats), tensor 1: output, tensor 2: scratch (n floats + 64 int32 signals)
//   scalar 0: nranks, scalar 1: the CommContext address
#include <cstdint>

#include "platform_comm/comm_context.h"
#include "tensor.h"
#include "wait.h"

template <typename T>
static T *peer(CommContext *ctx, T *local, int pe) {
    uint64_t off = reinterpret_cast<uint64_t>(local) - ctx->windowsIn[ctx->rankId];
    return reinterpret_cast<T *>(ctx->windowsIn[pe] + off);
}

extern "C" void kernel_entry(int64_t *args) {
    ChipTensor *in_t = reinterpret_cast<ChipTensor *>(args[0]);
    ChipTensor *out_t = reinterpret_cast<ChipTensor *>(args[1]);
    ChipTensor *scratch_t = reinterpret_cast<ChipTensor *>(args[2]);
    int nranks = static_cast<int>(args[3]);
    CommContext *ctx = reinterpret_cast<CommContext *>(args[4]);
    uint32_t n = in_t->shapes[0];
    float *in = reinterpret_cast<float *>(in_t->buffer.addr) + in_t->start_offset;
    float *out = reinterpret_cast<float *>(out_t->buffer.addr) + out_t->start_offset;
    float *scratch = reinterpret_cast<float *>(scratch_t->buffer.addr) + scratch_t->start_offset;
    int32_t *signals = reinterpret_cast<int32_t *>(scratch + n);
    int me = static_cast<int>(ctx->rankId);
    for (uint32_t i = 0; i < n; i++) scratch[i] = in[i];
    for (int pe = 0; pe < nranks; pe++) {
        if (pe != me) __atomic_fetch_add(peer(ctx, signals + me, pe), 1, __ATOMIC_SEQ_CST);
    }
    for (int pe = 0; pe < nranks; pe++) {
        if (pe != me) test_wait_ge(signals + pe, 1);
    }
    for (uint32_t i = 0; i < n; i++) {
        float acc = 0;
        for (int pe = 0; pe < nranks; pe++) acc += peer(ctx, scratch, pe)[i];
        out[i] = acc;
    }
}
