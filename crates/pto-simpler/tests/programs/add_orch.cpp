// One task: z = a + b on an AIV core (tensor 0: a, tensor 1: b, tensor 2: z). The second
// stage of the two-callable chain.
#include "pto_orchestration_api.h"

extern "C" {
__attribute__((visibility("default"))) void add_entry(const ChipTaskArgs &a) {
    CoreTaskArgs p;
    p.add_input(a.tensor(0).ref(), a.tensor(1).ref());
    p.add_output(a.tensor(2).ref());
    rt_submit_aiv_task(0, p);
}
}
