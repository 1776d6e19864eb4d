"""What the lessons measure and fix with: meters (``measure``, ``shmwatch``, ``fds``, ``throughput``),
the crashing-input finder (``triage``), the unpicklable finder (``pickling``) and reusable ``fixes``."""
