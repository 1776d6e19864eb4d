# parity: fast
# sys.exit(True) is exit code 1 (a bool is an int); raised from inside a function, with a finally.
import sys


def main():
    try:
        sys.exit(True)
    finally:
        print("finally runs")


main()
