"""Synthetic and corrupt data for the DataLoader Crash Lab (numpy + Pillow only, never torch).

Every generator is seeded and deterministic (same seed and arguments give byte-identical files and
manifest) and writes a JSON manifest next to its output that records, per file, whether it is corrupt
and how it fails when loaded. Command line: ``python -m data_gen --help``.
"""

from ._common import OutputExistsError
from ._version import __version__
from .arrays import NPY_FAILURES, NPY_KINDS, make_npy_folder
from .bigfile import DISK_SHARE, RAM_SHARE, check_big_array_size, make_big_array
from .checks import Problem, check_array, check_image, check_npy
from .images import BROKEN_IMAGE_KINDS, IMAGE_KINDS, make_image_folder
from .manifest import Entry, Manifest
from .metadata import METADATA_KINDS, load_metadata, load_metadata_packed, make_metadata, packed_item

__all__ = [
    "BROKEN_IMAGE_KINDS",
    "DISK_SHARE",
    "IMAGE_KINDS",
    "METADATA_KINDS",
    "NPY_FAILURES",
    "NPY_KINDS",
    "RAM_SHARE",
    "Entry",
    "Manifest",
    "OutputExistsError",
    "Problem",
    "__version__",
    "check_array",
    "check_big_array_size",
    "check_image",
    "check_npy",
    "load_metadata",
    "load_metadata_packed",
    "make_big_array",
    "make_image_folder",
    "make_metadata",
    "make_npy_folder",
    "packed_item",
]
