"""Two callables linked by a host tensor (y = 2x on an AIC core, then z = y + x on an AIV core),
on two chips, and a Python sub-worker that checks every z after both chips wrote it."""

import os
import sys

import numpy as np

from simpler.task_interface import ChipCallable, CoreCallable, TaskArgs, TensorArgType
from simpler.worker import Worker
from simpler_setup.kernel_compiler import KernelCompiler

PROGRAMS = os.environ["PTO_TEST_PROGRAMS"]
N = 64


def callable_(kc, orch, entry, config, kernel, core):
    k = kc.compile_incore(os.path.join(PROGRAMS, kernel), core_type=core, extra_include_dirs=[PROGRAMS])
    o = kc.compile_orchestration("tensormap_and_ringbuffer", os.path.join(PROGRAMS, orch))
    return ChipCallable.build(signature=[], func_name=entry, config_name=config, binary=o,
                              children=[(0, CoreCallable.build(signature=[], binary=k))])


def check(args):
    # In the sub-worker: every z must be 3x.
    for i in range(0, args.tensor_count(), 2):
        x = np.frombuffer(args[i].buffer, dtype=np.float32)
        z = np.frombuffer(args[i + 1].buffer, dtype=np.float32)
        if not np.array_equal(z, 3 * x):
            raise AssertionError(f"z is not 3x: {z[:4]} vs {x[:4]}")
    print("[chain] the sub-worker checked every z", flush=True)


def main():
    kc = KernelCompiler(platform="a2a3sim")
    scale = callable_(kc, "scale_orch.cpp", "scale_entry", "scale_config", "scale_kernel.cpp", "aic")
    add = callable_(kc, "add_orch.cpp", "add_entry", "", "add_kernel.cpp", "aiv")
    w = Worker(level=3, platform="a2a3sim", device_ids=[0, 1], num_sub_workers=1)
    hs, ha, hc = w.register(scale), w.register(add), w.register(check)
    w.init()
    try:
        xs = [w.create_buffer(N * 4) for _ in range(2)]
        ys = [w.create_buffer(N * 4) for _ in range(2)]
        zs = [w.create_buffer(N * 4) for _ in range(2)]
        for r in range(2):
            np.frombuffer(xs[r].shm.buf, dtype=np.float32)[:] = np.arange(N) + 1000 * r

        def t(b, tag):
            return (b.tensor((N,), 0), tag)

        def orch(o, _args, cfg):
            for r in range(2):
                a = TaskArgs()
                for x, tag in (t(xs[r], TensorArgType.INPUT), t(ys[r], TensorArgType.OUTPUT_EXISTING)):
                    a.add_tensor(x, tag)
                o.submit_next_level(hs, a, cfg, worker=r)
                b = TaskArgs()
                for x, tag in (t(ys[r], TensorArgType.INPUT), t(xs[r], TensorArgType.INPUT), t(zs[r], TensorArgType.OUTPUT_EXISTING)):
                    b.add_tensor(x, tag)
                o.submit_next_level(ha, b, cfg, worker=r)
            s = TaskArgs()
            for r in range(2):
                s.add_tensor(xs[r].tensor((N,), 0), TensorArgType.INPUT)
                s.add_tensor(zs[r].tensor((N,), 0), TensorArgType.INPUT)
            o.submit_sub(hc, s)

        w.run(orch)
        for r in range(2):
            z = np.frombuffer(zs[r].shm.buf, dtype=np.float32)
            assert np.array_equal(z, 3 * (np.arange(N) + 1000 * r)), z[:4]
        print("[chain] matched golden")
        return 0
    finally:
        w.close()


if __name__ == "__main__":
    sys.exit(main())
