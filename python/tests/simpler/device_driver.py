"""Chip memory (alloc_child_tensor) in simpler's style: a weight copied to chip 1 once and read by
tasks of two runs, a result written to chip memory and copied back, then freed."""

import os
import sys

import numpy as np

from simpler.task_interface import ChipCallable, CoreCallable, DataType, TaskArgs, TensorArgType
from simpler.worker import Worker
from simpler_setup.kernel_compiler import KernelCompiler

PROGRAMS = os.environ["PTO_TEST_PROGRAMS"]
N = 128


def callable_(kc, orch, entry, config, kernel, core):
    k = kc.compile_incore(os.path.join(PROGRAMS, kernel), core_type=core, extra_include_dirs=[PROGRAMS])
    o = kc.compile_orchestration("tensormap_and_ringbuffer", os.path.join(PROGRAMS, orch))
    return ChipCallable.build(signature=[], func_name=entry, config_name=config, binary=o,
                              children=[(0, CoreCallable.build(signature=[], binary=k))])


def main():
    kc = KernelCompiler(platform="a2a3sim")
    scale = callable_(kc, "scale_orch.cpp", "scale_entry", "scale_config", "scale_kernel.cpp", "aic")
    add = callable_(kc, "add_orch.cpp", "add_entry", "", "add_kernel.cpp", "aiv")
    w = Worker(level=3, platform="a2a3sim", device_ids=[0, 1])
    hs, ha = w.register(scale), w.register(add)
    w.init()
    try:
        f32 = DataType.FLOAT32
        x, wsrc, z, y = (w.create_buffer(N * 4) for _ in range(4))
        xv, wv, zv, yv = (np.frombuffer(b.shm.buf, dtype=np.float32) for b in (x, wsrc, z, y))
        xv[:] = np.arange(N)
        wv[:] = 0.5
        state = {}

        def first(o, _a, cfg):
            wd = o.alloc_child_tensor(worker_id=1, shapes=(N,), dtype=f32)
            yd = o.alloc_child_tensor(worker_id=1, shapes=(N,), dtype=f32)
            state.update(wd=wd, yd=yd)
            o.copy_to(wd, wsrc)
            a = TaskArgs()
            a.add_tensor(x.tensor((N,), f32), TensorArgType.INPUT)
            a.add_tensor(wd.tensor((N,), f32), TensorArgType.INPUT)
            a.add_tensor(z.tensor((N,), f32), TensorArgType.OUTPUT_EXISTING)
            o.submit_next_level(ha, a, cfg, worker=1)
            b = TaskArgs()
            b.add_tensor(x.tensor((N,), f32), TensorArgType.INPUT)
            b.add_tensor(yd.tensor((N,), f32), TensorArgType.OUTPUT_EXISTING)
            o.submit_next_level(hs, b, cfg, worker=1)
            o.copy_from(y, yd)

        w.run(first)
        assert np.array_equal(zv, np.arange(N) + 0.5), zv[:4]
        assert np.array_equal(yv, 2 * np.arange(N)), yv[:4]

        def second(o, _a, cfg):
            # The weight is still on chip 1 from the first run.
            xv[:] = 10
            a = TaskArgs()
            a.add_tensor(x.tensor((N,), f32), TensorArgType.INPUT)
            a.add_tensor(state["wd"].tensor((N,), f32), TensorArgType.INPUT)
            a.add_tensor(z.tensor((N,), f32), TensorArgType.OUTPUT_EXISTING)
            o.submit_next_level(ha, a, cfg, worker=1)
            o.free(state["wd"])
            o.free(state["yd"])

        w.run(second)
        assert np.array_equal(zv, np.full(N, 10.5, dtype=np.float32)), zv[:4]

        def wrong_chip(o, _a, cfg):
            a = TaskArgs()
            a.add_tensor(x.tensor((N,), f32), TensorArgType.INPUT)
            a.add_tensor(o.alloc_child_tensor(worker_id=0, shapes=(N,), dtype=f32).tensor((N,), f32), TensorArgType.INPUT)
            a.add_tensor(z.tensor((N,), f32), TensorArgType.OUTPUT_EXISTING)
            o.submit_next_level(ha, a, cfg, worker=1)

        try:
            w.run(wrong_chip)
        except ValueError as e:
            assert "chip memory of chip 0, submitted to chip 1" in str(e), e
        else:
            raise AssertionError("chip 0's memory was accepted on chip 1")
        print("[device] matched golden")
        return 0
    finally:
        w.close()


if __name__ == "__main__":
    sys.exit(main())
