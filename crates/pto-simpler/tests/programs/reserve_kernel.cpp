// Checks simpler's per-chip task order in plain C++ over the kernel ABI. One int32 output and
// three scalars: the operation, this chip's state words (a window buffer), its CommContext.
//   0 FIRST:   in a group on chips {0,1}; chip 1 waits until chip 0's single task releases it
//   1 RELEASE: a single task on chip 0; raises chip 1's state[0]
//   2 SECOND:  in a group on chips {1,2}; chip 2 sets its state[1]
//   3 CHECK:   a single task on chip 2, submitted after the second group: reads state[1]
// Each task writes a marker (10 + rank, 20, 30 + rank, or 1 if CHECK saw the group's write).
#include <cstdint>

#include "platform_comm/comm_context.h"
#include "tensor.h"
#include "wait.h"

extern "C" void kernel_entry(int64_t *args) {
    ChipTensor *out_t = reinterpret_cast<ChipTensor *>(args[0]);
    int op = static_cast<int>(args[1]);
    int32_t *state = reinterpret_cast<int32_t *>(args[2]);
    CommContext *ctx = reinterpret_cast<CommContext *>(args[3]);
    int32_t *out = reinterpret_cast<int32_t *>(out_t->buffer.addr) + out_t->start_offset;
    int rank = static_cast<int>(ctx->rankId);
    int32_t marker = -1;
    switch (op) {
    case 0:
        if (rank == 1) test_wait_ge(state, 1);
        marker = 10 + rank;
        break;
    case 1: {
        uint64_t off = reinterpret_cast<uint64_t>(state) - ctx->windowsIn[rank];
        __atomic_fetch_add(reinterpret_cast<int32_t *>(ctx->windowsIn[1] + off), 1, __ATOMIC_SEQ_CST);
        marker = 20;
        break;
    }
    case 2:
        if (rank == 2) __atomic_store_n(state + 1, 1, __ATOMIC_SEQ_CST);
        marker = 30 + rank;
        break;
    case 3:
        marker = __atomic_load_n(state + 1, __ATOMIC_SEQ_CST) >= 1 ? 1 : 0;
        break;
    }
    *out = marker;
}
