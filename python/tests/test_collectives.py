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
