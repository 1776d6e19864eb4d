"""What this machine can show: ``doctor`` (a check in well under a second), its ``probes`` (shm, limits,
memory and cgroup, CPUs, torch build, start method), and ``preflight`` (an attendee's check, one real run
per failure family)."""
