# parity: fast
# A non-daemon thread still running when the script ends: python waits for it before the atexit handlers.
import atexit
import threading
import time


def work():
    time.sleep(0.3)
    with open("thread.txt", "w", encoding="utf-8") as fh:
        fh.write("thread finished\n")
    print("thread: finished")


atexit.register(print, "atexit: after the thread")
threading.Thread(target=work).start()
print("main: returns while the thread runs")
