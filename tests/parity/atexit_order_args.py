# parity: fast
# Handlers run last-registered first, with their arguments; an unregistered one does not run.
import atexit


def say(word, *, end="!"):
    print(word + end)


def dropped():
    print("unregistered: must not print")


atexit.register(say, "one")
atexit.register(dropped)
atexit.register(say, "two", end="?")
atexit.unregister(dropped)
print("main: done")
