"""labutils.kit.budget: budgets sized on the CPU wheel of torch keep their margins on a CUDA build."""

import sys

import pytest
import torch

from labutils.kit import budget
from labutils.scenarios import get_scenario


def test_only_processes_that_import_torch_themselves_pay_for_it():
    assert budget.own_imports("fork", 2) == 1  # forked workers share the parent's pages
    assert budget.own_imports("spawn", 2) == 3
    assert budget.own_imports("forkserver", 4) == 5
    assert budget.own_imports("spawn", 0) == 1  # no workers: the main process only


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads RssAnon from /proc (Linux only)")
def test_the_import_cost_is_measured_in_a_fresh_interpreter():
    cost = budget.import_cost_mib()
    # what the kernel said about a new process that imported torch: tens to hundreds of MiB, never 0
    assert cost is not None and 40 < cost < 2000, cost
    if not torch.version.cuda:  # the CPU wheel: the build the budgets were sized with, and nothing added
        assert budget.extra_per_import_mib() == 0
        assert abs(cost - budget.CPU_WHEEL_IMPORT_MIB) < 60, cost
    else:
        assert budget.extra_per_import_mib() == max(0, cost - budget.CPU_WHEEL_IMPORT_MIB)


def test_the_extra_is_added_once_per_importing_process(monkeypatch):
    monkeypatch.setattr(budget, "extra_per_import_mib", lambda: 130)
    assert budget.sized_budget("1G", "fork", 2) == "1154M"
    assert budget.sized_budget("1G", "spawn", 2) == "1414M"
    assert budget.sized_budget("800M", "forkserver", 1) == "1060M"
    monkeypatch.setattr(budget, "extra_per_import_mib", lambda: 0)
    assert budget.sized_budget("800M", "spawn", 2) == "800M"  # the CPU wheel: the lesson's own figure


def test_the_oom_scenario_gets_its_budget_sized_for_the_run(monkeypatch):
    monkeypatch.setattr(budget, "extra_per_import_mib", lambda: 100)
    sc = get_scenario("oom_killed")
    assert sc.broken_options.memory_budget == "800M"  # as written, sized on the CPU wheel
    monkeypatch.setenv("LABUTILS_START_METHOD", "spawn")
    assert sc.options("broken").memory_budget == sc.options("fixed").memory_budget == "1100M"
    monkeypatch.setenv("LABUTILS_START_METHOD", "fork")
    assert sc.options("broken").memory_budget == "900M"
    # a scenario whose budget is not sized per import is left as it is
    shm = get_scenario("shm_exhausted")
    assert shm.options("broken") == shm.broken_options
