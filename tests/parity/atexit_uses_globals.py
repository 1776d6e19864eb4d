# parity: fast diagnose code
# An exit handler that uses module globals (os, a path) to append a line to a log: the issue's own case.
import atexit
import os

LOG = "log.txt"


def flush_log():
    with open(LOG, "a", encoding="utf-8") as fh:
        fh.write(f"saved from {os.path.basename(os.getcwd()) != ''}\n")
    print("atexit: log written")


atexit.register(flush_log)
print("main: done")
