"""simpler's programs on pto, the way their users run them: drivers run by
``python -m pto.simpler``, a scene test by ``python -m pto.simpler pytest``. The kernels and
orchestrations are pto's own test programs in simpler's style (crates/pto-simpler/tests/programs:
plain C++ over pto's simpler headers, no pto-isa), so any C++17 compiler builds them (CXX=c++)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "crates" / "pto-simpler" / "tests" / "programs"
HERE = Path(__file__).resolve().parent / "simpler"

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux: chips are forked processes")


def _env(tmp_path, **extra):
    env = dict(os.environ)
    env.update(
        PTO_TEST_PROGRAMS=str(PROGRAMS),
        CXX=env.get("PTO_TEST_CXX", "c++"),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        PTO_WAIT_TIMEOUT_MS="20000",
    )
    env.pop("PTO_ISA_ROOT", None)
    env.update(extra)
    return env


def _run(tmp_path, *args, timeout=180, **env):
    return subprocess.run(
        [sys.executable, "-m", "pto.simpler", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(tmp_path, **env),
        cwd=tmp_path,
    )


def test_an_allreduce_driver_runs_unchanged_with_numpy_host_tensors(tmp_path):
    r = _run(tmp_path, HERE / "allreduce_driver.py", "-p", "a2a3sim", "-d", "0-1", "--runs", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 ranks matched golden" in r.stdout


def test_an_allreduce_driver_on_four_chips_with_torch_shared_tensors(tmp_path):
    pytest.importorskip("torch", reason="the scripts/test.sh venv installs torch")
    r = _run(tmp_path, HERE / "allreduce_driver.py", "-p", "a2a3sim", "-d", "0-3", "--torch")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 ranks matched golden" in r.stdout


def test_group_members_writing_rows_of_one_output_run_together(tmp_path):
    # The members wait for each other inside the kernel: had one waited for the other's write
    # of the shared output to finish, the kernel would give up after 20 s.
    r = _run(tmp_path, HERE / "allreduce_driver.py", "-p", "a2a3sim", "-d", "0-2", "--one-output")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 ranks matched golden" in r.stdout


def test_each_chip_runs_its_tasks_in_submission_order_and_groups_reserve_only_their_chips(tmp_path):
    # As simpler's group_reservation scene: a single task waits behind a group on its chip, and
    # a group member that waits does not hold up an unrelated chip.
    r = _run(tmp_path, HERE / "reserve_driver.py")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every task ran in its chip's order" in r.stdout


@pytest.mark.parametrize(
    "driver, args, said",
    [
        ("allreduce_driver.py", ["-d", "0-3"], "4 ranks matched golden"),
        ("chain_driver.py", [], "the sub-worker checked every z"),
        ("reserve_driver.py", [], "every task ran in its chip's order"),
    ],
)
def test_chips_as_threads_with_pto_simpler_backend_local(tmp_path, driver, args, said):
    r = _run(tmp_path, HERE / driver, *args, PTO_SIMPLER_BACKEND="local")
    assert r.returncode == 0, r.stdout + r.stderr
    assert said in r.stdout + r.stderr


def test_two_callables_linked_by_a_tensor_and_a_sub_worker_that_checks(tmp_path):
    r = _run(tmp_path, HERE / "chain_driver.py")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the sub-worker checked every z" in r.stdout + r.stderr
    assert "[chain] matched golden" in r.stdout


def test_chip_memory_is_copied_in_and_out_kept_across_runs_and_freed(tmp_path):
    r = _run(tmp_path, HERE / "device_driver.py")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[device] matched golden" in r.stdout


def test_a_second_run_compiles_nothing(tmp_path):
    r = _run(tmp_path, HERE / "allreduce_driver.py")
    assert r.returncode == 0, r.stdout + r.stderr
    cache = tmp_path / "cache" / "pto" / "simpler"
    before = {p: p.stat().st_mtime_ns for p in cache.glob("*.so")}
    assert len(before) == 2, sorted(before)  # the kernel and the orchestration
    # The same sources, flags and headers: both libraries come from the cache, unwritten.
    r = _run(tmp_path, HERE / "allreduce_driver.py")
    assert r.returncode == 0, r.stdout + r.stderr
    assert {p: p.stat().st_mtime_ns for p in cache.glob("*.so")} == before


def test_the_scene_test_plugin_collects_runs_and_compares(tmp_path):
    pytest.importorskip("torch", reason="the scripts/test.sh venv installs torch")
    test = HERE / "test_scene_allreduce.py"
    r = _run(tmp_path, "pytest", test, "--platform", "a2a3sim", "--device", "0-1", "-q", "-p", "no:randomly")
    assert r.returncode == 0, r.stdout + r.stderr
    # The hardware-only class is deselected; the manual case is not run by default.
    assert "1 passed" in r.stdout and "1 deselected" in r.stdout, r.stdout
    r = _run(tmp_path, "pytest", test, "--platform", "a2a3sim", "--device", "0-1", "--manual", "only", "-q")
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
    r = _run(tmp_path, "pytest", test, "--platform", "a2a3sim", "--device", "0", "-q")
    assert r.returncode != 0 and "needs 2 devices" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize(
    "mode, words",
    [
        ("fatal", ["callable fatal_entry", "on chip 0", "the program gave up: 42"]),
        ("throw", ["throw_entry threw", "a C++ exception from the orchestration"]),
        ("func", ["func_id 7 is not a kernel"]),
        ("count", ["scale_config expects 2 arguments, the task has 3"]),
        ("noentry", ["no symbol kernel_entry"]),
        ("crash", ["chip 0", "signal 6", "crash_kernel.cpp (func_id 0) of callable scale_entry, task 0 crashed: SIGABRT"]),
        ("segv", ["chip 0", "signal 11", "segv_kernel.cpp (func_id 0) of callable scale_entry, task 0 crashed: SIGSEGV"]),
        ("orchsegv", ["chip 0", "signal 11", "orchestration segv_entry (", "fatal_orch.cpp) of callable segv_entry crashed: SIGSEGV"]),
        ("raise", ["ValueError: ibing mode is only supported for nranks=2"]),
        ("platform", ["pto compiles for the simulator platforms", "a2a3sim"]),
    ],
)
def test_failures_are_python_exceptions_that_name_their_cause(tmp_path, mode, words):
    r = _run(tmp_path, HERE / "failing_driver.py", mode)
    assert r.returncode != 0, r.stdout + r.stderr
    for w in words:
        assert w in r.stderr, f"{w!r} not in:\n{r.stderr}"
    assert "panicked" not in r.stderr
    if "crashed:" in words[-1]:
        # The note is in the exception, not only in the dying chip's own stderr line.
        exc = r.stderr[r.stderr.rindex("pto.WorkerError: ") :]
        assert words[-1] in exc, r.stderr


def test_clear_refusals_before_anything_runs(tmp_path):
    r = _run(tmp_path, HERE / "allreduce_driver.py", CXX="/nonexistent/c++")
    assert r.returncode != 0
    assert "no C++ compiler" in r.stderr and "clang-19" in r.stderr, r.stderr
    r = _run(tmp_path, "no_such_script.py")
    assert r.returncode == 2 and "no such script" in r.stderr
    r = _run(tmp_path, "--help")
    assert r.returncode == 0 and "python -m pto.simpler SCRIPT" in r.stdout
    # pto-isa is the user's: without PTO_ISA_ROOT its helper says what to set.
    code = "from simpler_setup.pto_isa import ensure_pto_isa_root as f; f()"
    script = tmp_path / "isa.py"
    script.write_text(code)
    r = _run(tmp_path, script)
    assert r.returncode != 0 and "PTO_ISA_ROOT is not set" in r.stderr, r.stderr
    r = _run(tmp_path, script, PTO_ISA_ROOT=str(tmp_path))
    assert r.returncode != 0 and "is not a pto-isa checkout" in r.stderr, r.stderr
    # A backend pto does not have is refused, not ignored.
    r = _run(tmp_path, HERE / "allreduce_driver.py", PTO_SIMPLER_BACKEND="gpu")
    assert r.returncode != 0 and "PTO_SIMPLER_BACKEND='gpu'" in r.stderr and "local" in r.stderr, r.stderr
