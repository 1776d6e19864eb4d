"""What this machine can show: ``doctor`` (a check in well under a second) and its ``probes`` (shm, limits,
memory and cgroup, CPUs, torch build, start method). The attendee's check that runs one real case per failure
family, ``python -m labutils preflight``, is a front end (``labutils.commands.preflight``): it needs the
scenarios and the diagnosis, which sit above this layer."""

from .._lazy import submodule_getattr

__getattr__ = submodule_getattr(__name__)
