# parity: fast
# A string given to sys.exit is printed to stderr and the exit code is 1.
import sys

print("bad config")
sys.exit("fatal: the config file is missing")
