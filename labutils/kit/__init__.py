"""What the lessons measure and fix with: meters (``measure``, ``shmwatch``, ``fds``, ``throughput``),
the crashing-input finder (``triage``) and reusable ``fixes``."""

from .._lazy import submodule_getattr

__getattr__ = submodule_getattr(__name__)
