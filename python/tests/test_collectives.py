"""Collectives from Python against numpy goldens: every dtype and op, odd counts, 1 to 8 ranks,
on processes (the default) and threads; zero-copy where the array allows it; refusals of
read-only arrays and of ranks that pass different shapes (an error naming the ranks, not a
hang)."""

import pto  # first: the ranks fork, numpy's BLAS must stay single-threaded
import numpy as np
import pytest

DTYPES = ["float16", "float32", "float64", "int32", "int64"]
BACKENDS = ["shm", "local"]
RANKS = [1, 2, 3, 4, 8]


def inputs(rank, dtype, count=7):
    return ((np.arange(count) % 3) + rank + 1).astype(dtype)


GOLDEN = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", RANKS)
def test_allreduce_matches_numpy_for_every_dtype_and_op(backend, n):
    def body(c):
        got = {}
        for dt in DTYPES:
            for op in GOLDEN:
                if dt == "float16" and op == "prod":
                    continue  # overflows float16 at 8 ranks
                a = inputs(c.rank, dt)
                before = a.__array_interface__["data"][0]
                c.allreduce(a, op)
                assert a.__array_interface__["data"][0] == before  # in place
                got[(dt, op)] = a
        return got

    for got in pto.run_ranks(n, body, backend=backend):
        for (dt, op), a in got.items():
            want = GOLDEN[op](np.stack([inputs(r, "float64") for r in range(n)]), axis=0).astype(dt)
            assert a.dtype == np.dtype(dt)
            assert np.allclose(a.astype("float64"), want.astype("float64"), rtol=1e-3), (dt, op, a, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", RANKS)
def test_allgather_broadcast_and_all_to_all_match_numpy(backend, n):
    def body(c):
        r = c.rank
        a = (np.arange(5 * 3, dtype="int64").reshape(5, 3) + 100 * r).astype("float32")
        gathered = c.allgather(a)
        out = np.zeros((c.size, 5, 3), dtype="float32")
        c.allgather(a, out=out)
        b = np.arange(9, dtype="float64") * (r + 1)
        c.broadcast(b, root=c.size - 1)
        t = np.arange(2 * c.size, dtype="int32").reshape(c.size, 2) + 1000 * r
        x = c.all_to_all(t)
        strided = c.allgather(a[::2])  # not contiguous: copied, same result
        return gathered, out, b, x, strided

    for r, (gathered, out, b, x, strided) in enumerate(pto.run_ranks(n, body, backend=backend)):
        want = np.stack([(np.arange(15).reshape(5, 3) + 100 * k).astype("float32") for k in range(n)])
        assert np.array_equal(gathered, want) and np.array_equal(out, want)
        assert np.array_equal(strided, want[:, ::2])
        assert np.array_equal(b, np.arange(9, dtype="float64") * n)
        # Row s of rank r's result is row r of rank s's input.
        assert np.array_equal(x, np.stack([np.arange(2) + 2 * r + 1000 * s for s in range(n)]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_only_arrays_and_different_shapes_are_clear_errors(backend):
    def read_only(c):
        a = np.ones(4, dtype="float32")
        a.flags.writeable = False
        c.allreduce(a)

    with pytest.raises(ValueError, match="read-only"):
        pto.run_ranks(2, read_only, backend=backend)

    def shapes(c):
        c.allreduce(np.ones(4 + c.rank, dtype="float32"))

    with pytest.raises(pto.CommError, match="allreduce: the ranks passed different arguments") as info:
        pto.run_ranks(3, shapes, backend=backend)
    assert "rank 0: 16 bytes of f32" in str(info.value) and "rank 2: 24 bytes" in str(info.value)

    def ops(c):
        c.allreduce(np.ones(4, dtype="float32"), "max" if c.rank == 1 else "sum")

    with pytest.raises(pto.CommError, match="op max"):
        pto.run_ranks(3, ops, backend=backend)


def test_ranks_on_processes_run_in_parallel_and_return_their_values():
    import os

    pids = pto.run_ranks(4, lambda c: (c.rank, os.getpid()))
    assert [r for r, _ in pids] == [0, 1, 2, 3]
    assert len({p for _, p in pids}) == 4 and os.getpid() not in {p for _, p in pids}
    with pytest.raises(ValueError, match="backend"):
        pto.run_ranks(2, lambda c: None, backend="mpi")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", RANKS)
def test_reduce_scatter_matches_numpy_for_every_dtype_and_op(backend, n):
    def body(c):
        got = {}
        for dt in DTYPES:
            for op in GOLDEN:
                if dt == "float16" and op == "prod":
                    continue
                a = inputs(c.rank, dt, count=3 * c.size).reshape(c.size, 3)  # odd blocks
                a.flags.writeable = False  # the input is only read
                got[(dt, op)] = c.reduce_scatter(a, op)
        out = np.empty((1, 3), dtype="float32")
        c.reduce_scatter(inputs(c.rank, "float32", count=3 * c.size).reshape(c.size, 3), out=out)
        got["out"] = out
        return got

    for r, got in enumerate(pto.run_ranks(n, body, backend=backend)):
        for key, a in got.items():
            dt, op = ("float32", "sum") if key == "out" else key
            full = GOLDEN[op](np.stack([inputs(k, "float64", count=3 * n) for k in range(n)]), axis=0)
            want = full.reshape(n, 3)[r : r + 1].astype(dt)
            assert a.dtype == np.dtype(dt) and a.shape == (1, 3)
            assert np.allclose(a.astype("float64"), want.astype("float64"), rtol=1e-3), (key, a, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_allreduce_and_reduce_scatter(backend):
    ml_dtypes = pytest.importorskip("ml_dtypes")

    def body(c):
        a = (np.arange(6) + c.rank).astype(ml_dtypes.bfloat16)
        c.allreduce(a)
        b = c.reduce_scatter((np.arange(2 * c.size) * (c.rank + 1)).astype(ml_dtypes.bfloat16), "max")
        return a, b

    for r, (a, b) in enumerate(pto.run_ranks(3, body, backend=backend)):
        assert a.dtype == np.dtype(ml_dtypes.bfloat16)
        assert np.array_equal(a.astype("float32"), 3 * np.arange(6) + 3)
        assert np.array_equal(b.astype("float32"), 3 * np.arange(2 * r, 2 * r + 2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_reduce_scatter_refuses_blocks_that_do_not_split_and_different_shapes(backend):
    def uneven(c):
        c.reduce_scatter(np.ones(5, dtype="float32"))

    with pytest.raises(ValueError, match="multiple of the rank count"):
        pto.run_ranks(2, uneven, backend=backend)

    def shapes(c):
        c.reduce_scatter(np.ones(3 * (2 + c.rank), dtype="float32"))

    with pytest.raises(pto.CommError, match="reduce_scatter: the ranks passed different") as info:
        pto.run_ranks(3, shapes, backend=backend)
    assert "rank 0: 24 bytes of float32" in str(info.value) and "rank 2: 48 bytes" in str(info.value)

    with pytest.raises(TypeError, match="bool"):
        pto.run_ranks(1, lambda c: c.reduce_scatter(np.ones(2, dtype=bool)), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_window_puts_notifies_waits_and_views_without_copies(backend, n):
    def body(c):
        w = c.window("x", (2, 3), "float64", signals=2)
        assert w.local.shape == (2, 3) and w.dtype == np.float64 and not w.local.any()
        w.barrier()  # every rank looked at its zeroed buffer before anyone puts
        right = (c.rank + 1) % c.size
        # A put into the right neighbour, then its signal 0.
        w.put(right, np.full(6, c.rank, dtype=np.float64).reshape(2, 3))
        w.notify(right, 0)
        seen = w.wait_until(0, 1)
        ring = w.local.copy()
        # The view is the buffer itself: a write through it is what get reads.
        w.local[1, 2] = 100 + c.rank
        w.barrier()
        left = (c.rank - 1) % c.size
        got = w.get(left, offset=5, count=1)
        peer = w.view(left)[1, 2]
        # Signals set by value, read back.
        w.notify(right, 1, value=7, op="set")
        w.wait_until(1, 7)
        return seen, ring, got, peer, w.signal(1)

    for r, (seen, ring, got, peer, sig) in enumerate(pto.run_ranks(n, body, backend=backend)):
        left = (r - 1) % n
        assert seen == 1 and sig == 7
        assert np.array_equal(ring, np.full((2, 3), left, dtype=np.float64))
        assert got.tolist() == [100 + left] and peer == 100 + left


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_bad_arguments_are_clear_errors(backend):
    def bad_rank(c):
        c.window("x", 4).put(c.size, np.ones(4, np.float32))

    with pytest.raises(ValueError, match="rank 2 out of range"):
        pto.run_ranks(2, bad_rank, backend=backend)

    def too_long(c):
        c.window("x", 4).put(0, np.ones(5, np.float32), offset=0)

    with pytest.raises(ValueError, match="5 element\\(s\\) at offset 0 do not fit buffer 'x' of 4"):
        pto.run_ranks(2, too_long, backend=backend)

    def bad_signal(c):
        c.window("x", 4, signals=1).wait_until(1, 1)

    with pytest.raises(ValueError, match="signal 1 out of range"):
        pto.run_ranks(1, bad_signal, backend=backend)

    with pytest.raises(ValueError, match="no elements"):
        pto.run_ranks(1, lambda c: c.window("x", 0), backend=backend)
    with pytest.raises(ValueError, match="unknown dtype"):
        pto.run_ranks(1, lambda c: c.window("x", 4, "complex7"), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [2, 3])
def test_large_allreduce_reads_peers_buffers_directly(backend, n):
    # 2 MiB and an odd count: the single-copy algorithm on processes (cross-memory attach) and
    # on threads; bit-identical on every rank, equal to numpy's rank-order sum.
    count = (1 << 19) + 3

    def body(c):
        a = ((np.arange(count) * 7 + c.rank * 13) % 101).astype(np.float32) * np.float32(0.37)
        c.allreduce(a)
        return a

    got = pto.run_ranks(n, body, backend=backend)
    want = np.zeros(count, np.float32)
    for r in range(n):
        want = want + ((np.arange(count) * 7 + r * 13) % 101).astype(np.float32) * np.float32(0.37)
    for a in got:
        assert np.array_equal(a, got[0]) and np.allclose(a, want, rtol=1e-5)


def test_a_rank_that_dies_is_named_by_its_peers_within_a_second():
    # Rank 1 dies without a word (SIGKILL) while the others wait in an allreduce: the parent's
    # watcher publishes the death, and every survivor's wait ends naming rank 1, fast.
    import os
    import signal
    import time

    def body(c):
        if c.rank == 1:
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGKILL)
        t = time.monotonic()
        try:
            c.allreduce(np.ones(4, np.float32))
        except pto.CommError as e:
            return (time.monotonic() - t, str(e))
        return (None, "no error")

    t = time.monotonic()
    with pytest.raises(pto.PtoError) as info:
        pto.run_ranks(4, body)
    # The survivors return only once their allreduce failed (else: the 30 s deadline).
    assert time.monotonic() - t < 2
    assert "rank 1" in str(info.value), str(info.value)


@pytest.mark.parametrize("backend", ["shm", "local"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_keep_nans_whichever_rank_holds_them(backend, op):
    def body(c):
        a = np.ones(300, np.float32) * c.rank
        a[c.rank :: 3] = np.nan
        return c.allreduce(a, op)

    got = pto.run_ranks(3, body, backend=backend)
    # Every element is NaN on some rank: numpy's maximum/minimum keep NaNs.
    assert all(np.isnan(r).all() for r in got)


def test_window_arguments_of_the_wrong_kind_or_range_are_named():
    def body(c):
        errors = []
        for call in (
            lambda: c.window("a", 2.5),
            lambda: c.window("a", True),
            lambda: c.window(5, 4),
            lambda: c.window("a", 4, signals=1.5),
        ):
            try:
                call()
            except TypeError as e:
                errors.append(str(e))
        w = c.window("w", 4)
        for call in (
            lambda: w.notify(0, value=-1),
            lambda: w.notify(0, value=2**40, op="set"),
            lambda: w.get(0, count=-1),
            lambda: w.put(0, np.ones(1, np.float32), offset=2**62),
        ):
            try:
                call()
            except ValueError as e:
                errors.append(str(e))
        return errors

    got = pto.run_ranks(1, body, backend="local")[0]
    assert len(got) == 8, got
    assert any("shape" in e for e in got[:2]) and "name" in got[2] and "signals" in got[3]
    assert "value -1 out of range" in got[4] and "count -1" in got[6] and "offset" in got[7]
