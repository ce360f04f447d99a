"""Bad arguments: every one is refused up front with the right exception type and a message
that names the argument (and its allowed range); none panics the Rust side or hangs. Read-only
arrays are refused wherever pto writes."""

import math
import os
import subprocess
import sys

import pto  # first: the Worker forks, numpy's BLAS must stay single-threaded
import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided


def _no_panic(excinfo):
    assert "PanicException" not in type(excinfo.value).__name__


# --- Worker(...) --------------------------------------------------------------------------------

BAD_WORKER_ARGS = [
    (dict(chips=0), ValueError, "chips must be an int from 1 to 1024, got 0"),
    (dict(chips=-1), ValueError, "chips must be an int from 1 to 1024, got -1"),
    (dict(chips=10**6), ValueError, "chips .* got 1000000"),
    (dict(chips=2**70), ValueError, "chips .* beyond the 64-bit range"),
    (dict(chips=1.5), TypeError, "chips must be an int .*float"),
    (dict(chips="2"), TypeError, "chips must be an int .*str"),
    (dict(chips=True), TypeError, "chips must be an int .*bool"),
    (dict(chips=None), TypeError, "chips must be an int"),
    (dict(cores=(0, 0)), ValueError, "cores must give a chip at least one core"),
    (dict(cores=(-1, 2)), ValueError, r"cores\[0\] \(AIC cores\) must be an int from 0 to 1024, got -1"),
    (dict(cores=(1, 10**9)), ValueError, r"cores\[1\] \(AIV cores\) must be an int from 0 to 2048"),
    (dict(cores=(1,)), ValueError, r"cores must be a pair \(AIC, AIV\)"),
    (dict(cores=3), TypeError, "cores .* must be a list or a tuple, not int"),
    (dict(cores=("a", 1)), TypeError, r"cores\[0\] .* not str"),
    (dict(cores=(1.0, 2)), TypeError, r"cores\[0\] .* not float"),
    (dict(sub_workers=-1), ValueError, "sub_workers must be an int from 0 to 1024, got -1"),
    (dict(sub_workers=10**9), ValueError, "sub_workers must be an int from 0 to 1024"),
    (dict(sub_workers=0.5), TypeError, "sub_workers must be an int"),
    (dict(buffers="abc"), TypeError, "buffers must be a list or a tuple, not str"),
    (dict(buffers=[("x",)]), ValueError, r"buffers\[0\] must be \(name, dtype, count\), not 1 items"),
    (dict(buffers=[("x", "float32", -1)]), ValueError, r"buffers\[0\] count .* got -1"),
    (dict(buffers=[("x", "float32", 0)]), ValueError, r"buffers\[0\] count .* got 0"),
    (dict(buffers=[("x", "float32", 2**62)]), ValueError, r"buffers\[0\] count \(f32 elements\) must be an int from 1 to 274877906944, got"),
    (dict(buffers=[("x", "float32", 2**70)]), ValueError, r"buffers\[0\] count .* beyond the 64-bit range"),
    (dict(buffers=[("x", "float32", 4.0)]), TypeError, r"buffers\[0\] count .* not float"),
    (dict(buffers=[("x", "nope", 4)]), ValueError, r"buffers\[0\] dtype: unknown dtype 'nope' \(use one of"),
    (dict(buffers=[("x", 7, 4)]), TypeError, r"buffers\[0\] dtype must be a str"),
    (dict(buffers=[(1, "float32", 4)]), TypeError, r"buffers\[0\] name must be a str, not int"),
    (dict(buffers=[("", "float32", 4)]), ValueError, r"buffers\[0\] name must have 1 to 255 characters"),
    (dict(buffers=[("x", "float32", 4), ("x", "int32", 4)]), ValueError, r"buffers\[1\]: buffer name 'x' is used twice"),
    (dict(buffers=[("x", "float64", 2**36), ("y", "float64", 2**36 + 1)]), ValueError, "the window would take 1099511627784 bytes per chip, more than the 1099511627776 maximum"),
    (dict(collectives=0), ValueError, r"collectives \(staging bytes\) must be an int from 1 to 274877890560, got 0"),
    (dict(collectives=2**40), ValueError, r"collectives \(staging bytes\) must be an int from 1 to 274877890560, got 1099511627776"),
    (dict(collectives=-5), ValueError, "collectives .* got -5"),
    (dict(collectives=2**80), ValueError, "collectives .* beyond the 64-bit range"),
    (dict(collectives="1k"), TypeError, "collectives .* not str"),
    (dict(comm=1), TypeError, "comm must be True or False, not int"),
    (dict(comm="yes"), TypeError, "comm must be True or False, not str"),
    (dict(subs=[print]), TypeError, r"subs must be a dict \{name: callable\}, not list"),
    (dict(subs={"a": 3}), TypeError, r"subs\['a'\] must be callable, not int"),
    (dict(subs={1: print}), TypeError, "subs: every key .* must be a str, not int"),
    (dict(subs={"": print}), ValueError, "subs: a name is empty"),
    (dict(timeout=-1), ValueError, "timeout must be a number of seconds above 0 and at most 1e9, got -1"),
    (dict(timeout=0), ValueError, "timeout must be .* got 0"),
    (dict(timeout=math.nan), ValueError, "timeout must be .* got nan"),
    (dict(timeout=math.inf), ValueError, "timeout must be .* got inf"),
    (dict(timeout=1e300), ValueError, r"timeout must be .* got 1e\+300"),
    (dict(timeout=10**400), ValueError, "timeout must be .* huge int"),
    (dict(timeout=5e-324), ValueError, r"timeout must be .* got 5e-324 \(rounds to 0\)"),
    (dict(buffers=[("x", "i8", 4)]), ValueError, r"buffers\[0\] dtype: 'i8' is ambiguous: numpy reads it as int64, pto as int8"),
    (dict(timeout="1"), TypeError, "timeout must be a number of seconds .* not str"),
    (dict(timeout=True), TypeError, "timeout must be .* not a bool"),
]


@pytest.mark.parametrize("kwargs,exc,match", BAD_WORKER_ARGS, ids=[str(a[0])[:60] for a in BAD_WORKER_ARGS])
def test_bad_worker_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match) as info:
        pto.Worker(**kwargs)
    _no_panic(info)


def test_numpy_integers_are_counts():
    with pto.Worker(chips=np.int64(1), cores=(np.int32(1), 1), sub_workers=np.uint8(0),
                    buffers=[("x", np.float32, np.int64(4))], timeout=np.float64(30.0)) as w:
        assert w.chips == 1
        assert w.chip_context(np.int64(0))["buffers"][0][:3] == ("x", "float32", 4)


def test_a_window_beyond_dev_shm_is_a_worker_error_not_a_crash():
    # Accepted by the checks (a window of 512 GiB, under the 1 TiB maximum), but no /dev/shm
    # holds it: the chip's bring-up fails, named.
    with pytest.raises(pto.WorkerError, match="chip 0") as info:
        pto.Worker(chips=1, buffers=[("x", "float32", 2**37)], timeout=20)
    _no_panic(info)


# --- Worker.buffer --------------------------------------------------------------------------------

BAD_BUFFERS = [
    ((-1,), ValueError, r"shape\[0\] must be an int from 1 to .*, got -1"),
    ((0,), ValueError, r"shape\[0\] must be an int from 1 to .*, got 0"),
    (((2, -3),), ValueError, r"shape\[1\] .* got -3"),
    (((),), ValueError, "shape must have 1 to 5 dimensions, got 0"),
    (((1,) * 6,), ValueError, "shape must have 1 to 5 dimensions, got 6"),
    ((2**62,), ValueError, r"shape\[0\] must be an int from 1 to"),
    (((2**31, 2**31),), ValueError, r"Worker.buffer: shape \(2147483648, 2147483648\) of f32 takes more than"),
    ((2**70,), ValueError, "beyond the 64-bit range"),
    (("abc",), TypeError, "shape must be a list or a tuple, not str"),
    ((2.5,), TypeError, "shape must be a list or a tuple, not float"),
    ((None,), TypeError, "shape must be a list or a tuple, not NoneType"),
    (([1.5],), TypeError, r"shape\[0\] must be an int .* not float"),
    ((4, "complex128"), ValueError, "unknown dtype 'complex128'"),
    ((4, "nope"), ValueError, "unknown dtype 'nope'"),
    ((4, 3), TypeError, "dtype must be a str, not int"),
    ((4, "bf16"), ValueError, "dtype bf16 has no numpy equivalent"),
    ((4, "u8"), ValueError, "Worker.buffer: dtype: 'u8' is ambiguous: numpy reads it as uint64, pto as uint8"),
    ((4, "f16"), ValueError, "'f16' is ambiguous: numpy reads it as float128, pto as float16"),
    ((4, object), ValueError, "unknown dtype 'object'"),
]


@pytest.fixture(scope="module")
def worker():
    bufs = [("scratch", "float32", 64)]
    with pto.Worker(chips=2, sub_workers=1, subs={"noop": lambda *a: None}, buffers=bufs) as w:
        yield w


@pytest.mark.parametrize("args,exc,match", BAD_BUFFERS, ids=[repr(a[0])[:50] for a in BAD_BUFFERS])
def test_bad_buffers(worker, args, exc, match):
    with pytest.raises(exc, match=match) as info:
        worker.buffer(*args)
    _no_panic(info)


def test_buffer_shapes_and_dtypes_that_are_fine(worker):
    assert worker.buffer(np.int64(3)).shape == (3,)
    assert worker.buffer(range(1, 4)).shape == (1, 2, 3)
    assert worker.buffer(4, "i16").dtype == np.int16  # pto's names
    assert worker.buffer(4, "f32").dtype == np.float32
    assert worker.buffer(4, "<f8").dtype == np.float64  # numpy's spellings
    assert worker.buffer(4, np.uint8).dtype == np.uint8
    assert worker.buffer([2, 3], np.int16).dtype == np.int16
    assert worker.buffer((1, 1, 1, 1, 1), "f64").shape == (1, 1, 1, 1, 1)


def test_a_buffer_beyond_dev_shm_is_a_worker_error(worker):
    with pytest.raises(pto.WorkerError) as info:
        # 64 TiB of float32 (each dimension below 2**32): accepted by the checks, refused by
        # /dev/shm.
        worker.buffer((2**22, 2**22))
    _no_panic(info)


def test_one_dimension_beyond_32_bits_is_a_value_error(worker):
    with pytest.raises(ValueError, match=r"shape\[0\] must be an int from 1 to 4294967295"):
        worker.buffer(2**32)


# --- submissions ----------------------------------------------------------------------------------


def _bad_submissions(a, ro):
    return [
        (lambda h: h.submit_chip(-1, "vector_scale", []), ValueError, r"submit_chip: chip \(the Worker has 2 chips\) must be an int from 0 to 1, got -1"),
        (lambda h: h.submit_chip(5, "vector_scale", []), ValueError, "must be an int from 0 to 1, got 5"),
        (lambda h: h.submit_chip("0", "vector_scale", []), TypeError, "chip .* not str"),
        (lambda h: h.submit_chip(1.0, "vector_scale", []), TypeError, "chip .* not float"),
        (lambda h: h.submit_chip(True, "vector_scale", []), TypeError, "chip .* not a bool"),
        (lambda h: h.submit_chip(0, "no_such_program", []), ValueError, "unknown chip program 'no_such_program'"),
        (lambda h: h.submit_chip(0, 3, []), TypeError, "submit_chip: program must be a str, not int"),
        (lambda h: h.submit_chip(0, "vector_scale", "abc"), TypeError, "submit_chip: args must be a list or a tuple, not str"),
        (lambda h: h.submit_chip(0, "vector_scale", 3), TypeError, "args must be a list or a tuple, not int"),
        (lambda h: h.submit_chip(0, "vector_scale", [a]), TypeError, r"args\[0\] is a bare array: wrap it as pto.IN"),
        (lambda h: h.submit_chip(0, "vector_scale", [pto.IN([1.0, 2.0])]), TypeError, r"args\[0\] \(IN\) must be a numpy array from Worker.buffer\(\) .* not list"),
        (lambda h: h.submit_chip(0, "vector_scale", [pto.IN(np.zeros(8, np.float32))]), TypeError, "not in a Worker's shared memory"),
        (lambda h: h.submit_chip(0, "vector_scale", [("sideways", a)]), ValueError, "unknown argument mode 'sideways'"),
        (lambda h: h.submit_chip(0, "vector_scale", [("in", a, 1)]), TypeError, r"args\[0\] must be pto.IN\(array\).* not a tuple of 3 items"),
        (lambda h: h.submit_chip(0, "vector_scale", [pto.IN(a), True]), TypeError, r"args\[1\] is a bool"),
        (lambda h: h.submit_chip(0, "vector_scale", [pto.IN(a), 2**70]), ValueError, r"args\[1\]: the int is outside the 64-bit range"),
        (lambda h: h.submit_chip(0, "vector_scale", [pto.IN(a), 1 + 2j]), TypeError, r"args\[1\] must be .* not complex"),
        (lambda h: h.submit_chip(0, "vector_scale", [pto.IN(a), "2.0"]), TypeError, r"args\[1\] must be .* not str"),
        (lambda h: h.submit_chip(0, "vector_scale", [pto.OUT(a[::-1])]), ValueError, r"args\[0\] \(OUT\) has strides \(-4,\) \(bytes\), .*\(reversed or broadcast views are not supported\)"),
        (lambda h: h.submit_chip(0, "vector_scale", [pto.IN(np.broadcast_to(a[:1], (8,)))]), ValueError, "strides"),
        (lambda h: h.submit_chip(0, "vector_scale", [pto.IN(a[2:2])]), ValueError, r"args\[0\] \(IN\) is empty"),
        (lambda h: h.submit_chip(0, "vector_scale", [pto.IN(a.view(np.complex64))]), TypeError, "dtype complex64, which pto does not support"),
        (lambda h: h.submit_chip(0, "vector_scale", [pto.IN(a.view(">f4"))]), TypeError, "not a little-endian"),
        (lambda h: h.submit_chip(0, "vector_scale", [pto.IN(as_strided(a, shape=(1 << 20,), strides=(4,)))]), ValueError, r"args\[0\] \(IN\): "),
        (lambda h: h.submit_chip(0, "vector_scale", [pto.OUT(ro)]), ValueError, r"submit_chip: args\[0\] \(OUT\) is a read-only array"),
        (lambda h: h.submit_chip(0, "vector_scale", [pto.IN(a), pto.INOUT(ro)]), ValueError, r"args\[1\] \(INOUT\) is a read-only array"),
        (lambda h: h.submit_group([], "vector_scale", []), ValueError, "submit_group: chips must list at least one chip"),
        (lambda h: h.submit_group([0, 0], "vector_scale", []), ValueError, "chips lists chip 0 twice"),
        (lambda h: h.submit_group([0, 9], "vector_scale", []), ValueError, r"chips\[1\] .* got 9"),
        (lambda h: h.submit_group(0, "vector_scale", []), TypeError, "submit_group: chips must be a list or a tuple, not int"),
        (lambda h: h.submit_group([0, 1], "nope", []), ValueError, "unknown chip program 'nope'"),
        (lambda h: h.submit_group([0, 1], "vector_scale", [pto.OUT(ro)]), ValueError, r"submit_group: args\[0\] \(OUT\) is a read-only"),
        (lambda h: h.submit_sub("nope", []), ValueError, r"no sub-worker callable 'nope' \(the Worker's subs: noop\)"),
        (lambda h: h.submit_sub(3, []), TypeError, "submit_sub: name must be a str, not int"),
        (lambda h: h.submit_sub("noop", [pto.OUT(ro)]), ValueError, r"submit_sub: args\[0\] \(OUT\) is a read-only"),
    ]


def test_bad_submissions(worker):
    a = worker.buffer(8)
    ro = worker.buffer(8)
    ro.setflags(write=False)
    for i, (orch, exc, match) in enumerate(_bad_submissions(a, ro)):
        with pytest.raises(exc, match=match) as info:
            worker.run(lambda h, _: orch(h))
        _no_panic(info)
    # Nothing of that broke the Worker.
    b = worker.buffer(8)
    a[:] = 2.0
    worker.run(lambda h, _: h.submit_chip(1, "vector_scale", [pto.IN(a), pto.OUT(b), 3.0]))
    np.testing.assert_array_equal(b, np.full(8, 6.0))


def test_read_only_arrays_are_fine_as_inputs(worker):
    a, b = worker.buffer(8), worker.buffer(8)
    a[:] = np.arange(8)
    a.setflags(write=False)
    worker.run(lambda h, _: h.submit_chip(0, "vector_scale", [pto.IN(a), pto.OUT(b), 2.0]))
    np.testing.assert_array_equal(b, 2 * np.arange(8))
    # A read-only view of a writable buffer is refused as an output, the buffer itself is not.
    v = b[:4]
    v.setflags(write=False)
    with pytest.raises(ValueError, match=r"\(OUT\) is a read-only array"):
        worker.run(lambda h, _: h.submit_chip(0, "vector_scale", [pto.IN(a[:4]), pto.OUT(v), 1.0]))
    worker.run(lambda h, _: h.submit_chip(0, "vector_scale", [pto.IN(a[:4]), pto.OUT(b[:4]), 1.0]))
    np.testing.assert_array_equal(b[:4], np.arange(4))


def test_sub_without_sub_workers_is_refused():
    # In a process of its own: this module's Worker (a fixture) is alive, and a process with a
    # Worker has threads, so it cannot fork another.
    code = (
        "import pto\n"
        "with pto.Worker(chips=1, subs={'f': lambda *a: None}) as w:\n"
        "    try:\n"
        "        w.run(lambda h, _: h.submit_sub('f', []))\n"
        "    except ValueError as e:\n"
        "        print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "needs a sub-worker process, and the Worker has none" in r.stdout, r.stdout + r.stderr


def test_bad_run_arguments(worker):
    with pytest.raises(TypeError, match="orch_fn must be callable"):
        worker.run(3)
    with pytest.raises(TypeError, match="trace must be a path"):
        worker.run(lambda h, _: None, trace=123)
    with pytest.raises(ValueError, match="trace: .* is not in an existing directory"):
        worker.run(lambda h, _: None, trace="/nonexistent/dir/run.json")


def test_bad_chip_context(worker):
    with pytest.raises(ValueError, match=r"chip_context: i \(the Worker has 2 chips\) must be an int from 0 to 1, got -1"):
        worker.chip_context(-1)
    with pytest.raises(ValueError, match="got 3"):
        worker.chip_context(3)
    with pytest.raises(TypeError, match="not str"):
        worker.chip_context("0")


def test_the_recorder_refuses_submissions_after_its_run(worker):
    kept = []
    worker.run(lambda h, _: kept.append(h))
    with pytest.raises(pto.WorkerError, match="already run"):
        kept[0].submit_chip(0, "vector_scale", [])


# --- run_ranks and collectives --------------------------------------------------------------------

BAD_RANKS = [
    (0, ValueError, r"n \(ranks\) must be an int from 1 to 256, got 0"),
    (-1, ValueError, "got -1"),
    (257, ValueError, "got 257"),
    (10**30, ValueError, "beyond the 64-bit range"),
    (2.0, TypeError, "not float"),
    ("2", TypeError, "not str"),
    (True, TypeError, "not a bool"),
]


@pytest.mark.parametrize("n,exc,match", BAD_RANKS)
def test_bad_rank_counts(n, exc, match):
    with pytest.raises(exc, match=match) as info:
        pto.run_ranks(n, lambda c: None)
    _no_panic(info)


def test_run_ranks_needs_a_callable():
    with pytest.raises(TypeError, match="fn must be callable"):
        pto.run_ranks(2, 3)
    with pytest.raises(TypeError, match="f must be callable"):
        pto._native.run_ranks(2, 3)


def _on_every_rank(n, body, exc, match):
    """Runs body on n ranks: it must raise exc (matching) on the rank raised first."""
    with pytest.raises(exc, match=match) as info:
        pto.run_ranks(n, body)
    _no_panic(info)
    return info.value


BAD_COLLECTIVES = [
    (lambda c: c.allreduce([1.0, 2.0]), TypeError, "comm.allreduce: a must be a numpy array, not list"),
    (lambda c: c.allreduce(np.ones(4), op="avg"), ValueError, "op: unknown reduction 'avg'"),
    (lambda c: c.allreduce(np.ones(4), op=3), TypeError, "op must be a str, not int"),
    (lambda c: c.allreduce(np.ones(4, np.complex64)), TypeError, "comm.allreduce supports float16, bfloat16, float32, float64, int32 and int64 arrays, not complex64"),
    (lambda c: c.allreduce(np.ones(4, np.int8)), TypeError, "comm.allreduce supports float16, bfloat16, float32, float64, int32 and int64 arrays, not int8"),
    (lambda c: c.allreduce(np.ones(4 + c.rank)), pto.CommError, "allreduce: the ranks passed different arguments .*rank 0: 32 bytes of f64, op sum; rank 1: 40 bytes"),
    (lambda c: c.allreduce(np.ones(4), op=["sum", "max"][c.rank]), pto.CommError, "the ranks passed different arguments"),
    (lambda c: c.allreduce(np.ones(4, [np.float32, np.int32][c.rank])), pto.CommError, "of f32.*of i32"),
    (lambda c: c.broadcast(np.ones(4), root=-1), ValueError, r"broadcast: root \(a rank of 2\) must be an int from 0 to 1, got -1"),
    (lambda c: c.broadcast(np.ones(4), root=5), ValueError, "got 5"),
    (lambda c: c.broadcast(np.ones(4), root="0"), TypeError, "root .* not str"),
    (lambda c: c.broadcast(np.ones(4), root=c.rank), pto.CommError, "broadcast: the ranks passed different arguments"),
    (lambda c: c.broadcast(np.ones(2 + c.rank)), pto.CommError, "16 bytes from root 0.*24 bytes from root 0"),
    (lambda c: c.allgather("abc"), TypeError, "comm.allgather: a must be a numpy array, not str"),
    (lambda c: c.allgather(np.ones(1 + c.rank)), pto.CommError, "allgather: the ranks passed different arguments"),
]


@pytest.mark.parametrize("body,exc,match", BAD_COLLECTIVES)
def test_bad_collective_arguments(body, exc, match):
    _on_every_rank(2, body, exc, match)


def _readonly(a):
    a.setflags(write=False)
    return a


def test_read_only_arrays_are_refused_as_collective_outputs():
    e = _on_every_rank(2, lambda c: c.allreduce(_readonly(np.ones(4))), ValueError,
                       "comm.allreduce: a is a read-only array")
    assert e.rank in (0, 1)
    # Broadcast writes on every rank but the root.
    e = _on_every_rank(3, lambda c: c.broadcast(_readonly(np.ones(4)) if c.rank == 2 else np.ones(4), root=0),
                       ValueError, "comm.broadcast: a is a read-only array")
    assert e.rank == 2


def test_read_only_arrays_are_fine_as_collective_inputs():
    def body(c):
        mine = _readonly(np.full(3, float(c.rank)))
        g = c.allgather(mine)
        src = _readonly(np.arange(3.0)) if c.rank == 1 else np.zeros(3)
        c.broadcast(src, root=1)
        return g, src

    for g, src in pto.run_ranks(3, body):
        np.testing.assert_array_equal(g, [[0.0] * 3, [1.0] * 3, [2.0] * 3])
        np.testing.assert_array_equal(src, np.arange(3.0))


def test_collectives_larger_than_the_staging_area():
    def body(c):
        x = np.full(300_000, float(c.rank + 1))  # 2.4 MB: more than the 1 MiB staging
        c.allreduce(x)
        return x[:3], x[-1]

    for head, last in pto.run_ranks(3, body):
        assert list(head) == [6.0] * 3 and last == 6.0


# --- environment ----------------------------------------------------------------------------------


@pytest.mark.parametrize("var,value", [
    ("PTO_WAIT_TIMEOUT_MS", "abc"),
    ("PTO_WAIT_TIMEOUT_MS", "-5"),
    ("PTO_WAIT_TIMEOUT_MS", "99999999999999999999999"),
    ("PTO_STALL_TIMEOUT_MS", "0"),
    ("PTO_RING_TASK_WINDOW", "0"),
    ("PTO_THREADS", "0"),
    ("PTO_SPIN_US", "-1"),
])
def test_bad_environment_values_are_refused_naming_them(var, value):
    code = (
        "import pto, numpy as np\n"
        "try:\n"
        "    with pto.Worker(chips=1, timeout=20) as w:\n"
        "        a, b = w.buffer(4), w.buffer(4)\n"
        "        w.run(lambda h, _: h.submit_chip(0, 'vector_scale', [pto.IN(a), pto.OUT(b), 1.0]))\n"
        "    print('ran')\n"
        "except pto.PtoError as e:\n"
        "    print('refused:', e)\n"
    )
    env = dict(os.environ, **{var: value})
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PanicException" not in r.stderr and "panicked" not in r.stderr, r.stderr
    # Every value above is outside its variable's range: refused, naming the variable.
    assert r.stdout.startswith("refused:"), r.stdout
    assert var in r.stdout, r.stdout


# --- lifecycle ------------------------------------------------------------------------------------


def test_a_forked_child_can_neither_run_nor_close_the_parents_worker():
    code = (
        "import os, pto, numpy as np\n"
        "w = pto.Worker(chips=1)\n"
        "a, b = w.buffer(4), w.buffer(4)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    try:\n"
        "        w.run(lambda h, _: None)\n"
        "    except pto.WorkerError as e:\n"
        "        print('child:', e, flush=True)\n"
        "    w.close()\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "a[:] = 1.0\n"
        "w.run(lambda h, _: h.submit_chip(0, 'vector_scale', [pto.IN(a), pto.OUT(b), 2.0]))\n"
        "print('parent:', b.tolist(), flush=True)\n"
        "w.close()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "child: this Worker belongs to process" in r.stdout, r.stdout
    assert "parent: [2.0, 2.0, 2.0, 2.0]" in r.stdout, r.stdout


def test_a_worker_is_usable_from_other_threads(worker):
    import threading

    a = worker.buffer(16)
    a[:] = 1.0
    outs = [worker.buffer(16) for _ in range(4)]
    errors = []

    def go(i):
        try:
            for _ in range(5):
                worker.run(lambda h, _: h.submit_chip(i % 2, "vector_scale", [pto.IN(a), pto.OUT(outs[i]), float(i)]))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    for i, o in enumerate(outs):
        np.testing.assert_array_equal(o, np.full(16, float(i)))
