/* pto's simpler-compatible headers: kinds of per-core DMA workspace (unused on pto: zero). */
#ifndef PTO_SIMPLER_DMA_WORKSPACE_H
#define PTO_SIMPLER_DMA_WORKSPACE_H

enum DmaWorkspaceKind {
    DMA_WORKSPACE_SDMA = 0,
    DMA_WORKSPACE_URMA = 1,
    DMA_WORKSPACE_KIND_COUNT = 2,
};

#endif /* PTO_SIMPLER_DMA_WORKSPACE_H */
