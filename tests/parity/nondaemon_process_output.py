# parity: fast
# A non-daemon multiprocessing.Process left running: python's exit joins it; its output and file appear.
import multiprocessing as mp
import time


def child():
    time.sleep(0.3)
    with open("child.txt", "w", encoding="utf-8") as fh:
        fh.write("child wrote this\n")
    print("child: done", flush=True)


if __name__ == "__main__":
    mp.Process(target=child).start()
    print("main: done")
