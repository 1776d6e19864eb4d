"""Which /dev/shm files processes hold, read from ``/proc``: each process's memory maps and open files, a file
counted once at the largest extent seen (notebook 12's meter, and notebook 05's check for files nobody uses).
Linux only."""

from __future__ import annotations

import os

from ..machine.probes import SHM_PATH


def shm_root(path: str = SHM_PATH) -> tuple:
    """``(path prefix as /proc shows it, device)`` of the shared-memory filesystem (``/dev/shm`` may be a
    link to ``/run/shm``): a file counts when it lies under that prefix *and* on that device."""
    real = os.path.realpath(path)
    return real.rstrip("/").encode() + b"/", os.stat(real).st_dev


def maps_extents(pid: str, sizes: dict, root: tuple) -> None:
    """Add ``{(dev, inode): bytes mapped}`` of pid's /dev/shm mappings to ``sizes`` (the largest extent)."""
    prefix, dev = root
    marker = b" " + prefix
    with open(f"/proc/{pid}/maps", "rb") as fh:
        data = fh.read()
    if marker not in data:
        return
    for line in data.split(b"\n"):
        if marker not in line:
            continue
        fields = line.split()
        major, _, minor = fields[3].partition(b":")
        if os.makedev(int(major, 16), int(minor, 16)) != dev:
            continue
        start, _, end = fields[0].partition(b"-")
        key = (dev, int(fields[4]))
        sizes[key] = max(sizes.get(key, 0), int(end, 16) - int(start, 16))


def open_files(pid: str, sizes: dict, root: tuple) -> None:
    """Add the /dev/shm files pid holds open to ``sizes``, at their size (``fstat`` through /proc)."""
    prefix, dev = root
    base = f"/proc/{pid}/fd"
    for fd in os.listdir(base):
        try:
            if not os.fsencode(os.readlink(f"{base}/{fd}")).startswith(prefix):
                continue
            st = os.stat(f"{base}/{fd}")
        except OSError:  # closed meanwhile
            continue
        if st.st_dev == dev:
            key = (st.st_dev, st.st_ino)
            sizes[key] = max(sizes.get(key, 0), st.st_size)


def held_shm(pids, path: str = SHM_PATH) -> int:
    """Bytes of the /dev/shm files that the processes ``pids`` map or hold open, each file counted once."""
    root = shm_root(path)
    sizes: dict = {}
    for pid in pids:
        try:
            maps_extents(str(pid), sizes, root)
            open_files(str(pid), sizes, root)
        except (OSError, ValueError, IndexError):  # the process ended while it was read
            continue
    return sum(sizes.values())
