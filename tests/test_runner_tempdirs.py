"""multiprocessing's /tmp/pymp-* folder of a run whose process was killed: removed by the runner, by
identity (recorded when made, same inode); a neighbour's folder of the same kind is left alone."""

import os
import tempfile

import pytest

from labutils import run_isolated

KILLED = """
import multiprocessing.util as util, os, signal, labutils
path = util.get_temp_dir()
labutils.emit(path=path, there=os.path.isdir(path))
os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer or a time limit would: no exit handlers run
"""


@pytest.mark.parametrize("launcher", ["warm", "cold"])
def test_a_killed_run_leaves_no_pymp_folder(launcher):
    neighbour = tempfile.mkdtemp(prefix="pymp-")  # not the run's: must survive
    try:
        r = run_isolated(KILLED, launcher=launcher, timeout=60)
        assert r.returncode == -9 or r.signal == 9, r
        path = r.values["path"]
        assert os.path.basename(path).startswith("pymp-") and r.values["there"], r.values
        assert not os.path.exists(path), f"{path} was left behind"
        assert os.path.isdir(neighbour)
    finally:
        os.rmdir(neighbour)
