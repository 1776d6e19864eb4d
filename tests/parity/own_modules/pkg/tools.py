from . import base


def twice(x):
    return base.scale * x
