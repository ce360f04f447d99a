"""``simpler.worker`` on pto: see :mod:`pto.simpler._worker`."""

from pto.simpler._worker import CallableHandle, MappedArgs, Orchestrator, Worker  # noqa: F401
