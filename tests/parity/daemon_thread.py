# parity: fast
# A daemon thread is not waited for: it never writes its file.
import threading
import time


def work():
    time.sleep(5)
    open("daemon.txt", "w").write("should not exist\n")


threading.Thread(target=work, daemon=True).start()
print("main: done")
