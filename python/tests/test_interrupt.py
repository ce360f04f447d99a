"""Ctrl-C: SIGINT during a Worker run (blocked in Rust without the GIL) or during run_ranks
collectives raises KeyboardInterrupt within a fraction of a second; the Worker's children are
reaped and its shared memory removed. Each case runs in a subprocess with a timeout."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux: /dev/shm and /proc")

WORKER_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import pto
    import numpy as np

    def sleepy(x):
        time.sleep(30)

    def children():
        me = str(os.getpid())
        out = []
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    with open(f"/proc/{p}/stat") as f:
                        if f.read().rsplit(")", 1)[1].split()[1] != me:
                            continue
                    with open(f"/proc/{p}/cmdline", "rb") as f:
                        if b"pto-janitor" not in f.read().split(b"\\0"):  # the segments' janitor
                            out.append(int(p))
                except OSError:
                    pass
        return out

    with pto.Worker(chips=2, sub_workers=1, subs={"sleepy": sleepy}) as w:
        x, y = w.buffer(16), w.buffer(16)
        print(json.dumps({"pid": os.getpid(), "children": children()}), flush=True)
        def orch(h, _):
            h.submit_chip(0, "vector_scale", [pto.IN(x), pto.OUT(y), 1.0])
            h.submit_sub("sleepy", [pto.IN(y)])
        try:
            w.run(orch)
        except KeyboardInterrupt:
            print("KeyboardInterrupt at", time.monotonic(), flush=True)
            raise
    """
)

RANKS_SCRIPT = textwrap.dedent(
    """
    import json, os, time
    import pto
    import numpy as np

    def body(c):
        if c.rank == 0:
            print(json.dumps({"pid": os.getpid(), "children": []}), flush=True)
            time.sleep(60)  # never reaches the collective: the others wait in it
        x = np.ones(4)
        c.allreduce(x)
        return x

    try:
        pto.run_ranks(3, body)
    except KeyboardInterrupt:
        print("KeyboardInterrupt at", time.monotonic(), flush=True)
        raise
    """
)


def _sigint_default():
    """In the child before exec: SIGINT, SIGTERM and SIGHUP back to their default actions. An
    ignored signal stays ignored across exec, and these tests may run where one is (SIGINT in a
    background job of a script, SIGHUP under nohup): Python then installs no KeyboardInterrupt
    handler, and pto, which leaves an ignored signal alone as nohup users expect, would not end
    on it."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


def _pto_segments(pids):
    shm = Path("/dev/shm")
    return sorted(
        p.name for p in shm.glob("pto.*") if p.name.split(".")[1] in {str(x) for x in pids}
    )


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except OSError:
        return False


def _left_after(pids, seconds):
    """The pids of `pids` still running after waiting up to `seconds` for them to end. A child
    killed with its parent closes its files (so the janitor can already have run) before it is
    a zombie: "no child left" is a deadline, not an instant."""
    t = time.monotonic()
    while True:
        left = [p for p in pids if _alive(p)]
        if not left or time.monotonic() - t > seconds:
            return left
        time.sleep(0.005)


def _interrupt(script, group=False, wait_before=1.0, sig=signal.SIGINT, before=None):
    """Starts script, waits for its JSON line, sleeps, calls `before(info)` if given, sends `sig`
    (to its process group when `group`, like a terminal's Ctrl-C) and returns (info, seconds to
    exit, returncode, stdout, stderr)."""
    p = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_sigint_default,
    )
    try:
        line = p.stdout.readline()
        assert line, p.stderr.read()
        info = json.loads(line)
        time.sleep(wait_before)
        if before is not None:
            before(info)
        t = time.monotonic()
        if group:
            os.killpg(p.pid, sig)
        else:
            os.kill(p.pid, sig)
        out, err = p.communicate(timeout=20)
        took = time.monotonic() - t
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return info, took, p.returncode, line + out, err


@pytest.mark.parametrize("group", [False, True], ids=["sigint-to-process", "ctrl-c-to-group"])
def test_ctrl_c_interrupts_a_worker_run(group):
    info, took, rc, out, err = _interrupt(WORKER_SCRIPT, group=group)
    assert "KeyboardInterrupt at" in out, out + err
    assert rc == -signal.SIGINT, (rc, out, err)
    assert "KeyboardInterrupt" in err
    assert took < 3.0, f"took {took:.2f} s to exit"
    assert len(info["children"]) == 3  # two chips and a sub-worker
    # Every child is gone (within the 2 s pto promises), and no segment of the process or its
    # children is left.
    assert _left_after(info["children"], 2.0) == []
    assert _pto_segments([info["pid"], *info["children"]]) == []
    assert "PanicException" not in err and "panicked" not in err, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["sigterm", "sighup"])
def test_sigterm_and_sighup_end_a_worker_process_its_children_and_its_segments(sig):
    info, took, returncode, out, err = _interrupt(WORKER_SCRIPT, sig=sig)
    # Ended by the signal (128 + signal from pto's handler, or the signal itself).
    assert returncode in (128 + sig, -sig), (returncode, out, err)
    assert took < 2.0, f"took {took:.2f} s to exit"
    assert len(info["children"]) == 3
    assert _left_after(info["children"], 2.0) == []
    assert _pto_segments([info["pid"], *info["children"]]) == []
    assert "PanicException" not in err and "panicked" not in err, err


def test_a_sigkilled_worker_process_leaves_no_segment():
    # SIGKILL runs no handler: the process's janitor removes its segments once it and its
    # children have ended.
    def made_segments(info):
        assert _pto_segments([info["pid"]]), "no segment made"

    info, _, _, _, _ = _interrupt(WORKER_SCRIPT, wait_before=0.5, sig=signal.SIGKILL, before=made_segments)
    everyone = [info["pid"], *info["children"]]
    t = time.monotonic()
    while _pto_segments(everyone) and time.monotonic() - t < 5.0:
        time.sleep(0.01)
    assert _pto_segments(everyone) == []
    # The children die with their parent (PR_SET_PDEATHSIG), each a moment after closing the
    # files the janitor waits for.
    assert _left_after(info["children"], 5.0) == []


def test_the_interrupt_is_prompt():
    script = WORKER_SCRIPT.replace(
        'print("KeyboardInterrupt at", time.monotonic(), flush=True)',
        'print("KeyboardInterrupt at", time.monotonic(), flush=True); sys.stdout.flush()',
    )
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=_sigint_default)
    try:
        assert p.stdout.readline()
        time.sleep(1.0)
        sent = time.monotonic()
        os.kill(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    raised = float(out.split("KeyboardInterrupt at", 1)[1].split()[0])
    # CLOCK_MONOTONIC is shared by the processes: from the signal to the exception in Python.
    assert raised - sent < 0.5, f"KeyboardInterrupt {raised - sent:.3f} s after SIGINT"


def test_ctrl_c_interrupts_run_ranks_collectives():
    info, took, rc, out, err = _interrupt(RANKS_SCRIPT.replace("time.sleep(60)", "time.sleep(2)"))
    # Ranks 1 and 2 wait in the allreduce: the interrupt aborts it at once; rank 0 returns from
    # its sleep (Python cannot interrupt another thread's sleep) and its collective then fails.
    assert "KeyboardInterrupt at" in out, out + err
    assert rc == -signal.SIGINT, (rc, out, err)
    assert took < 5.0
    assert "PanicException" not in err and "panicked" not in err, err


def test_a_worker_interrupted_once_is_unusable_but_closes_cleanly():
    script = textwrap.dedent(
        """
        import os, signal, threading, time
        import pto

        def sleepy(x):
            time.sleep(30)

        w = pto.Worker(chips=1, sub_workers=1, subs={"sleepy": sleepy})
        x = w.buffer(4)
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        signal.signal(signal.SIGALRM, lambda *a: os.kill(os.getpid(), signal.SIGINT))
        try:
            w.run(lambda h, _: h.submit_sub("sleepy", [pto.IN(x)]))
        except KeyboardInterrupt:
            print("interrupted")
        try:
            w.run(lambda h, _: None)
        except pto.WorkerError as e:
            print("then:", e)
        w.close()
        w.close()
        print("closed")
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                       preexec_fn=_sigint_default)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "interrupted"
    assert lines[1].startswith("then:") and "interrupted" in lines[1], lines
    assert lines[2] == "closed"
