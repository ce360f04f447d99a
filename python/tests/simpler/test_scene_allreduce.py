"""A scene test in simpler's style, run by `python -m pto.simpler pytest` (pto's plugin in place
of simpler's root conftest): the allreduce of the test programs on 2 chips, tensors rehosted into
create_buffer memory, compared with the golden by the framework."""

import os

import torch

from simpler.task_interface import ArgDirection as D
from simpler.task_interface import CommBufferSpec, TaskArgs, TensorArgType
from simpler_setup import SceneTestCase, TaskArgsBuilder, scene_test
from simpler_setup import Scalar, TensorArg
from simpler_setup.scene_test import _rehosted_ref_for

PROGRAMS = os.environ["PTO_TEST_PROGRAMS"]
COUNT = 256


def orch_fn(orch, callables, task_args, config):
    n = int(task_args.nranks.value)
    with orch.allocate_domain(name="default", workers=list(range(n)), window_size=4096,
                              buffers=[CommBufferSpec(name="scratch", nbytes=COUNT * 4 + 256)]) as handle:
        al = []
        for i in range(n):
            a = TaskArgs()
            a.add_tensor(_rehosted_ref_for(task_args, getattr(task_args, f"in_{i}")), TensorArgType.INPUT)
            a.add_tensor(_rehosted_ref_for(task_args, getattr(task_args, f"out_{i}")), TensorArgType.OUTPUT_EXISTING)
            a.add_tensor(handle[i].buffers["scratch"].tensor((COUNT + 64,), 0), TensorArgType.INOUT)
            a.add_scalar(n)
            a.add_scalar(handle[i].device_ctx)
            al.append(a)
        orch.submit_next_level_group(callables.allreduce, al, config, workers=list(range(n)))


@scene_test(level=3, runtime="tensormap_and_ringbuffer")
class TestAllreduceStyle(SceneTestCase):
    CALLABLE = {
        "orchestration": orch_fn,
        "callables": [{
            "name": "allreduce",
            "orchestration": {"source": os.path.join(PROGRAMS, "allreduce_orch.cpp"), "function_name": "allreduce_entry",
                              "config_name": "allreduce_config", "signature": [D.IN, D.OUT, D.INOUT]},
            "incores": [{"func_id": 0, "source": os.path.join(PROGRAMS, "allreduce_kernel.cpp"), "core_type": "aiv",
                         "signature": [D.IN, D.OUT, D.INOUT], "extra_include_dirs": [PROGRAMS]}],
        }],
    }
    CASES = [
        {"name": "p2", "platforms": ["a2a3sim"], "config": {"device_count": 2}, "params": {"nranks": 2}},
        {"name": "manual_p2", "platforms": ["a2a3sim"], "manual": ["a2a3sim"], "config": {"device_count": 2}, "params": {"nranks": 2}},
    ]

    def generate_args(self, params):
        import ctypes

        n = params["nranks"]
        specs = []
        for r in range(n):
            specs.append(TensorArg(f"in_{r}", torch.tensor([i + 100 * r for i in range(COUNT)], dtype=torch.float32)))
            specs.append(TensorArg(f"out_{r}", torch.zeros(COUNT, dtype=torch.float32)))
        specs.append(Scalar("nranks", ctypes.c_int64(n)))
        return TaskArgsBuilder(*specs)

    def compute_golden(self, args, params):
        n = params["nranks"]
        want = torch.tensor([n * i + 100 * n * (n - 1) // 2 for i in range(COUNT)], dtype=torch.float32)
        for r in range(n):
            getattr(args, f"out_{r}").copy_(want)


@scene_test(level=3, runtime="tensormap_and_ringbuffer")
class TestOnlyOnHardware(SceneTestCase):
    CALLABLE = TestAllreduceStyle.CALLABLE
    CASES = [{"name": "hw", "platforms": ["a2a3"], "config": {"device_count": 2}, "params": {"nranks": 2}}]
