"""Unit tests for data_gen: determinism, manifest truth, size refusals, metadata forms, and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile

import data_gen as dg
from data_gen import bigfile
from data_gen.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` as {relative path: bytes}."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _pil_error(path: Path) -> str | None:
    """What a naive image Dataset does; returns the exception type name, or None when it works."""
    try:
        with Image.open(path) as im:
            im.load()
            im.convert("RGB")
    except Exception as exc:
        return type(exc).__name__
    return None


# ---------------------------------------------------------------- determinism


@pytest.mark.parametrize(
    "make",
    [
        lambda root, seed: dg.make_image_folder(root, n=12, corrupt_fraction=0.5, seed=seed),
        lambda root, seed: dg.make_npy_folder(root, n=12, corrupt_fraction=0.5, seed=seed),
    ],
    ids=["images", "npy"],
)
def test_folders_are_byte_identical_for_a_seed_and_differ_across_seeds(tmp_path, make):
    make(tmp_path / "a", 3)
    make(tmp_path / "b", 3)
    make(tmp_path / "c", 4)
    a, b, c = (_tree(tmp_path / name) for name in "abc")
    assert "manifest.json" in a and len(a) == 13
    assert a == b
    assert a["manifest.json"] != c["manifest.json"]
    assert a != c


def test_single_file_generators_are_deterministic(tmp_path):
    for name in ("a", "b", "c"):
        seed = 5 if name == "c" else 1
        dg.make_big_array(tmp_path / name / "big.npy", shape=(64, 10), seed=seed)
        dg.make_metadata(tmp_path / name / "meta.bin", n=500, kind="dict", seed=seed)
    a, b, c = (_tree(tmp_path / name) for name in "abc")
    assert set(a) == {"big.npy", "big.npy.manifest.json", "meta.bin", "meta.bin.manifest.json"}
    assert a == b
    assert a["big.npy"] != c["big.npy"] and a["meta.bin"] != c["meta.bin"]


# ---------------------------------------------------------------- images


@pytest.fixture(scope="module")
def image_set(tmp_path_factory) -> dg.Manifest:
    root = tmp_path_factory.mktemp("images")
    return dg.make_image_folder(root, n=30, corrupt_fraction=0.5, size=(24, 16), seed=7)


def test_image_manifest_tells_the_truth(image_set):
    assert set(e.kind for e in image_set.corrupt()) == set(dg.IMAGE_KINDS)
    for entry, path in zip(image_set.entries, image_set.paths()):
        error = _pil_error(path)
        if entry.broken:
            assert entry.failure == "load_error" and entry.kind in dg.BROKEN_IMAGE_KINDS
            assert error is not None, f"{entry} loads, but the manifest says it is broken"
        else:
            assert error is None, f"{entry} fails with {error}, but the manifest says it is good"
            with Image.open(path) as im:
                assert im.size == (24, 16)
                assert np.asarray(im.convert("RGB")).shape == (16, 24, 3)


def test_image_kinds_fail_where_documented(image_set):
    by_kind: dict[str, list[dg.Entry]] = {}
    for entry in image_set.corrupt():
        by_kind.setdefault(entry.kind, []).append(entry)
    for entry in by_kind["zero_byte"]:
        assert image_set.path_of(entry).stat().st_size == 0
    for entry in by_kind["truncated"] + by_kind["broken_body"]:
        path = image_set.path_of(entry)
        with Image.open(path) as im:  # the header is intact: opening works, decoding does not
            assert im.size == (24, 16)
            with pytest.raises(OSError):
                im.load()
    for entry in by_kind["wrong_extension"]:
        path = image_set.path_of(entry)
        with Image.open(path) as im:
            assert im.format == entry.info["format"]
        assert path.suffix == (".jpg" if entry.info["format"] == "PNG" else ".png")


def test_image_labels_and_layout(image_set):
    for entry in image_set.entries:
        assert entry.path.startswith(f"class_{entry.label}/")
    assert sorted({e.label for e in image_set.entries}) == [0, 1, 2, 3]


def test_load_truncated_images_hides_truncation_and_is_restored(image_set):
    truncated = [e for e in image_set.entries if e.kind == "truncated"]
    assert truncated
    for entry in truncated:
        assert dg.check_image(image_set.path_of(entry), load_truncated=True) is None
        assert dg.check_image(image_set.path_of(entry)).failure == "load_error"
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


# ---------------------------------------------------------------- npy


def test_npy_manifest_tells_the_truth(tmp_path):
    m = dg.make_npy_folder(tmp_path, n=24, corrupt_fraction=0.5, shape=(3, 4, 5), seed=2)
    assert {e.kind for e in m.corrupt()} == set(dg.NPY_KINDS)
    for entry, path in zip(m.entries, m.paths()):
        assert entry.failure == (dg.NPY_FAILURES[entry.kind] if entry.status == "corrupt" else None)
        if entry.failure == "load_error":
            with pytest.raises(Exception):  # noqa: B017 - np.load raises several types here
                np.load(path, allow_pickle=False)
            continue
        arr = np.load(path, allow_pickle=False)
        if entry.failure == "bad_values":
            assert arr.shape == (3, 4, 5) and not np.isfinite(arr).all()
        elif entry.failure == "bad_shape":
            assert arr.shape != (3, 4, 5) and list(arr.shape) == entry.info["shape"]
        else:
            assert arr.shape == (3, 4, 5) and arr.dtype == np.float32 and np.isfinite(arr).all()
        problem = dg.check_array(arr, (3, 4, 5), "float32")
        assert (problem.failure if problem else None) == entry.failure, (entry, problem)


def test_integer_npy_cannot_hold_nan(tmp_path):
    m = dg.make_npy_folder(tmp_path / "i", n=9, corrupt_fraction=1.0, dtype="int16")
    assert {e.kind for e in m.entries} == {"truncated", "bad_header", "wrong_shape"}
    with pytest.raises(ValueError, match="floating dtype"):
        dg.make_npy_folder(tmp_path / "j", n=4, dtype="int16", kinds=["nan_inf"])


# ---------------------------------------------------------------- selection and manifests


@pytest.mark.parametrize("n, fraction, expected", [(10, 0.0, 0), (10, 0.25, 3), (7, 1.0, 7), (40, 0.1, 4)])
def test_corrupt_fraction_is_honoured(tmp_path, n, fraction, expected):
    m = dg.make_npy_folder(tmp_path, n=n, corrupt_fraction=fraction, shape=(2,))
    assert len(m.corrupt()) == expected
    counts = list(m.summary()["kinds"].values())
    assert not counts or max(counts) - min(counts) <= 1  # kinds spread evenly


def test_kinds_restrict_the_corruption(tmp_path):
    m = dg.make_image_folder(tmp_path, n=10, corrupt_fraction=0.5, kinds=["zero_byte"], formats=["png"])
    assert [e.kind for e in m.corrupt()] == ["zero_byte"] * 5
    assert all(p.suffix == ".png" for p in m.paths())


def test_manifest_round_trip_and_helpers(tmp_path):
    made = dg.make_npy_folder(tmp_path / "d", n=8, corrupt_fraction=0.5, seed=1)
    loaded = dg.Manifest.load(tmp_path / "d")
    assert loaded.entries == made.entries and loaded.params == made.params and loaded.seed == 1
    assert loaded.generator == "make_npy_folder" and loaded.version == dg.__version__
    assert len(loaded.good()) + len(loaded.broken()) == 8 and len(loaded.broken()) == 4
    raw = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert raw["summary"] == {"files": 8, "corrupt": 4, "broken": 4, "kinds": made.summary()["kinds"]}
    single = dg.make_big_array(tmp_path / "big.npy", shape=(10,))
    assert dg.Manifest.load(tmp_path / "big.npy").entries == single.entries
    assert single.path == tmp_path / "big.npy.manifest.json"


def test_non_empty_folder_needs_overwrite(tmp_path):
    dg.make_npy_folder(tmp_path, n=6, seed=0)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(dg.OutputExistsError, match="not empty"):
        dg.make_npy_folder(tmp_path, n=3)
    dg.make_npy_folder(tmp_path, n=3, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "manifest.json",
        "notes.txt",
        "sample_00000.npy",
        "sample_00001.npy",
        "sample_00002.npy",
    ]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n": 0}, "at least 1"),
        ({"n": -5}, "at least 1"),
        ({"corrupt_fraction": 1.5}, "between 0 and 1"),
        ({"corrupt_fraction": -0.1}, "between 0 and 1"),
        ({"kinds": ["melted"]}, "unknown corrupt kind"),
        ({"seed": -1}, "seed"),
        ({"size": (0, 3)}, "size"),
        ({"formats": ["gif"]}, "format"),
    ],
)
def test_image_folder_rejects_bad_arguments(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        dg.make_image_folder(tmp_path / "x", **kwargs)
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------- big array


def test_big_array_is_written_in_chunks_and_mmaps(tmp_path, monkeypatch):
    monkeypatch.setattr(bigfile, "CHUNK_ELEMENTS", 1000)
    sizes = []
    real_chunk = bigfile._chunk
    monkeypatch.setattr(bigfile, "_chunk", lambda *a: sizes.append(a[2]) or real_chunk(*a))
    m = dg.make_big_array(tmp_path / "big.npy", shape=(50, 50), dtype="float32", seed=3)
    assert sizes == [1000, 1000, 500]
    arr = np.load(tmp_path / "big.npy", mmap_mode="r")
    assert isinstance(arr, np.memmap) and arr.shape == (50, 50) and arr.dtype == np.float32
    expected = np.random.default_rng([3, 1]).random(1000, dtype=np.float32)
    assert np.array_equal(arr.reshape(-1)[1000:2000], expected)
    assert 0.0 <= float(arr.min()) and float(arr.max()) < 1.0
    assert m.params["nbytes"] == 50 * 50 * 4 and not list(tmp_path.glob("*.partial"))


def test_big_array_from_nbytes(tmp_path):
    m = dg.make_big_array(tmp_path / "b.npy", nbytes=4096 + 1, dtype="int16")
    arr = np.load(tmp_path / "b.npy", mmap_mode="r")
    assert arr.shape == (2048,) and arr.dtype == np.int16 and m.params["shape"] == [2048]
    with pytest.raises(ValueError, match="exactly one"):
        dg.make_big_array(tmp_path / "c.npy", nbytes=10, shape=(3,))


def test_big_array_refuses_more_than_half_the_free_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(bigfile, "_free_disk_bytes", lambda directory: 10 * 2**20)
    with pytest.raises(ValueError) as info:
        dg.make_big_array(tmp_path / "big.npy", nbytes=6 * 2**20)
    message = str(info.value)
    assert "6.0 MiB" in message and "10.0 MiB free" in message and "smaller" in message
    assert not any(tmp_path.iterdir())


def test_big_array_refuses_more_than_half_the_available_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(bigfile, "_free_disk_bytes", lambda directory: 2**50)
    monkeypatch.setattr(bigfile, "_available_ram_bytes", lambda: 2**20)
    with pytest.raises(ValueError, match=r"1\.0 MiB of memory available"):
        dg.make_big_array(tmp_path / "big.npy", nbytes=2**20)
    monkeypatch.setattr(bigfile, "_available_ram_bytes", lambda: None)  # unknown: check skipped
    dg.make_big_array(tmp_path / "big.npy", nbytes=2**20)
    assert (tmp_path / "big.npy").stat().st_size > 2**20


# ---------------------------------------------------------------- metadata


@pytest.mark.parametrize("kind", ["str", "dict"])
def test_metadata_round_trip_and_packed_form(tmp_path, kind):
    dg.make_metadata(tmp_path / "m.bin", n=3000, kind=kind, seed=4, n_classes=12)
    items = dg.load_metadata(tmp_path / "m.bin")
    data, offsets = dg.load_metadata_packed(tmp_path / "m.bin")
    assert isinstance(items, list) and len(items) == 3000
    assert data.dtype == np.uint8 and offsets.dtype == np.int64 and offsets.shape == (3001,)
    assert offsets[0] == 0 and offsets[-1] == data.size
    assert [dg.packed_item(data, offsets, i, kind) for i in range(3000)] == items
    if kind == "str":
        assert all(isinstance(s, str) and s.endswith(".jpg") for s in items)
        assert len(set(items)) == 3000
    else:
        assert all(set(d) == {"path", "label"} and 0 <= d["label"] < 12 for d in items)
        assert all(d["path"].startswith(f"train/class_{d['label']:04d}/") for d in items)


def test_load_metadata_rejects_other_files(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(3))
    with pytest.raises(ValueError, match="not a data_gen metadata file"):
        dg.load_metadata(tmp_path / "x.npy")


# ---------------------------------------------------------------- CLI


def _cli(argv, capsys) -> tuple[int, str, str]:
    try:
        code = cli_main(argv)
    except SystemExit as exc:  # argparse's own errors and --help
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["frobnicate"], "invalid choice"),
        ([], "required"),
        (["images", "--out", "{tmp}/o", "--n", "-3"], "--n must be at least 1"),
        (["images", "--out", "{tmp}/o", "--n", "ten"], "invalid int"),
        (["npy", "--out", "{tmp}/o", "--corrupt-fraction", "1.5"], "between 0 and 1"),
        (["images", "--out", "{tmp}/o", "--kinds", "truncated,melted"], "unknown corrupt kind 'melted'"),
        (["bigarray", "--out", "{tmp}/b.npy", "--nbytes", "100T"], "refusing to write"),
        (["bigarray", "--out", "{tmp}/b.npy"], "exactly one"),
        (["images", "--out", "{tmp}/full"], "--force"),
        (["metadata", "--out", "{tmp}/afile/m.bin", "--n", "5"], "not a folder"),
        (["metadata", "--out", "{tmp}/m.bin", "--corrupt-fraction", "0.1"], "unrecognized"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, needle):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    (tmp_path / "afile").write_text("x")
    code, out, err = _cli([a.replace("{tmp}", str(tmp_path)) for a in argv], capsys)
    assert code == 2
    assert needle in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert out == ""
    assert not (tmp_path / "o").exists() and not (tmp_path / "b.npy").exists()


def test_cli_happy_paths_print_one_summary_line(tmp_path, capsys):
    runs = [
        (["images", "--out", f"{tmp_path}/img", "--n", "8", "--corrupt-fraction", "0.5", "--size", "12x10"], "img"),
        (["npy", "--out", f"{tmp_path}/npy", "--n", "6", "--shape", "2,3", "--kinds", "nan_inf"], "npy"),
        (["bigarray", "--out", f"{tmp_path}/big.npy", "--nbytes", "64K"], "big.npy"),
        (["metadata", "--out", f"{tmp_path}/m.bin", "--n", "100", "--kind", "dict"], "m.bin"),
    ]
    for argv, target in runs:
        code, out, err = _cli(argv, capsys)
        assert code == 0, err
        assert out.count("\n") == 1 and "manifest:" in out
        assert dg.Manifest.load(tmp_path / target).entries
    img = dg.Manifest.load(tmp_path / "img")
    assert img.params["size"] == [12, 10] and len(img.corrupt()) == 4
    assert len(dg.Manifest.load(tmp_path / "npy").broken()) == 1  # round(6 * 0.1) = 1
    code, out, _ = _cli(["images", "--out", f"{tmp_path}/img", "--n", "3", "--force"], capsys)
    assert code == 0 and len(dg.Manifest.load(tmp_path / "img").entries) == 3
    assert len(list((tmp_path / "img").rglob("*.*"))) == 4  # the old files are gone


def test_cli_as_a_module_without_traceback(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = [sys.executable, "-m", "data_gen"]
    ok = subprocess.run(run + ["--help"], capture_output=True, text=True, cwd=REPO, env=env)
    assert ok.returncode == 0 and "bigarray" in ok.stdout
    bad = subprocess.run(
        run + ["npy", "--out", str(tmp_path / "o"), "--dtype", "complex64"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().startswith("python -m data_gen npy: error: dtype must be")
