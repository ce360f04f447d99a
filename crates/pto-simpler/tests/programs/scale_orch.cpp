// One callable, one task: y = 2 x on an AIC core (tensor 0: x, tensor 1: y). The first stage
// of the two-callable chain.
#include "pto_orchestration_api.h"

extern "C" {
__attribute__((visibility("default"))) PTO2OrchestrationConfig scale_config(const ChipTaskArgs &) {
    return PTO2OrchestrationConfig{2};
}

__attribute__((visibility("default"))) void scale_entry(const ChipTaskArgs &a) {
    CoreTaskArgs p;
    p.add_input(a.tensor(0).ref());
    p.add_output(a.tensor(1).ref());
    p.add_scalar(2.0f);
    rt_submit_aic_task(0, p);
}
}
