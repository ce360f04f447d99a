"""Your own kernels from Python: ``@pto.kernel`` functions on the chips' cores (goldens from
numpy, exceptions, one-sided window operations), and C plugins loaded with ``pto.load_plugin``
(built here with ``cc`` against ``pto include-dir``'s header, in a fresh process each, since a
loaded plugin joins every later Worker of its process)."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pto  # first: the Worker forks, numpy's BLAS must stay single-threaded
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pto.kernel(core="aiv")
def affine(ctx, x, y, a, b):
    y[:] = a * x + b + ctx.rank


@pto.kernel(core="aic", name="renamed")
def _whatever(ctx, out):
    out[:] = [ctx.rank, ctx.size, ctx.block_idx, ctx.block_num]


@pto.kernel
def explode(ctx, x, y):
    raise ValueError(f"explode on rank {ctx.rank}: x[0] = {x[0]}")


@pto.kernel
def ring(ctx, out):
    r, n = ctx.rank, ctx.size
    ctx.put((r + 1) % n, "inbox", 0, np.full(4, 10.0 * r, dtype=np.float32))
    ctx.notify((r + 1) % n, "flag", 0, 1)
    ctx.wait_until("flag", 0, 1)
    out[:] = ctx.window("inbox")
    got = np.zeros(4, dtype=np.float32)
    ctx.get(r, "inbox", 0, got)
    assert (got == out).all()
    ctx.barrier()


@pto.kernel
def writes_input(ctx, x):
    x[0] = 1.0  # x is read-only: numpy refuses


def test_python_kernels_match_numpy_on_every_chip():
    with pto.Worker(chips=2, cores=(1, 2), kernels=[affine, _whatever]) as w:
        x, y = w.buffer((2, 8)), w.buffer((2, 8))
        info = w.buffer((2, 4), "int64")
        x[:] = np.arange(16).reshape(2, 8)

        def orch(h, _):
            for c in range(2):
                h.submit_chip(c, "affine", [pto.IN(x[c]), pto.OUT(y[c]), 3.0, 0.5])
                h.submit_chip(c, "renamed", [pto.OUT(info[c])])

        w.run(orch)
        assert np.array_equal(y, 3.0 * x + 0.5 + np.arange(2)[:, None])
        assert info.tolist() == [[0, 2, 0, 1], [1, 2, 0, 1]]


def test_python_kernels_put_notify_wait_and_read_windows():
    buffers = [("inbox", "float32", 4), ("flag", "uint32", 1)]
    with pto.Worker(chips=3, cores=(1, 2), buffers=buffers, kernels=[ring]) as w:
        out = w.buffer((3, 4))
        w.run(lambda h, _: [h.submit_chip(c, "ring", [pto.OUT(out[c])]) for c in range(3)])
        assert np.array_equal(out, np.repeat(10.0 * np.array([[2], [0], [1]], dtype=np.float32), 4, axis=1))


@pto.kernel
def ring_of_lists(ctx, out):
    # A list of Python floats (float64 to numpy) lands in the float32 buffer as float32.
    r, n = ctx.rank, ctx.size
    ctx.put((r + 1) % n, "inbox", 0, [float(r), 1.5, 2.5, 3.5])
    ctx.notify((r + 1) % n, "flag", 0, 1)
    ctx.wait_until("flag", 0, 1)
    out[:] = ctx.window("inbox")
    for bad, kind in (([0.0], TypeError), (np.zeros(4, np.float64), ValueError)):
        try:
            ctx.get(r, "inbox", 0, bad)
        except kind:
            pass
        else:
            raise AssertionError(f"get into {bad!r} was not refused")


def test_put_converts_to_the_buffers_dtype_and_get_refuses_another():
    buffers = [("inbox", "float32", 4), ("flag", "uint32", 1)]
    with pto.Worker(chips=2, cores=(1, 2), buffers=buffers, kernels=[ring_of_lists]) as w:
        out = w.buffer((2, 4))
        w.run(lambda h, _: [h.submit_chip(c, "ring_of_lists", [pto.OUT(out[c])]) for c in range(2)])
        assert out.tolist() == [[1.0, 1.5, 2.5, 3.5], [0.0, 1.5, 2.5, 3.5]]


def test_an_exception_fails_its_task_with_the_traceback_and_the_worker_stays_usable():
    with pto.Worker(chips=1, cores=(1, 2), kernels=[explode, affine, writes_input]) as w:
        x, y, z = w.buffer(4), w.buffer(4), w.buffer(4)
        x[:] = 7.0

        def orch(h, _):
            h.submit_chip(0, "explode", [pto.IN(x), pto.OUT(y)])
            # Reads y, which the failed task was to write: poisoned, never run.
            h.submit_chip(0, "affine", [pto.IN(y), pto.OUT(z), 1.0, 1.0])

        with pytest.raises(pto.WorkerError) as e:
            w.run(orch)
        text = str(e.value)
        assert "explode on rank 0: x[0] = 7.0" in text and "Traceback" in text, text
        assert "ValueError" in text and "poisoned" in text, text
        assert (z == 0).all()
        with pytest.raises(pto.WorkerError, match="read-only"):
            w.run(lambda h, _: h.submit_chip(0, "writes_input", [pto.IN(x)]))
        w.run(lambda h, _: h.submit_chip(0, "affine", [pto.IN(x), pto.OUT(z), 2.0, 0.0]))
        assert (z == 14.0).all()


def test_bad_kernels_are_refused_by_name():
    with pytest.raises(ValueError, match="core must be"):
        pto.kernel(core="gpu")(lambda ctx: None)
    with pytest.raises(TypeError, match="not callable"):
        pto.Kernel(3)
    with pytest.raises(ValueError, match="already registered"):
        pto.Worker(kernels=[pto.kernel(name="vector_add")(lambda ctx: None)])
    with pytest.raises(ValueError, match="given twice"):
        pto.Worker(kernels=[affine, affine])
    with pytest.raises(ValueError, match="no window"):
        with pto.Worker(kernels=[ring]) as w:
            out = w.buffer(4)
            try:
                w.run(lambda h, _: h.submit_chip(0, "ring", [pto.OUT(out)]))
            except pto.WorkerError as e:
                raise ValueError(str(e)) from None


def test_the_own_kernel_example_matches_its_golden():
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "python" / "own_kernel.py"), "--chips", "4"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED" in r.stdout


def _build(tmp_path, src, *defines):
    out = tmp_path / f"lib{Path(src).stem}.so"
    cmd = ["cc", "-std=c99", "-shared", "-fPIC", f"-I{ROOT / 'include'}", str(ROOT / src), "-o", str(out)]
    cmd += [f"-D{d}" for d in defines]
    subprocess.run(cmd, check=True)
    return out


def _in_fresh_process(code):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def test_a_c_plugins_programs_and_kernels_run_by_name(tmp_path):
    lib = _build(tmp_path, "examples/plugin/ring.c")
    code, out = _in_fresh_process(f"""
        import pto, numpy as np
        info = pto.load_plugin({str(lib)!r})
        assert info["programs"] == ["ring", "ring_blocking"], info
        assert ("inbox", "f32", 256) in info["buffers"], info
        with pto.Worker(chips=4, cores=(1, 2)) as w:
            w.run(lambda h, _: h.submit_group([0, 1, 2, 3], "ring"))
            w.run(lambda h, _: h.submit_group([0, 1, 2, 3], "ring_blocking"))
            data = w.buffer((4, 256))
            w.run(lambda h, _: [h.submit_chip(c, "ring_fill", [pto.OUT(data[c])]) for c in range(4)])
            assert np.array_equal(data, 1000.0 * np.arange(4)[:, None] + np.arange(256)[None, :])
        print("OK")
    """)
    assert code == 0 and "OK" in out, out


def test_bad_plugins_raise_naming_the_file(tmp_path):
    cases = {
        "NO_REGISTER": "pto_plugin_register is missing",
        "ABI_MISMATCH": "returns 999",
        "BUFFER_TWICE": "declared twice",
    }
    for define, want in cases.items():
        lib = _build(tmp_path, "crates/pto-cli/tests/plugins/bad.c", define)
        lib = lib.rename(tmp_path / f"lib_{define}.so")
        code, out = _in_fresh_process(f"""
            import pto
            try:
                pto.load_plugin({str(lib)!r})
            except pto.PtoError as e:
                assert {want!r} in str(e) and {str(lib)!r} in str(e), str(e)
                print("OK")
        """)
        assert code == 0 and "OK" in out, (define, out)
    code, out = _in_fresh_process("""
        import pto
        try:
            pto.load_plugin("/nonexistent/libnope.so")
        except pto.PtoError as e:
            assert "libnope.so" in str(e), str(e)
            print("OK")
    """)
    assert code == 0 and "OK" in out, out


@pto.kernel
def put_then_wait(ctx, out):
    r, n = ctx.rank, ctx.size
    ctx.put((r + 1) % n, "inbox", 0, np.full(4, float(r), dtype=np.float32))
    ctx.notify((r + 1) % n, "flag", 0, 1)
    ctx.wait_until("flag", 0, 1)
    got = np.zeros(4, dtype=np.float32)
    ctx.get(r, "inbox", 0, got)
    out[:] = got


def test_check_true_finds_the_race_between_python_kernels_and_not_in_the_fixed_one():
    buffers = [("inbox", "float32", 4), ("flag", "uint32", 1)]
    with pto.Worker(chips=2, cores=(1, 2), buffers=buffers, kernels=[put_then_wait], check=True) as w:
        out = w.buffer((2, 4))
        w.run(lambda h, _: [h.submit_chip(c, "put_then_wait", [pto.OUT(out[c])]) for c in range(2)])
        r = w.check_report()
        assert r["races"] == [] and r["accesses"] > 0, r
    # A get of its own inbox before the wait (window views: the next test).
    @pto.kernel(name="racy_get")
    def racy_get(ctx, out):
        r, n = ctx.rank, ctx.size
        ctx.put((r + 1) % n, "inbox", 0, np.full(4, float(r), dtype=np.float32))
        ctx.notify((r + 1) % n, "flag", 0, 1)
        got = np.zeros(4, dtype=np.float32)
        ctx.get(r, "inbox", 0, got)
        ctx.wait_until("flag", 0, 1)
        out[:] = got

    with pto.Worker(chips=2, cores=(1, 2), buffers=buffers, kernels=[racy_get], check=True) as w:
        out = w.buffer((2, 4))
        w.run(lambda h, _: [h.submit_chip(c, "racy_get", [pto.OUT(out[c])]) for c in range(2)])
        r = w.check_report()
        assert len(r["races"]) == 2, r
        assert "`inbox[0..16)`" in r["races"][0] and "`racy_get`" in r["races"][0], r
    with pytest.raises(ValueError, match="without check=True"):
        with pto.Worker() as w:
            w.check_report()


@pto.kernel(name="view_then_get")
def view_then_get(ctx, out, ordered):
    """Rank 0 writes its ``box`` through ``ctx.window``; rank 1 gets it (after a notify -> wait
    when ``ordered``)."""
    got = np.zeros(4, dtype=np.float32)
    if ctx.rank == 0:
        ctx.window("box")[:] = np.arange(4, dtype=np.float32)
        if ordered:
            ctx.notify(1, "flag", 0, 1)
    elif ctx.rank == 1:
        if ordered:
            ctx.wait_until("flag", 0, 1)
        ctx.get(0, "box", 0, got)
        assert not ordered or (got == np.arange(4)).all(), got
    out[:] = got


def test_check_true_records_a_window_view_as_a_write_of_the_whole_buffer_by_its_task():
    buffers = [("box", "float32", 4), ("flag", "uint32", 1)]
    for ordered in (0, 1):
        with pto.Worker(chips=2, cores=(1, 2), buffers=buffers, kernels=[view_then_get], check=True) as w:
            out = w.buffer((2, 4))
            w.run(lambda h, _: [h.submit_chip(c, "view_then_get", [pto.OUT(out[c]), ordered]) for c in range(2)])
            r = w.check_report()
        if ordered:
            assert r["races"] == [], r
            continue
        assert len(r["races"]) == 1, r
        race = r["races"][0]
        assert "rank 0 writes `box[0..16)` (window view in task" in race, race
        assert "rank 1 reads `box[0..16)` of rank 0 (get in task" in race, race
        assert "`view_then_get`" in race, race


@pto.kernel
def waits_for_nobody(ctx, x, y):
    if ctx.rank == 0:
        ctx.wait_until("sig", 0, 1)  # nobody notifies it


def test_the_workers_timeout_is_its_chips_waits_deadline():
    buffers = [("sig", "uint32", 1)]
    with pto.Worker(chips=2, buffers=buffers, kernels=[waits_for_nobody], timeout=1) as w:
        x, y = w.buffer((2, 4)), w.buffer((2, 4))
        t = time.monotonic()
        with pytest.raises(pto.WorkerError, match="wait on signal") as info:
            w.run(lambda h, _: h.submit_group([0, 1], "waits_for_nobody", [pto.IN(x), pto.OUT(y)]))
        # The chip's own wait failed, naming what it waited on; not the host's backstop.
        assert time.monotonic() - t < 10
        assert "stopped answering" not in str(info.value)
        w.run(lambda h, _: h.submit_chip(0, "copy", [pto.IN(x[0]), pto.OUT(y[0])]))
