"""``simpler.orchestrator`` on pto."""

from pto.simpler._worker import Orchestrator  # noqa: F401
