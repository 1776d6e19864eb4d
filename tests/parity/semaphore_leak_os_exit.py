# parity: shm
# A spawn-context semaphore left when the process ends with os._exit: the resource tracker reports the
# leaked semaphore and removes it.
import multiprocessing as mp
import os

lock = mp.get_context("spawn").Lock()
print("shm-name:", "sem." + lock._semlock.name.lstrip("/"))
print("main: os._exit with a named semaphore alive", flush=True)
os._exit(0)
