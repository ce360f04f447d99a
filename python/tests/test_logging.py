"""The native module's log: tracing events to stderr, filtered by PTO_LOG (else RUST_LOG),
quiet (warn) by default; a filter that does not parse is one warning, not a crash."""

import os
import subprocess
import sys

# A run that logs: the Worker's bring-up and shared-memory segments emit debug events.
CODE = (
    "import pto\n"
    "with pto.Worker(chips=1) as w:\n"
    "    a, b = w.buffer(4), w.buffer(4)\n"
    "    w.run(lambda h, _: h.submit_chip(0, 'vector_scale', [pto.IN(a), pto.OUT(b), 1.0]))\n"
    "print('ok')\n"
)


def _run(**env):
    e = {k: v for k, v in os.environ.items() if k not in ("PTO_LOG", "RUST_LOG")}
    e.update(env)
    return subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120, env=e)


def test_quiet_by_default():
    r = _run()
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
    assert not any(level in r.stderr for level in ("DEBUG", "INFO", "TRACE")), r.stderr


def test_pto_log_turns_on_debug_events_on_stderr():
    r = _run(PTO_LOG="debug")
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
    assert "DEBUG" in r.stderr and "segment" in r.stderr, r.stderr
    assert "\x1b[" not in r.stderr  # no colours when stderr is not a terminal


def test_rust_log_is_used_when_pto_log_is_not_set():
    r = _run(RUST_LOG="debug")
    assert r.returncode == 0 and "DEBUG" in r.stderr, r.stderr


def test_pto_log_wins_over_rust_log():
    r = _run(PTO_LOG="error", RUST_LOG="debug")
    assert r.returncode == 0 and "DEBUG" not in r.stderr, r.stderr


def test_an_unparsable_filter_is_one_warning_not_a_crash():
    r = _run(PTO_LOG="pto_shm=notalevel")
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
    assert r.stderr.count("RuntimeWarning") == 1, r.stderr
    assert "PTO_LOG" in r.stderr and "not a valid log filter" in r.stderr
    assert "DEBUG" not in r.stderr


def test_an_unparsable_filter_under_w_error_still_imports():
    e = {k: v for k, v in os.environ.items() if k not in ("PTO_LOG", "RUST_LOG")}
    e["PTO_LOG"] = "=[["
    r = subprocess.run([sys.executable, "-W", "error", "-c", "import pto; print('ok')"],
                       capture_output=True, text=True, timeout=60, env=e)
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
    assert "not a valid log filter" in r.stderr
