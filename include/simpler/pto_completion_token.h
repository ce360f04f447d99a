/* pto's simpler-compatible headers: a completion condition a kernel registers. */
#ifndef PTO_SIMPLER_COMPLETION_TOKEN_H
#define PTO_SIMPLER_COMPLETION_TOKEN_H

#include <cstdint>

#include "aicore_completion_mailbox_types.h"

struct CompletionToken {
    uint64_t addr;
    uint32_t expected_value;
    uint32_t engine;
    int32_t completion_type;
    uint64_t backend_cookie;
};

enum class CompletionPollState : uint8_t {
    PENDING = 0,
    READY = 1,
    FAILED = 2,
};

#endif /* PTO_SIMPLER_COMPLETION_TOKEN_H */
