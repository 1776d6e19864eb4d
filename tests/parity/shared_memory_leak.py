# parity: shm
# A SharedMemory block never unlinked: at exit multiprocessing's resource tracker warns about it and
# removes it.
from multiprocessing import shared_memory

block = shared_memory.SharedMemory(create=True, size=1024)
block.buf[:5] = b"hello"
print("shm-name:", block.name)
print("main: created a block and never unlinked it")
