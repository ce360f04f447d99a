"""A driver in simpler's style (imports simpler / simpler_setup; run by python -m pto.simpler):
an allreduce over CommContext on every device, host tensors as numpy arrays or, with --torch,
shared torch tensors. Exit 0 on a match."""

import argparse
import os
import sys

import numpy as np

from simpler.task_interface import (
    ArgDirection,
    CallConfig,
    ChipCallable,
    CommBufferSpec,
    CoreCallable,
    DataType,
    TaskArgs,
    TensorArgType,
)
from simpler.worker import Worker
from simpler_setup.kernel_compiler import KernelCompiler

PROGRAMS = os.environ["PTO_TEST_PROGRAMS"]
COUNT = 256


def build(platform):
    kc = KernelCompiler(platform=platform)
    inc = kc.get_orchestration_include_dirs("tensormap_and_ringbuffer") + [PROGRAMS, str(kc.project_root / "src" / "common")]
    k = kc.compile_incore(os.path.join(PROGRAMS, "allreduce_kernel.cpp"), core_type="aiv", extra_include_dirs=inc)
    o = kc.compile_orchestration("tensormap_and_ringbuffer", os.path.join(PROGRAMS, "allreduce_orch.cpp"))
    sig = [ArgDirection.IN, ArgDirection.OUT, ArgDirection.INOUT]
    return ChipCallable.build(signature=sig, func_name="allreduce_entry", config_name="allreduce_config",
                              binary=o, children=[(0, CoreCallable.build(signature=sig, binary=k))])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-p", "--platform", default="a2a3sim")
    p.add_argument("-d", "--device", default="0-1")
    p.add_argument("--torch", action="store_true")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--one-output", action="store_true", help="every rank writes its row of one shared output")
    a = p.parse_args()
    lo, _, hi = a.device.partition("-")
    ids = list(range(int(lo), int(hi or lo) + 1))
    n = len(ids)
    if a.torch:
        import torch

        ins = [torch.tensor([i + 100 * r for i in range(COUNT)], dtype=torch.float32).share_memory_() for r in range(n)]
        outs = [torch.zeros(COUNT, dtype=torch.float32).share_memory_() for _ in range(n)]
    else:
        ins = [np.array([i + 100 * r for i in range(COUNT)], dtype=np.float32) for r in range(n)]
        outs = [np.zeros(COUNT, dtype=np.float32) for _ in range(n)]
    callable_ = build(a.platform)
    w = Worker(level=3, platform=a.platform, runtime="tensormap_and_ringbuffer", device_ids=ids)
    h = w.register(callable_)
    try:
        w.init()
        if a.one_output:
            shared = w.create_buffer(n * COUNT * 4)
            rows = np.frombuffer(shared.shm.buf, dtype=np.float32).reshape(n, COUNT)

        def orch(o, _args, cfg):
            nbytes = COUNT * 4 + 64 * 4
            with o.allocate_domain(name="default", workers=list(range(n)), window_size=4096,
                                   buffers=[CommBufferSpec(name="scratch", dtype="float32", count=COUNT + 64, nbytes=nbytes)]) as d:
                al = []
                for r in range(n):
                    t = TaskArgs()
                    t.add_tensor(w.make_tensor_arg(ins[r], shapes=(COUNT,), dtype=DataType.FLOAT32), TensorArgType.INPUT)
                    if a.one_output:
                        out = shared.tensor((COUNT,), DataType.FLOAT32, byte_offset=r * COUNT * 4)
                    else:
                        out = w.make_tensor_arg(outs[r], shapes=(COUNT,), dtype=DataType.FLOAT32)
                    t.add_tensor(out, TensorArgType.OUTPUT_EXISTING)
                    t.add_tensor(d[r].buffers["scratch"].tensor((COUNT + 64,), DataType.FLOAT32), TensorArgType.INOUT)
                    t.add_scalar(d[r].domain_size)
                    t.add_scalar(d[r].device_ctx)
                    al.append(t)
                o.submit_next_level_group(h, al, cfg, workers=list(range(n)))

        for _ in range(a.runs):
            w.run(orch, args=None, config=CallConfig())
            for r in range(n):
                got = rows[r] if a.one_output else np.asarray(outs[r])
                want = np.array([n * i + 100 * n * (n - 1) // 2 for i in range(COUNT)], dtype=np.float32)
                if not np.array_equal(got, want):
                    print(f"[allreduce] rank {r}: got {got[:4]}, want {want[:4]}")
                    return 1
        print(f"[allreduce] {n} ranks matched golden")
        return 0
    finally:
        w.close()


if __name__ == "__main__":
    sys.exit(main())
