"""find_unpicklable: every kind of blocker with its path, nothing reported for picklable objects, and a
search strategy that stays at a handful of pickle calls on big datasets."""

from __future__ import annotations

import functools
import pickle
import sqlite3
import sys
import threading
import types

import pytest

from labutils.diagnosis import pickling
from labutils.diagnosis.pickling import Blocker, find_unpicklable, format_blockers


class Plain:
    def __init__(self, **attrs):
        self.__dict__.update(attrs)


class Cache:
    def __init__(self):
        self._lock = threading.Lock()
        self.data = {"k": 1}


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, b):
        self.a = 1
        self.b = b


class DropsLock:
    """Picklable although it holds a lock: __getstate__ drops it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.items = [1, 2, 3]

    def __getstate__(self):
        state = dict(self.__dict__)
        del state["lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.lock = threading.Lock()


class ReducesToLock:
    """A custom __reduce__ whose arguments hold something unpicklable."""

    def __init__(self):
        self.lock = threading.Lock()

    def __reduce__(self):
        return (ReducesToLock._rebuild, (self.lock,))

    @staticmethod
    def _rebuild(lock):  # pragma: no cover - never reached
        return ReducesToLock()


def module_level_collate(batch, scale=1):
    return batch


def paths(blockers):
    return [b.path for b in blockers]


@pytest.fixture
def counted(monkeypatch):
    """Count every pickle call the search makes."""
    calls = []
    real = pickling._pickle_check

    def wrapper(obj, *args):
        calls.append(type(obj).__name__)
        return real(obj, *args)

    monkeypatch.setattr(pickling, "_pickle_check", wrapper)
    return calls


def test_picklable_object_returns_empty_list_after_one_pickle(counted):
    obj = Plain(items=list(range(100)), name="x", nested={"a": [1.0, 2.0]}, fn=module_level_collate)
    assert find_unpicklable(obj, "dataset") == []
    assert len(counted) == 1


def test_sqlite_file_and_nested_lock_paths(tmp_path):
    fh = open(tmp_path / "f.txt", "w")
    conn = sqlite3.connect(":memory:")
    try:
        ds = Plain(conn=conn, cache=Cache(), fh=fh, ok=[1, 2])
        found = {b.path: b for b in find_unpicklable(ds, "dataset")}
        assert set(found) == {"dataset.conn", "dataset.cache._lock", "dataset.fh"}
        assert found["dataset.conn"].type_name == "sqlite3.Connection"
        assert found["dataset.cache._lock"].type_name == "_thread.lock"
        assert found["dataset.fh"].type_name == "_io.TextIOWrapper"
        assert "cannot pickle" in found["dataset.conn"].reason
        assert all(isinstance(b, Blocker) and b.hint for b in found.values())
    finally:
        fh.close()
        conn.close()


def test_reported_reason_is_the_pickle_error():
    lock = threading.Lock()
    with pytest.raises(TypeError) as info:
        pickle.dumps(lock)
    [blocker] = find_unpicklable(Plain(lock=lock), "d")
    assert blocker.reason == str(info.value)


def test_lambda_and_local_function_and_local_class():
    def make():
        class Local:
            pass

        def inner(batch):
            return batch

        return Local, inner

    local_cls, inner = make()
    assert paths(find_unpicklable(lambda b: b, "collate_fn")) == ["collate_fn"]
    [b] = find_unpicklable(lambda b: b, "collate_fn")
    assert "<lambda>" in b.type_name
    [b] = find_unpicklable(inner, "collate_fn")
    assert "<locals>" in b.type_name
    [b] = find_unpicklable(Plain(obj=local_cls()), "dataset")
    assert b.path == "dataset.obj.__class__" and "<locals>.Local" in b.type_name


def test_closure_cells_are_followed():
    lock = threading.Lock()
    scale = 3

    def collate(batch):
        return lock, batch, scale

    found = paths(find_unpicklable(collate, "collate_fn"))
    assert found == ["collate_fn", "collate_fn.<closure>.lock"]


def test_dict_keys_and_values_list_tuple_set_items():
    lock = threading.Lock()
    ds = Plain(
        index={"a": threading.RLock(), "b": 1, 7: threading.Lock()},
        keyed={lock: 1},
        items=[0, 1, 2, threading.Lock()],
        pair=(1, threading.Lock()),
        members={1, 2, threading.Lock()},
    )
    found = paths(find_unpicklable(ds, "dataset"))
    assert found == [
        "dataset.index['a']",
        "dataset.index[7]",
        "dataset.keyed.keys()[0]",
        "dataset.items[3]",
        "dataset.pair[1]",
        found[-1],
    ]
    assert found[-1].startswith("dataset.members.<item ")


def test_slots():
    [b] = find_unpicklable(Slotted(threading.Lock()), "s")
    assert b.path == "s.b" and b.type_name == "_thread.lock"
    assert find_unpicklable(Slotted(5), "s") == []


def test_getstate_that_drops_the_lock_is_not_reported():
    obj = DropsLock()
    pickle.dumps(obj)  # the premise: it really pickles
    assert find_unpicklable(obj, "dataset") == []
    assert find_unpicklable(Plain(inner=obj), "dataset") == []


def test_custom_reduce_is_followed():
    [b] = find_unpicklable(ReducesToLock(), "x")
    assert b.path == "x.<reduce args>[0]" and b.type_name == "_thread.lock"


def test_partial_and_bound_method():
    fn = functools.partial(module_level_collate, threading.Lock(), scale=(x for x in "ab"))
    assert paths(find_unpicklable(fn, "collate_fn")) == ["collate_fn.args[0]", "collate_fn.keywords['scale']"]
    cache = Cache()
    assert paths(find_unpicklable(Plain(hook=cache.__init__), "ds")) == ["ds.hook.__self__._lock"]
    assert find_unpicklable(functools.partial(module_level_collate, scale=2), "c") == []


def test_cycles_terminate_and_shared_objects_are_reported_once():
    a, b = Plain(), Plain()
    a.other, b.other = b, a
    lock = threading.Lock()
    a.lock = lock
    b.same = lock
    a.me = a
    found = find_unpicklable(a, "a")
    assert paths(found) == ["a.other.same"] or paths(found) == ["a.lock"]
    lst = [1]
    lst.append(lst)
    assert find_unpicklable(lst, "l") == []


def test_main_check_reports_classes_and_functions_of_a_notebook_main(monkeypatch):
    fake_main = types.ModuleType("__main__")  # like a notebook kernel: no __file__

    class D:
        pass

    def collate(batch):
        return batch

    for obj, name in ((D, "D"), (collate, "collate")):
        obj.__module__, obj.__qualname__ = "__main__", name
        setattr(fake_main, name, obj)
    monkeypatch.setitem(sys.modules, "__main__", fake_main)

    ds = D()
    ds.n = 3
    pickle.dumps(ds)  # pickles here: only a spawn child would fail to import it
    found = find_unpicklable(Plain(ds=ds, collate_fn=collate), "x")
    assert paths(found) == ["x.ds.__class__", "x.collate_fn"]
    assert found[0].type_name == "__main__.D"
    assert "defined in __main__" in found[0].reason
    assert find_unpicklable(ds, "dataset", check_main=False) == []


def test_main_check_is_off_when_main_is_a_file(monkeypatch, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    fake_main = types.ModuleType("__main__")
    fake_main.__file__ = str(script)

    class D:
        pass

    D.__module__, D.__qualname__ = "__main__", "D"
    fake_main.D = D
    monkeypatch.setitem(sys.modules, "__main__", fake_main)
    assert find_unpicklable(D(), "dataset") == []


def test_big_list_that_pickles_costs_one_call(counted):
    ds = Plain(data=[i if i % 2 else str(i) for i in range(1_000_000)])
    assert find_unpicklable(ds, "dataset") == []
    assert len(counted) == 1


def test_big_list_plus_lock_stays_at_a_few_calls(counted):
    ds = Plain(data=[i if i % 2 else str(i) for i in range(1_000_000)], lock=threading.Lock())
    assert paths(find_unpicklable(ds, "dataset")) == ["dataset.lock"]
    assert len(counted) <= 5  # whole, class, data, lock: never once per element


def test_one_bad_item_in_a_big_list_is_bisected(counted):
    data = list(range(1_000_000))
    data[654_321] = threading.Lock()
    assert paths(find_unpicklable(Plain(data=data), "dataset")) == ["dataset.data[654321]"]
    assert len(counted) < 60  # about 2 * log2(1M / 8) + 8, not 1M


def test_many_bad_items_are_capped_and_counted(counted):
    data = [threading.Lock() for _ in range(50)]
    found = find_unpicklable(data, "items", max_items=5)
    assert paths(found) == [f"items[{i}]" for i in range(5)]
    assert found.more == 45 and not found.truncated
    text = format_blockers(found)
    assert "... and 45 more" in text

    found = find_unpicklable([threading.Lock() for _ in range(5000)], "items", max_items=3, max_checks=200)
    assert len(found) == 3 and found.truncated and found.checks == 200
    assert "search stopped" in format_blockers(found)


def test_format_blockers():
    assert "No pickling blockers" in format_blockers([])
    text = format_blockers(find_unpicklable(Plain(lock=threading.Lock()), "dataset"))
    assert text.splitlines()[0] == "dataset.lock -> _thread.lock: cannot pickle '_thread.lock' object"
    assert "fix:" in text


def test_tensors_and_dataloader_roots():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    t = torch.zeros(1000)
    w = torch.ones(3, requires_grad=True)
    ds = Plain(t=t, graph=w * 2, items=[0, 1])
    found = find_unpicklable(DataLoader(ds, collate_fn=lambda b: b), "loader")
    assert paths(found) == ["loader.dataset.graph", "loader.collate_fn"]
    assert "non-leaf" in found[0].reason
    assert not t.is_shared()  # the probe must not move tensors into shared memory
