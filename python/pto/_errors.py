"""pto's exception classes, and how :func:`pto.run_ranks` re-raises a rank's exception.

The classes are plain Python classes (the native module raises these very classes), so they
pickle by reference to ``pto.PtoError`` and friends and cross process boundaries
(``multiprocessing``, ``concurrent.futures``) with their type, message and attributes.
"""

from __future__ import annotations

from typing import List, Tuple

__all__ = ["PtoError", "WorkerError", "CommError"]


class PtoError(Exception):
    """Every error pto raises; the message names what failed (chip, task, kernel, rank)."""


class WorkerError(PtoError):
    """The Worker could not start, or a run failed (a chip or sub-worker task, a dead child)."""


class CommError(PtoError):
    """A communication error (a collective, a window, a rank)."""


# Pickle (and tracebacks) name the public module: ``pto.WorkerError``, importable anywhere.
for _cls in (PtoError, WorkerError, CommError):
    _cls.__module__ = "pto"
del _cls


def _add_note(exc: BaseException, note: str) -> None:
    add = getattr(exc, "add_note", None)
    if add is not None:  # Python 3.11+
        add(note)
        return
    try:  # Python 3.9/3.10: keep the notes where 3.11 would (not printed there)
        notes = getattr(exc, "__notes__", None)
        if not isinstance(notes, list):
            notes = []
            exc.__notes__ = notes  # type: ignore[attr-defined]
        notes.append(note)
    except Exception:
        pass


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"<unprintable {type(exc).__name__}>"


def _rank_error(failures: List[Tuple[int, BaseException]], size: int) -> BaseException:
    """The exception ``run_ranks`` raises: ``failures`` lists ``(rank, exception)`` in the order
    the ranks raised. The first one is re-raised with its type and message prefixed
    ``"rank R: "``, a ``rank`` attribute and the original as ``__cause__``; the later ones are
    added as notes. Exceptions that are not :class:`Exception` (``SystemExit``,
    ``KeyboardInterrupt``) and types that cannot be made from one message are raised as they
    are, with the ``rank`` attribute and a note."""
    rank, exc = failures[0]
    new: BaseException = exc
    if isinstance(exc, Exception):
        try:
            text = _text(exc)
            made = type(exc)(f"rank {rank}: {text}" if text else f"rank {rank}")
            if type(made) is type(exc):
                try:
                    for k, v in vars(exc).items():
                        if not k.startswith("__"):  # not __notes__: the cause shows them
                            setattr(made, k, v)
                except Exception:
                    pass
                made.__cause__ = exc
                new = made
        except Exception:
            new = exc
    try:
        new.rank = rank  # type: ignore[attr-defined]
    except Exception:
        pass
    if new is exc:
        _add_note(new, f"raised on rank {rank} of {size} (pto.run_ranks)")
    for r, e in failures[1:]:
        _add_note(new, f"rank {r} also failed: {type(e).__name__}: {_text(e)}")
    return new
