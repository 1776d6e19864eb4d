# parity: fast
# Text without a newline, never flushed: python flushes it at exit.
import sys

sys.stdout.write("progress: 10%...")
print("warning without newline", end="", file=sys.stderr)
