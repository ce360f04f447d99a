"""The pto Python package against numpy references: Worker runs on chips and sub-workers,
zero-copy buffers, errors as exceptions, collectives from host code, traces, the examples, and
the type stubs against the compiled module."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pto  # first: the Worker forks, numpy's BLAS must stay single-threaded
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_vector_add_on_a_chip_matches_numpy():
    with pto.Worker(chips=2) as w:
        a, b, c = (w.buffer(1000) for _ in range(3))
        a[:] = np.arange(1000)
        b[:] = np.linspace(0, 1, 1000)
        w.run(lambda h, _: h.submit_chip(1, "vector_add", [pto.IN(a), pto.IN(b), pto.OUT(c)]))
        np.testing.assert_array_equal(c, (a + b).astype(np.float32))


def test_buffers_are_zero_copy_views_of_shared_memory():
    with pto.Worker(chips=1) as w:
        a = w.buffer((4, 8), "float64")
        assert a.shape == (4, 8) and a.dtype == np.float64
        assert not a.any()
        native = a.base
        assert isinstance(native, pto.SharedBuffer)
        assert a.__array_interface__["data"][0] == native.addr
        # A chip writes it; the same numpy array sees the result without a copy.
        b = w.buffer((4, 8), "float64")
        a[:] = 2.0
        w.run(lambda h, _: h.submit_chip(0, "vector_scale", [pto.IN(a), pto.OUT(b), 3.0]))
        np.testing.assert_array_equal(b, np.full((4, 8), 6.0))


def test_views_of_buffers_are_tensors_and_dependencies_follow_the_data():
    with pto.Worker(chips=2) as w:
        a = w.buffer(64)
        t = w.buffer(64)
        out = w.buffer(64)
        a[:] = np.arange(64)
        # Two chips, chained through `t`: the second task reads what the first wrote.
        def orch(h, _):
            h.submit_chip(0, "vector_scale", [pto.IN(a), pto.OUT(t), 2.0])
            h.submit_chip(1, "vector_add", [pto.IN(t), pto.IN(a), pto.OUT(out)])
            # A view (the second half) as its own tensor.
            h.submit_chip(0, "vector_scale", [pto.IN(a[32:]), pto.OUT(a[:32]), 1.0])
        w.run(orch)
        np.testing.assert_array_equal(out, 3.0 * np.arange(64))
        np.testing.assert_array_equal(a[:32], np.arange(32, 64))


def test_sub_worker_callables_get_arrays_and_scalars():
    def check(x, y, verdict, scale):
        verdict[0] = int(np.array_equal(y, x * scale))

    with pto.Worker(chips=1, sub_workers=1, subs={"check": check}) as w:
        x, y = w.buffer(32), w.buffer(32)
        v = w.buffer(1, "int32")
        x[:] = np.arange(32)

        def orch(h, _):
            h.submit_chip(0, "vector_scale", [pto.IN(x), pto.OUT(y), 4.0])
            h.submit_sub("check", [pto.IN(x), pto.IN(y), pto.OUT(v), 4.0])

        w.run(orch)
        assert v[0] == 1


def test_backend_local_runs_chips_and_sub_workers_as_threads_of_this_process():
    import os
    import threading

    def where(x, y, out, scale):
        # A sub-worker thread: this process's pid, and the chip's result is in.
        out[0] = os.getpid()
        out[1] = int(np.array_equal(y, x * scale))

    # Another thread is running: a forking Worker would refuse to start; threads do not mind.
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        with pto.Worker(chips=2, sub_workers=1, subs={"where": where}, backend="local") as w:
            x, y, out = w.buffer(32), w.buffer(32), w.buffer(2, "int64")
            x[:] = np.arange(32)

            def orch(h, _):
                h.submit_chip(1, "vector_scale", [pto.IN(x), pto.OUT(y), 3.0])
                h.submit_sub("where", [pto.IN(x), pto.IN(y), pto.OUT(out), 3.0])

            w.run(orch)
            assert list(out) == [os.getpid(), 1]
    finally:
        stop.set()
        other.join()
    with pytest.raises(ValueError, match='backend must be "shm".*or "local".*not \'mpi\''):
        pto.Worker(chips=1, backend="mpi")


def test_a_failing_sub_worker_raises_with_its_traceback():
    def boom(x):
        raise ValueError("sub-worker failed on purpose")

    with pto.Worker(chips=1, sub_workers=1, subs={"boom": boom}) as w:
        x = w.buffer(4)
        with pytest.raises(pto.WorkerError, match="sub-worker failed on purpose"):
            w.run(lambda h, _: h.submit_sub("boom", [pto.IN(x)]))


def test_bad_input_is_a_clear_exception():
    with pto.Worker(chips=1) as w:
        a = w.buffer(8)
        # Checked when submitted: the message names the argument and what it may be.
        with pytest.raises(ValueError, match="unknown chip program 'no_such_program'"):
            w.run(lambda h, _: h.submit_chip(0, "no_such_program", [pto.IN(a)]))
        with pytest.raises(ValueError, match=r"chip \(the Worker has 1 chip\) must be an int from 0 to 0, got 5"):
            w.run(lambda h, _: h.submit_chip(5, "vector_scale", [pto.IN(a), pto.OUT(a), 1.0]))
        # Found when the run starts: the kernel refuses overlapping arguments.
        with pytest.raises(pto.WorkerError, match="overlap"):
            w.run(lambda h, _: h.submit_chip(0, "vector_scale", [pto.IN(a), pto.OUT(a), 1.0]))
        with pytest.raises(TypeError, match="Worker.buffer"):
            w.run(lambda h, _: h.submit_chip(0, "vector_scale", [pto.IN(np.zeros(8, np.float32))]))
        with pytest.raises(ValueError, match="unknown argument mode"):
            w.run(lambda h, _: h.submit_chip(0, "vector_scale", [("sideways", a)]))
        with pytest.raises(ValueError, match="unknown dtype"):
            w.buffer(4, "complex128")
        with pytest.raises(ValueError, match=r"chip_context: i \(the Worker has 1 chip\) must be an int from 0 to 0, got 3"):
            w.chip_context(3)
        # An exception in the orchestration function itself comes back unchanged.
        with pytest.raises(KeyError):
            w.run(lambda h, _: {}["missing"])
        # The Worker is still usable after all of that.
        b = w.buffer(8)
        a[:] = 1.0
        w.run(lambda h, _: h.submit_chip(0, "vector_scale", [pto.IN(a), pto.OUT(b), 5.0]))
        np.testing.assert_array_equal(b, np.full(8, 5.0))


def test_a_process_with_threads_gets_a_hint_instead_of_a_fork():
    code = (
        "import threading, time, pto\n"
        "t = threading.Thread(target=time.sleep, args=(1,)); t.start()\n"
        "try:\n"
        "    pto.Worker(chips=1)\n"
        "except pto.WorkerError as e:\n"
        "    print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "before any thread starts" in r.stdout and "import pto before numpy" in r.stdout, r


def test_a_closed_worker_refuses_work():
    w = pto.Worker(chips=1)
    w.close()
    with pytest.raises(pto.WorkerError, match="closed"):
        w.buffer(4)


def test_chip_context_names_rank_size_and_buffers():
    bufs = [("scratch", "float32", 100), ("signals", "uint32", 16)]
    with pto.Worker(chips=3, buffers=bufs) as w:
        c = w.chip_context(2)
        assert (c["rank"], c["size"]) == (2, 3)
        assert c["window_bytes"] >= 100 * 4 + 16 * 4
        assert [b[:3] for b in c["buffers"]] == [("scratch", "float32", 100), ("signals", "uint32", 16)]
        assert c["buffers"][1][3] % 64 == 0


def test_trace_is_written_as_chrome_trace_events(tmp_path):
    with pto.Worker(chips=2) as w:
        a, b = w.buffer(16), w.buffer(16)
        path = tmp_path / "run.trace.json"
        w.run(lambda h, _: h.submit_chip(1, "vector_scale", [pto.IN(a), pto.OUT(b), 2.0]), trace=path)
    doc = json.loads(path.read_text())
    names = {e.get("name") for e in doc["traceEvents"]}
    assert "vector_scale" in names, names


def test_collectives_from_host_code_match_numpy():
    n = 4

    def body(c):
        x = np.arange(10, dtype=np.float64) + 100 * c.rank
        c.allreduce(x)
        g = c.allgather(np.array([c.rank, c.rank * 10], dtype=np.int32))
        b = np.full(3, c.rank, dtype=np.int64)
        c.broadcast(b, root=2)
        m = np.array([float(c.rank)], dtype=np.float32)
        c.allreduce(m, op="max")
        c.barrier()
        return x, g, b, m

    out = pto.run_ranks(n, body)
    want = sum(np.arange(10) + 100 * r for r in range(n))
    for x, g, b, m in out:
        np.testing.assert_array_equal(x, want)
        np.testing.assert_array_equal(g, [[r, 10 * r] for r in range(n)])
        np.testing.assert_array_equal(b, [2, 2, 2])
        assert m[0] == n - 1


def test_an_exception_on_a_rank_names_the_rank():
    def body(c):
        if c.rank == 1:
            raise RuntimeError("rank body failed")
        return c.rank

    # The rank's own exception type, its message prefixed with the rank.
    with pytest.raises(RuntimeError, match="^rank 1: rank body failed$") as info:
        pto.run_ranks(2, body)
    assert info.value.rank == 1


def test_programs_and_kernels_are_listed():
    names = [p[0] for p in pto.programs()]
    assert {"ffn_tp_parallel", "allreduce_distributed", "deferred_notify"} <= set(names)
    assert "vector_add" in pto.kernels() and "matmul" in pto.kernels()


@pytest.mark.parametrize("example", ["allreduce_distributed", "ffn_tp_parallel", "deferred_notify"])
@pytest.mark.parametrize("chips", [2, 4])
def test_python_examples_match_their_goldens(example, chips):
    script = ROOT / "examples" / "python" / f"{example}.py"
    r = subprocess.run(
        [sys.executable, str(script), "--chips", str(chips)],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED" in r.stdout


def test_the_readme_example_runs(tmp_path):
    text = (ROOT / "README.md").read_text()
    section = text.split("## From Python", 1)[1]
    code = section.split("```python", 1)[1].split("```", 1)[0]
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_package_and_examples_type_check():
    r = subprocess.run(
        [sys.executable, "-m", "mypy", str(ROOT / "python" / "pto"), str(ROOT / "examples" / "python")],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_type_stubs_match_the_compiled_module():
    r = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "pto._native"],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_second_open_worker_and_a_close_during_its_run_are_clear_errors():
    w = pto.Worker(chips=1)
    try:
        with pytest.raises(pto.WorkerError, match="another Worker is open"):
            pto.Worker(chips=1)

        def orch(h, _):
            w.close()

        with pytest.raises(pto.WorkerError, match="the Worker is running"):
            w.run(orch)
    finally:
        w.close()
    # Once closed, another can start.
    pto.Worker(chips=1).close()


def test_a_sub_worker_gets_its_inputs_read_only():
    def sub(a, out):
        try:
            a[0] = 1.0
        except ValueError:
            out[0] = 1  # numpy refused the write

    with pto.Worker(chips=1, sub_workers=1, subs={"sub": sub}) as w:
        a, out = w.buffer(4), w.buffer(1, "int32")
        w.run(lambda h, _: h.submit_sub("sub", [pto.IN(a), pto.OUT(out)]))
        assert out[0] == 1 and a[0] == 0.0
