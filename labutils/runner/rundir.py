"""The run directory's file names: what the runner, the bootstrap, the run's processes and the diagnosis
read and write there, in one place.

The bootstrap is executed by path and loads this file by path too (importing the package would cost a run
its start-up time). ``child.py`` is copied into the run directory and loaded from there, so it repeats the
names it writes (``STACKS``, ``CREATED_SHM``, ``CREATED_TMP``); ``tests/test_runner_rundir.py`` checks that they agree.
"""

CONFIG = "config.json"  #: the run's settings, written by the runner before the run starts
RUNNER = "runner.json"  #: who runs it: the runner's pid and start ticks (clean-up after a dead runner)
STDOUT = "stdout.txt"
STDERR = "stderr.txt"
CELL = "lab_cell.py"  #: a cell's code, as a module file
PY = "py"  #: on the run's sys.path: the copy of child.py
CHILD_MODULE = "_labutils_child"
PROCS = "procs.jsonl"  #: each process the main process started
LOADER = "loader.jsonl"  #: DataLoader iterators, their errors and progress
EXITS = "exits.jsonl"  #: exit codes as the main process reaped them
CREATED_SHM = "created_shm.jsonl"  #: named semaphores the run's processes created, with inodes
CREATED_TMP = "created_tmp.jsonl"  #: multiprocessing's /tmp/pymp-* folders the run's processes made
EMITTED = "emitted.jsonl"  #: labutils.emit(...) records
VALUE = "value.json"  #: a func= run's return value
EXC = "exc.json"  #: the exception chain that ended the script
FINAL = "final.json"  #: exit codes of the processes the main process started
STACKS = "stacks"  #: faulthandler dumps, one file per pid
#: the run's own temporary folder: TMPDIR, TEMP and TMP of the script and of every process below it
#: (multiprocessing's pymp-* folders, torchelastic's log folders, torch_shm_manager's socket folder,
#: mkstemp files), so whatever a killed process leaves there goes with the run directory
TMP = "tmp"
TMP_VARS = ("TMPDIR", "TEMP", "TMP")
#: where the run's temporary folder is when ``RUN_DIR/tmp`` would be too long: path, device, inode and
#: the token of its owner file
TMP_ELSEWHERE = "tmp_elsewhere.json"
#: AF_UNIX socket paths are at most 107 bytes; multiprocessing puts its listeners at
#: ``TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX`` (33 more) and torch's shm manager its socket 30 more deep
TMP_MAX_LEN = 70

#: the bootstrap's line when it cannot join the run's cgroup (exit code JOIN_FAILED): the run never started
JOIN_FAILED = 3
JOIN_FAILED_TEXT = "labutils: could not join the run's cgroup"
