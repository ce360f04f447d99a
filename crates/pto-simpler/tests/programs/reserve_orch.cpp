// reserve_kernel's orchestration: one AIV task over the output and the three scalars.
#include "pto_orchestration_api.h"

extern "C" {
__attribute__((visibility("default"))) PTO2OrchestrationConfig reserve_config(const ChipTaskArgs &) {
    return PTO2OrchestrationConfig{4};
}

__attribute__((visibility("default"))) void reserve_entry(const ChipTaskArgs &a) {
    CoreTaskArgs p;
    p.add_output(a.tensor(0).ref());
    p.add_scalar(a.scalar(0));
    p.add_scalar(a.scalar(1));
    p.add_scalar(a.scalar(2));
    rt_submit_aiv_task(0, p);
}
}
