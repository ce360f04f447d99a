"""Exceptions and metadata: pto's exception classes pickle (they cross process boundaries),
`pto.__version__`, and `run_ranks` re-raising a rank's exception with its type, message and
rank."""

import importlib.metadata
import multiprocessing
import pickle
import subprocess
import sys
import time

import pto  # first: the Worker forks, numpy's BLAS must stay single-threaded
import numpy as np
import pytest

ERRORS = [pto.PtoError, pto.WorkerError, pto.CommError]


@pytest.mark.parametrize("cls", ERRORS)
def test_exceptions_pickle_with_type_and_message(cls):
    e = cls("chip 1 failed: kernel vector_add")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cls
    assert str(back) == "chip 1 failed: kernel vector_add"
    assert back.args == e.args
    assert isinstance(back, pto.PtoError)


def test_exception_hierarchy():
    assert issubclass(pto.WorkerError, pto.PtoError)
    assert issubclass(pto.CommError, pto.PtoError)
    assert issubclass(pto.PtoError, Exception)
    # The native module raises the same classes the package exports.
    assert pto._native.WorkerError is pto.WorkerError
    assert pto._native.CommError is pto.CommError
    assert pto._native.PtoError is pto.PtoError
    assert pto.WorkerError.__module__ == "pto"


def test_a_raised_error_pickles_with_its_attributes():
    w = pto.Worker(chips=1)
    w.close()
    with pytest.raises(pto.WorkerError) as info:
        w.buffer(4)
    info.value.detail = {"chip": 3}
    back = pickle.loads(pickle.dumps(info.value))
    assert type(back) is pto.WorkerError and "closed" in str(back)
    assert back.detail == {"chip": 3}


def test_errors_unpickle_in_a_fresh_process():
    blobs = [pickle.dumps(cls(f"message of {cls.__name__}")) for cls in ERRORS]
    code = (
        "import pickle, sys\n"
        "for b in sys.stdin.buffer.read().split(b'--sep--'):\n"
        "    e = pickle.loads(b)\n"
        "    print(type(e).__module__, type(e).__name__, e)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], input=b"--sep--".join(blobs), capture_output=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    assert lines == [f"pto {c.__name__} message of {c.__name__}" for c in ERRORS]


def _raise_in_pool(name):
    raise getattr(pto, name)(f"{name} from a pool process")


@pytest.mark.parametrize("name", ["PtoError", "WorkerError", "CommError"])
def test_errors_cross_a_multiprocessing_pool(name):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        res = pool.apply_async(_raise_in_pool, (name,))
        with pytest.raises(getattr(pto, name), match=f"{name} from a pool process"):
            res.get(timeout=60)


def test_version_is_the_package_version():
    assert pto.__version__ == "0.1.0"
    assert pto.__version__ == pto._native.__version__
    assert importlib.metadata.version("pto") == pto.__version__
    assert "__version__" in pto.__all__


# --- run_ranks exceptions ---------------------------------------------------------------------


def test_a_rank_exception_keeps_its_type_message_and_rank():
    def body(c):
        if c.rank == 2:
            raise ValueError("bad value on this rank")
        return c.rank

    with pytest.raises(ValueError) as info:
        pto.run_ranks(4, body, backend="local")
    e = info.value
    assert type(e) is ValueError
    assert str(e) == "rank 2: bad value on this rank"
    assert e.rank == 2
    assert type(e.__cause__) is ValueError and str(e.__cause__) == "bad value on this rank"
    # The original traceback (inside body) is on the cause.
    assert e.__cause__.__traceback__ is not None


def test_a_custom_exception_type_survives_run_ranks():
    class Mine(Exception):
        pass

    def body(c):
        if c.rank == 0:
            raise Mine("custom")

    with pytest.raises(Mine, match="^rank 0: custom$") as info:
        pto.run_ranks(2, body, backend="local")
    assert info.value.rank == 0


def test_an_exception_that_needs_more_arguments_is_raised_as_it_is():
    class Coded(Exception):
        def __init__(self, code, text):
            super().__init__(code, text)
            self.code = code

    def body(c):
        if c.rank == 1:
            raise Coded(7, "seven")

    with pytest.raises(Coded) as info:
        pto.run_ranks(2, body, backend="local")
    assert info.value.code == 7 and info.value.rank == 1
    notes = getattr(info.value, "__notes__", [])
    assert any("rank 1" in n for n in notes), notes


def test_the_first_rank_to_raise_is_raised_and_the_others_are_noted():
    def body(c):
        if c.rank == 3:
            raise KeyError("first")
        if c.rank == 1:
            time.sleep(0.3)
            raise RuntimeError("second")
        # The others wait in a collective: the first failure aborts it at once.
        c.barrier()

    t = time.monotonic()
    with pytest.raises(KeyError) as info:
        pto.run_ranks(4, body)
    assert time.monotonic() - t < 10, "peers waited for their deadline"
    e = info.value
    assert e.rank == 3 and "rank 3" in str(e) and "first" in str(e)
    notes = "\n".join(getattr(e, "__notes__", []))
    assert "rank 1 also failed: RuntimeError: second" in notes
    # Ranks 0 and 2 failed in the barrier, aborted by rank 3.
    assert "rank 0 also failed: CommError" in notes and "rank 2 also failed" in notes


def test_a_failing_rank_does_not_leave_peers_waiting_for_the_deadline():
    def body(c):
        if c.rank == 0:
            raise RuntimeError("early")
        x = np.ones(4)
        c.allreduce(x)
        return x

    t = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 0: early"):
        pto.run_ranks(3, body)
    assert time.monotonic() - t < 10


@pytest.mark.parametrize("backend", ["shm", "local"])
def test_a_rank_that_returned_is_named_as_exited_not_dead(backend):
    # Rank 1 returns without joining the barrier: rank 0's wait fails at once and says why.
    def body(c):
        if c.rank == 0:
            c.barrier()

    t = time.monotonic()
    with pytest.raises(pto.CommError, match="rank 0: rank 1 exited") as info:
        pto.run_ranks(2, body, backend=backend)
    assert "died" not in str(info.value)
    assert time.monotonic() - t < 10


def test_a_rank_busy_in_its_own_code_is_stopped_after_another_fails(monkeypatch):
    # Rank 0 never returns; rank 1's barrier times out: run_ranks raises soon after, having
    # stopped rank 0, instead of waiting for it forever.
    monkeypatch.setenv("PTO_WAIT_TIMEOUT_MS", "1000")

    def body(c):
        if c.rank == 0:
            while True:
                time.sleep(0.05)
        c.barrier()

    t = time.monotonic()
    with pytest.raises(pto.CommError, match="rank 1: barrier") as info:
        pto.run_ranks(2, body)
    assert time.monotonic() - t < 15
    assert "rank 0 was still running" in "".join(getattr(info.value, "__notes__", []))


def test_a_rank_that_dies_is_the_root_cause_with_its_signal():
    def body(c):
        if c.rank == 1:
            import ctypes
            import faulthandler

            faulthandler.disable()  # pytest's dump of the expected crash is noise here
            ctypes.string_at(0)  # SIGSEGV
        c.barrier()

    with pytest.raises(pto.PtoError, match="rank 1: died: killed by signal 11") as info:
        pto.run_ranks(3, body)
    assert info.value.rank == 1


def test_system_exit_on_a_rank_keeps_its_code():
    def body(c):
        if c.rank == 1:
            raise SystemExit(3)

    with pytest.raises(SystemExit) as info:
        pto.run_ranks(2, body)
    assert info.value.code == 3 and info.value.rank == 1


def test_a_rank_exception_pickles():
    def body(c):
        if c.rank == 1:
            raise pto.CommError("peer went away")

    with pytest.raises(pto.CommError) as info:
        pto.run_ranks(2, body)
    back = pickle.loads(pickle.dumps(info.value))
    assert type(back) is pto.CommError
    assert str(back) == "rank 1: peer went away" and back.rank == 1


def test_a_comm_used_after_run_ranks_is_refused():
    kept = []
    pto.run_ranks(2, lambda c: kept.append(c), backend="local")
    with pytest.raises(pto.CommError, match="run_ranks has returned"):
        kept[0].barrier()


def test_an_unprintable_rank_exception_is_still_raised():
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no text")

    def body(c):
        if c.rank == 0:
            raise Unprintable()
        time.sleep(0.1)
        raise Unprintable()

    with pytest.raises(Unprintable) as info:
        pto.run_ranks(2, body, backend="local")
    assert info.value.rank == 0


def test_on_processes_a_rank_exception_keeps_its_type_message_rank_and_traceback_text():
    def body(c):
        if c.rank == 1:
            raise ValueError("bad value on rank one")
        c.barrier()  # rank 0 is woken by rank 1's abort, not by its deadline

    with pytest.raises(ValueError, match="rank 1: bad value on rank one") as info:
        pto.run_ranks(2, body)
    e = info.value
    assert e.rank == 1 and type(e.__cause__) is ValueError
    notes = "\n".join(getattr(e.__cause__, "__notes__", []))
    assert "Traceback" in notes and "raise ValueError" in notes, notes


def test_on_processes_an_exception_that_cannot_be_pickled_comes_back_by_name():
    class Local(Exception):
        pass

    def body(c):
        raise Local("only in this process")

    with pytest.raises(pto.PtoError, match="Local: only in this process") as info:
        pto.run_ranks(2, body)
    assert info.value.rank in (0, 1)
