"""Progress on long work: data_gen's big file reports each chunk, and its CLI draws a bar from that."""

import io

import numpy as np

from data_gen.bigfile import CHUNK_ELEMENTS, make_big_array
from data_gen.cli import _ByteProgress


def test_big_array_reports_progress_up_to_its_size(tmp_path):
    calls = []
    nbytes = 3 * CHUNK_ELEMENTS * 4 + 1000 * 4  # three whole float32 chunks and a partial one
    make_big_array(tmp_path / "big.npy", nbytes=nbytes, progress=lambda done, total: calls.append((done, total)))
    assert len(calls) == 4 and all(total == nbytes for _, total in calls)
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[-1] == nbytes
    assert np.load(tmp_path / "big.npy", mmap_mode="r").nbytes == nbytes


def test_the_cli_bar_prints_deciles_off_a_terminal_and_skips_small_files():
    out = io.StringIO()
    bar = _ByteProgress(out, min_bytes=100)
    for done in range(0, 1001, 16):
        bar(done, 1000)
    bar(1000, 1000)
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("[#########################] 100%")
    assert 5 <= len(lines) <= 11, lines
    quiet = io.StringIO()
    _ByteProgress(quiet, min_bytes=10_000)(500, 1000)
    assert quiet.getvalue() == ""
