# parity: fast intended=unbuffered
# Text without a newline, then os._exit: with a buffered stdout (python's default for a file or a pipe)
# it is lost; the lab runs with PYTHONUNBUFFERED, so the text is already written (an intended difference).
import os
import sys

sys.stdout.write("saved epoch 3")
os._exit(0)
