# parity: fast
# sys.exit in a thread ends only that thread, silently.
import sys
import threading

t = threading.Thread(target=sys.exit, args=(9,))
t.start()
t.join()
print("main: still here")
