// A pipeline of runtime-allocated outputs, scopes and explicit dependencies:
//   t1 = 3 x           (SPMD over 4 blocks, an output the runtime allocates)
//   in a scope: t2 = t1 + x ; t3 = 0.5 t2 (outputs of the inner scope)
//   out = t3 + t1      (out: tensor 1, OUTPUT_EXISTING)
//   a dummy task after everything, with an explicit dependency on the last task.
//   alloc_tensors gives a zero-filled scratch tensor that nothing reads (outputs only).
// tensor 0: x (float, n), tensor 1: out (float, n). Expected: out = 0.5 (3x + x) + 3x = 5x.
#include "pto_orchestration_api.h"

extern "C" {
__attribute__((visibility("default"))) PTO2OrchestrationConfig pipeline_config(const ChipTaskArgs &) {
    return PTO2OrchestrationConfig{2};
}

__attribute__((visibility("default"))) void pipeline_entry(const ChipTaskArgs &a) {
    const ChipTensor &x = a.tensor(0).ref();
    const ChipTensor &out = a.tensor(1).ref();
    uint32_t shape[1] = {x.shapes[0]};
    TensorCreateInfo ci(shape, 1, DataType::FLOAT32);
    TensorCreateInfo zero(shape, 1, DataType::FLOAT32);
    zero.set_initial_value(0.0f);
    TaskOutputTensors scratch = alloc_tensors(zero);
    if (scratch.size() != 1) rt_report_fatal(PTO2_ERROR_INVALID_ARGS, "alloc_tensors gave %u", scratch.size());

    CoreTaskArgs p1;
    p1.add_input(x);
    p1.add_output(ci);
    p1.add_scalar(3.0f);
    p1.launch_spec.set_block_num(4);
    TaskOutputTensors o1 = rt_submit_aiv_task(0, p1);
    const ChipTensor &t1 = o1.get_ref(0);

    PTO2TaskId last = PTO2TaskId::invalid();
    PTO2_SCOPE() {
        CoreTaskArgs p2;
        p2.add_input(t1, x);
        p2.add_output(ci);
        TaskOutputTensors o2 = rt_submit_aiv_task(1, p2);
        const ChipTensor &t2 = o2.get_ref(0);
        CoreTaskArgs p3;
        p3.add_input(t2);
        p3.add_output(ci);
        p3.add_scalar(0.5f);
        TaskOutputTensors o3 = rt_submit_aiv_task(0, p3);
        const ChipTensor &t3 = o3.get_ref(0);
        CoreTaskArgs p4;
        p4.add_input(t3, t1);
        p4.add_output(out);
        last = rt_submit_aiv_task(1, p4).task_id();
    }
    CoreTaskArgsWithDeps<2> d;
    d.add_dep(last);
    rt_submit_dummy_task(d.args());
}
}
