# parity: fast
# os.fork in the script: the child prints, runs no atexit handler of the parent (os._exit), the parent waits.
import atexit
import os

atexit.register(print, "parent's atexit")
pid = os.fork()
if pid == 0:
    print("child: hello")
    os._exit(3)
_, status = os.waitpid(pid, 0)
print("child exit code", os.waitstatus_to_exitcode(status))
