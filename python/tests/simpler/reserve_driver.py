"""simpler's per-chip task order on pto: a group on chips {0,1} whose chip-1 member waits for a
later single task on chip 0, a group on chips {1,2}, then a single task on chip 2 that must run
after that group's chip-2 member (it reads what the member wrote). Every task writes a marker
into its own element of one shared output. Exit 0 when every marker matches."""

import os
import sys

import numpy as np

from simpler.task_interface import ArgDirection, ChipCallable, CommBufferSpec, CoreCallable, DataType, TaskArgs, TensorArgType
from simpler.worker import Worker
from simpler_setup.kernel_compiler import KernelCompiler

PROGRAMS = os.environ["PTO_TEST_PROGRAMS"]
FIRST, RELEASE, SECOND, CHECK = range(4)
# (what, chip, operation) in output order.
SLOTS = [("first group", 0, FIRST), ("first group", 1, FIRST), ("second group", 1, SECOND),
         ("second group", 2, SECOND), ("single", 0, RELEASE), ("single", 2, CHECK)]
GOLDEN = [10, 11, 31, 32, 20, 1]


def main():
    kc = KernelCompiler(platform="a2a3sim")
    inc = kc.get_orchestration_include_dirs("tensormap_and_ringbuffer") + [PROGRAMS, str(kc.project_root / "src" / "common")]
    k = kc.compile_incore(os.path.join(PROGRAMS, "reserve_kernel.cpp"), core_type="aiv", extra_include_dirs=inc)
    o = kc.compile_orchestration("tensormap_and_ringbuffer", os.path.join(PROGRAMS, "reserve_orch.cpp"))
    sig = [ArgDirection.OUT]
    c = ChipCallable.build(signature=sig, func_name="reserve_entry", config_name="reserve_config", binary=o,
                           children=[(0, CoreCallable.build(signature=sig, binary=k))])
    w = Worker(level=3, platform="a2a3sim", device_ids=[0, 1, 2])
    h = w.register(c)
    w.init()
    try:
        out = w.create_buffer(len(SLOTS) * 4)
        got = np.frombuffer(out.shm.buf, dtype=np.int32)
        got[:] = -7

        def orch(o, _args, cfg):
            with o.allocate_domain(name="reserve", workers=[0, 1, 2], window_size=4096,
                                   buffers=[CommBufferSpec(name="state", dtype="int32", count=2, nbytes=8)]) as d:

                def args(slot):
                    _, chip, op = SLOTS[slot]
                    t = TaskArgs()
                    t.add_tensor(out.tensor((1,), DataType.INT32, byte_offset=4 * slot), TensorArgType.OUTPUT_EXISTING)
                    t.add_scalar(op)
                    t.add_scalar(d[chip].buffers["state"].base)
                    t.add_scalar(d[chip].device_ctx)
                    return t

                o.submit_next_level_group(h, [args(0), args(1)], cfg, workers=[0, 1])
                o.submit_next_level_group(h, [args(2), args(3)], cfg, workers=[1, 2])
                o.submit_next_level(h, args(4), cfg, worker=0)
                o.submit_next_level(h, args(5), cfg, worker=2)

        w.run(orch)
        bad = [f"{SLOTS[i][0]} task on chip {SLOTS[i][1]}: {got[i]}, want {GOLDEN[i]}" for i in range(len(SLOTS)) if got[i] != GOLDEN[i]]
        if bad:
            print("[reserve] " + "; ".join(bad))
            return 1
        print("[reserve] every task ran in its chip's order")
        return 0
    finally:
        w.close()


if __name__ == "__main__":
    sys.exit(main())
