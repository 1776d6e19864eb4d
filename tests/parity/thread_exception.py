# parity: fast
# An uncaught exception in a thread is printed by threading.excepthook; the process still exits 0.
import threading


def fail():
    raise RuntimeError("inside the thread")


t = threading.Thread(target=fail, name="worker-thread")
t.start()
t.join()
print("main: done")
