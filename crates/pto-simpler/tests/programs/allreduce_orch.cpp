// The allreduce's orchestration: one AIV task over the three tensors and two scalars.
#include "pto_orchestration_api.h"

extern "C" {

__attribute__((visibility("default"))) PTO2OrchestrationConfig allreduce_config(const ChipTaskArgs &) {
    return PTO2OrchestrationConfig{5};
}

__attribute__((visibility("default"))) void allreduce_entry(const ChipTaskArgs &a) {
    const ChipTensor &in = a.tensor(0).ref();
    const ChipTensor &out = a.tensor(1).ref();
    const ChipTensor &scratch = a.tensor(2).ref();
    CoreTaskArgs p;
    p.add_input(in);
    p.add_output(out);
    p.add_inout(scratch);
    p.add_scalar(a.scalar(0));
    p.add_scalar(a.scalar(1));
    rt_submit_aiv_task(0, p);
}
}
