"""labutils.kit.inkernel: a loader failure caught in this process, read as check_death reads a run."""

from __future__ import annotations

import os
import sys

import pytest

from labutils.kit.deaths import check_death
from labutils.kit.inkernel import kernel_run


class ExitsInWorker:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            os._exit(1)  # a worker that ends at once, exit code 1 (as notebook 08's trap does)
        return i


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork workers")
def test_kernel_run_of_a_worker_that_exited_1(no_leaks):
    from torch.utils.data import DataLoader

    loader = DataLoader(ExitsInWorker(), batch_size=2, num_workers=1, multiprocessing_context="fork", timeout=30)
    with pytest.raises(RuntimeError) as caught:
        list(loader)
    run = kernel_run(caught.value)
    assert run.loader_events[0]["start_method"] == "fork"
    assert [w.exitcode for w in run.dataloader_workers] == [1]
    assert "exited unexpectedly" in run.all_messages
    death = check_death(run, exitcode=1)
    assert death.shape in ("handler", "handler_inside", "status_check")
    with pytest.raises(AssertionError):
        check_death(run, exitcode=3)  # not how this worker died


def test_kernel_run_without_a_loader():
    try:
        raise ValueError("no loader here")
    except ValueError as exc:
        run = kernel_run(exc)
    assert [e.type for e in run.exceptions] == ["ValueError"] and run.workers == [] and run.loader_events == []
