/* pto's simpler-compatible headers: a communication domain as a kernel sees it.
 *
 * 1056 bytes, layout pinned below. windowsIn[i] is rank i's window as mapped in the calling
 * process; a kernel reaches a peer's copy of a local address p with
 * windowsIn[peer] + (p - windowsIn[rankId]). pto fills one per chip and domain. */
#ifndef PTO_SIMPLER_COMM_CONTEXT_H
#define PTO_SIMPLER_COMM_CONTEXT_H

#include <cstddef>
#include <cstdint>

static constexpr uint32_t COMM_MAX_RANK_NUM = 64;

struct CommContext {
    uint64_t workSpace;
    uint64_t workSpaceSize;
    uint32_t rankId;
    uint32_t rankNum;
    uint64_t winSize;
    uint64_t windowsIn[COMM_MAX_RANK_NUM];
    uint64_t windowsOut[COMM_MAX_RANK_NUM];
};

static_assert(sizeof(CommContext) == 1056, "CommContext layout");
static_assert(offsetof(CommContext, workSpace) == 0, "CommContext layout");
static_assert(offsetof(CommContext, workSpaceSize) == 8, "CommContext layout");
static_assert(offsetof(CommContext, rankId) == 16, "CommContext layout");
static_assert(offsetof(CommContext, rankNum) == 20, "CommContext layout");
static_assert(offsetof(CommContext, winSize) == 24, "CommContext layout");
static_assert(offsetof(CommContext, windowsIn) == 32, "CommContext layout");
static_assert(offsetof(CommContext, windowsOut) == 544, "CommContext layout");

#endif /* PTO_SIMPLER_COMM_CONTEXT_H */
