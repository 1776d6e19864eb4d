# parity: fast
# A handler registered before multiprocessing is imported runs after multiprocessing's own exit handler,
# which joins the child the script never joined: the child's line comes first.
import atexit

atexit.register(print, "main's handler (registered before import multiprocessing)")

import multiprocessing  # noqa: E402
import time  # noqa: E402


def child():
    time.sleep(0.3)
    print("child: done", flush=True)


if __name__ == "__main__":
    multiprocessing.Process(target=child).start()
    print("main: returns without join")
