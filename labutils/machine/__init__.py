"""What this machine can show: ``doctor`` (a check in well under a second), its ``probes`` (shm, limits,
memory and cgroup, CPUs, torch build, start method), and ``preflight`` (an attendee's check, one real run
per failure family)."""

from .._lazy import submodule_getattr

__getattr__ = submodule_getattr(__name__)
