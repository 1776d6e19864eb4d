"""labutils.kit.fds: counting open fds, also at the open-files limit where listing /proc/self/fd fails."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from labutils.kit import fds


def test_open_fds_counts_what_this_process_opens():
    before = fds.open_fds()
    opened = [os.open(os.devnull, os.O_RDONLY) for _ in range(5)]
    try:
        assert fds.open_fds() == before + 5
        assert fds.open_fds(limit=max(opened) + 1) >= 5 + 3  # the scan sees them too (and stdin/out/err)
    finally:
        for fd in opened:
            os.close(fd)
    assert fds.open_fds() == before


def test_listing_and_scan_agree():
    limit = fds.soft_limit() or fds.SCAN_CAP
    assert fds.open_fds() == fds.open_fds(limit=min(limit, fds.SCAN_CAP))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_NOFILE and /proc are Linux here")
def test_open_fds_works_with_no_fd_left():
    # a child with a limit of 64 takes every fd; listing /proc/self/fd is impossible, the count still works
    code = """
import os, resource
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from labutils.kit import fds
hog = []
try:
    while True:
        hog.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
try:
    os.listdir("/proc/self/fd")
    print("listing worked")
except OSError as exc:
    print("listing failed", exc.errno)
print(fds.open_fds())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    listing, count = out.stdout.split("\n")[:2]
    assert listing == "listing failed 24"
    assert int(count) == 64


def test_per_step():
    assert fds.per_step([10, 12, 14, 16]) == 2.0
    assert fds.per_step([7, 7]) == 0.0
    with pytest.raises(ValueError, match="at least two"):
        fds.per_step([3])
