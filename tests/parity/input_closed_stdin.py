# parity: fast
# input() after the script closed sys.stdin, then with no sys.stdin at all.
import sys

sys.stdin.close()
try:
    input()
except ValueError as exc:
    print("closed sys.stdin:", exc)
sys.stdin = None
try:
    input()
except RuntimeError as exc:
    print("no sys.stdin:", exc)
