"""labutils.kit.rankmeter.quiet_peak: relaunch while the /dev/shm meter was moved by others."""

import os
import time

import pytest

from labutils.kit.rankmeter import quiet_peak

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm to meter (macOS)")


def test_quiet_launch_is_measured_once():
    calls = []
    result, meters = quiet_peak(lambda: calls.append(1) or "done", limit=1 << 40)
    assert result == "done" and len(calls) == 1 and len(meters) == 1


def test_a_peak_over_the_limit_is_launched_again_up_to_tries(tmp_path):
    calls = []

    def launch():  # holds 4 MiB in /dev/shm for a moment, as a rank's batches would
        calls.append(1)
        path = f"/dev/shm/lab-test-rankmeter-{os.getpid()}"
        with open(path, "wb") as fh:
            fh.write(b"x" * (4 << 20))
        time.sleep(0.05)
        os.unlink(path)

    result, meters = quiet_peak(launch, limit=1 << 20, tries=3)  # every launch peaks above 1 MiB
    assert len(calls) == 3 and len(meters) == 3 and all(m.peak >= 3 << 20 for m in meters)


def test_bad_arguments_get_one_line():
    with pytest.raises(ValueError, match="tries"):
        quiet_peak(lambda: None, limit=1, tries=0)
    with pytest.raises(ValueError, match="launch"):
        quiet_peak(None, limit=1)
