// Deferred completion through the slab: this rank raises counter[me] on its peer and registers
// "complete when my own counter[peer] reaches 1". The task runs, returns at once, and completes
// only when the peer's notification has arrived.
//   tensor 0: the domain's counters (int32 x 64), tensor 1: the token (unused), scalar 0: the
//   CommContext address
#include <cstdint>

#include "platform_comm/comm_context.h"
#include "pto_async_kernel_api.h"
#include "tensor.h"

extern "C" void kernel_entry(int64_t *args) {
    ChipTensor *c_t = reinterpret_cast<ChipTensor *>(args[0]);
    CommContext *ctx = reinterpret_cast<CommContext *>(args[2]);
    int32_t *counters = reinterpret_cast<int32_t *>(c_t->buffer.addr) + c_t->start_offset;
    int me = static_cast<int>(ctx->rankId);
    int peer = (me + 1) % static_cast<int>(ctx->rankNum);
    uint64_t off = reinterpret_cast<uint64_t>(counters + me) - ctx->windowsIn[me];
    send_notification(reinterpret_cast<void *>(ctx->windowsIn[peer] + off), 1);
    AsyncCtx a = get_async_ctx(args);
    save_expected_notification_counter(a, counters + peer, 1);
}
