# parity: fast
# A class defined in the script, pickled to spawn workers and back: they import the script as __mp_main__.
import multiprocessing as mp


class Point:
    def __init__(self, x):
        self.x = x


def double(p):
    return Point(p.x * 2)


if __name__ == "__main__":
    with mp.get_context("spawn").Pool(2) as pool:
        back = pool.map(double, [Point(1), Point(2)])
        print("doubled", [p.x for p in back], "class from", type(back[0]).__module__)
