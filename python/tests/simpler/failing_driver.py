"""Drivers that fail, one per mode (argv[1]), each as a user would meet it."""

import os
import sys

import numpy as np

from simpler.task_interface import ChipCallable, CoreCallable, TaskArgs, TensorArgType
from simpler.worker import Worker
from simpler_setup.kernel_compiler import KernelCompiler

PROGRAMS = os.environ["PTO_TEST_PROGRAMS"]
MODE = sys.argv[1]

if MODE == "platform":
    KernelCompiler(platform="a2a3")
kc = KernelCompiler(platform="a2a3sim")
kernel = {"crash": "crash_kernel.cpp", "segv": "segv_kernel.cpp", "noentry": "no_entry.cpp"}.get(MODE, "scale_kernel.cpp")
entry = {"fatal": "fatal_entry", "throw": "throw_entry", "func": "bad_func_entry", "orchsegv": "segv_entry"}.get(MODE, "scale_entry")
orch = "fatal_orch.cpp" if MODE in ("fatal", "throw", "func", "orchsegv") else "scale_orch.cpp"
k = kc.compile_incore(os.path.join(PROGRAMS, kernel), core_type="aic", extra_include_dirs=[PROGRAMS])
o = kc.compile_orchestration("tensormap_and_ringbuffer", os.path.join(PROGRAMS, orch))
c = ChipCallable.build(signature=[], func_name=entry, config_name="scale_config" if MODE == "count" else "",
                       binary=o, children=[(0, CoreCallable.build(signature=[], binary=k))])
w = Worker(level=3, platform="a2a3sim", device_ids=[0])
h = w.register(c)
w.init()
try:
    x, y = np.ones(8, dtype=np.float32), np.zeros(8, dtype=np.float32)

    def fn(orch_, _a, cfg):
        if MODE == "raise":
            raise ValueError("ibing mode is only supported for nranks=2")
        a = TaskArgs()
        a.add_tensor(w.make_tensor_arg(x, (8,), 0), TensorArgType.INPUT)
        a.add_tensor(w.make_tensor_arg(y, (8,), 0), TensorArgType.OUTPUT_EXISTING)
        if MODE == "count":
            a.add_scalar(5)
        orch_.submit_next_level(h, a, cfg, worker=0)

    w.run(fn)
finally:
    w.close()
