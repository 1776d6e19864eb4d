# parity: fast
# A signal handler raises while an exit handler waits for a child (what PyTorch's SIGCHLD handler does inside
# multiprocessing's exit join): python reports it as "Exception ignored in atexit callback" with the frames it
# passed through; the lab's recorder of reaped exit statuses is one of them and must not show.
import atexit
import multiprocessing as mp
import signal
import time


def child_ended(signum, frame):
    raise RuntimeError("the child ended while the exit handler waited for it")


if __name__ == "__main__":
    mp.set_start_method("fork", force=True)
    child = mp.Process(target=time.sleep, args=(0.5,))
    child.start()
    signal.signal(signal.SIGCHLD, child_ended)
    atexit.register(child.join)
    print("main done")
