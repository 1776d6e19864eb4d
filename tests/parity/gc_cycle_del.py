# parity: fast
# Objects in a reference cycle with __del__, alive at exit.
class Node:
    def __init__(self, name):
        self.name, self.other = name, None

    def __del__(self):
        print("del", self.name)


a, b = Node("a"), Node("b")
a.other, b.other = b, a
del a, b
print("main: done")
