// The deferred-completion program: a notify task (deferred through the slab) whose token output
// the consumer reads (read-after-write on a runtime output), so the consumer runs only once the
// peer's notification arrived. tensor 0: in, tensor 1: out, tensor 2: the counters (window);
// scalars: rank, CommContext address.
#include "pto_orchestration_api.h"

extern "C" {
__attribute__((visibility("default"))) PTO2OrchestrationConfig deferred_config(const ChipTaskArgs &) {
    return PTO2OrchestrationConfig{5};
}

__attribute__((visibility("default"))) void deferred_entry(const ChipTaskArgs &a) {
    uint32_t one[1] = {1};
    TensorCreateInfo token(one, 1, DataType::INT32);
    CoreTaskArgs n;
    n.add_inout(a.tensor(2).ref());
    n.add_output(token);
    n.add_scalar(a.scalar(1));
    TaskOutputTensors t = rt_submit_aiv_task(0, n);
    CoreTaskArgs c;
    c.add_input(a.tensor(0).ref(), t.get_ref(0));
    c.add_output(a.tensor(1).ref());
    c.add_scalar(a.scalar(0));
    rt_submit_aiv_task(1, c);
}
}
