"""``python -m labutils preflight``: can this machine show every lesson? An attendee's check, in about a minute.

Real runs, nothing simulated: the doctor's checks, a look at the installed torch build (:func:`torch_build`),
one reproduction per family of failure (:data:`FAMILIES`, each the registry's broken script run isolated and
diagnosed) and one Jupyter kernel round trip (an ``%%isolate`` cell through nbclient). Then one line per
notebook: "this machine shows it", what it cannot show and why, or that it cannot run here. Exit status 1 when
a lesson cannot run (or the doctor has a FAIL), 2 for bad options, else 0.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import multiprocessing
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Callable, Optional, Sequence

from ..machine import probes
from ..machine.doctor import doctor
from ..runner.isolate import run_isolated
from ..runner.sizes import format_size
from ..scenarios import get_scenario

__all__ = ["CPU_WHEEL", "FAMILIES", "NOTEBOOKS", "Step", "Verdict", "preflight", "preflight_main", "torch_build",
           "verdicts"]

RECORDED = "(the notebook shows recorded results)"


#: the reproductions: each family's scenario (of the same name) and what it stands for
FAMILIES = {
    "worker_exception": "a Python exception in a worker",
    "oom_killed": "a worker killed over its memory budget",
    "native_crash": "a segfault in a worker",
    "shm_exhausted": "a full /dev/shm (a private 8 MiB one)",
    "fd_limit": "the open-files limit (128)",
    "hang": "a hang, stopped by a 5 s time limit",
    "unpicklable_dataset": "a dataset that spawn cannot pickle",
}
#: RunOptions fields changed for a shorter run
_SHORTER = {"hang": {"timeout": 5.0, "stall": None}}

#: what each notebook needs: requirement keys (see ``_REQUIREMENTS``) and families it reproduces
NOTEBOOKS = {
    "00_start_here": ("torch", "kernel", "native_crash"),
    "01_read_the_error": ("torch", "kernel", "worker_exception", "native_crash"),
    "02_spawn_and_pickling": ("torch", "kernel", "methods", "unpicklable_dataset"),
    "03_corrupt_data": ("torch", "kernel", "pillow", "native_crash"),
    "04_memory_and_oom": ("torch", "kernel", "oom_killed", "kernel_oom"),
    "05_shared_memory": ("torch", "kernel", "shm_exhausted"),
    "06_file_descriptors": ("torch", "kernel", "fd_limit"),
    "07_hangs_and_timeouts": ("torch", "kernel", "hang"),
    "08_main_module_and_guard": ("torch", "kernel", "methods"),
    "09_interactive_lab": ("torch", "kernel", "widgets"),
    "10_production_loader": ("torch", "kernel", "methods", "worker_exception"),
    "11_cuda_and_accelerators": ("torch", "kernel", "cuda"),
    "12_distributed_torchrun": ("torch", "kernel", "gloo"),
}


@dataclass
class Step:
    """One check of the pre-flight: ``status`` OK, WARN, FAIL, or SKIP (cannot be shown here: ``detail``
    says why); ``data`` holds what programs may read (the cause, the launcher, the memory enforcement)."""

    name: str
    status: str
    detail: str
    seconds: float = 0.0
    data: dict = field(default_factory=dict)

    def line(self) -> str:
        took = f" ({self.seconds:.1f} s)" if self.seconds >= 0.05 else ""
        return f"  {self.status:<4} {self.name:<19} {self.detail}{took}"


@dataclass
class Verdict:
    """One notebook: ``level`` is ``shows``, ``partly`` (a part only as recorded results) or ``cannot``."""

    notebook: str
    level: str
    text: str

    def line(self) -> str:
        return f"  {self.notebook:<25} {self.text}"


#: how to install the CPU wheel of the torch release that is there (PyTorch's own index of CPU wheels)
CPU_WHEEL = "python -m pip install --force-reinstall 'torch=={release}' --index-url https://download.pytorch.org/whl/cpu"
_GPU_PATHS = ("/proc/driver/nvidia/gpus/*", "/dev/nvidia[0-9]*")


def _disk_mib(paths) -> float:
    """MiB the files under ``paths`` take on disk (blocks used, links not followed)."""
    total = 0
    for top in paths:
        for folder, _dirs, files in os.walk(top):
            for name in files:
                try:
                    total += os.lstat(os.path.join(folder, name)).st_blocks * 512
                except OSError:
                    pass
    return total / 2**20


def torch_build(torch_dir: Optional[str] = None, gpu: Optional[bool] = None) -> Step:
    """The installed torch, read from its ``version.py`` (not imported): WARN for a CUDA build where no
    NVIDIA GPU is there, with what it takes on disk (torch and the ``nvidia`` packages beside it) and the
    command for the CPU wheel. ``torch_dir`` and ``gpu`` are for tests (default: this machine's)."""
    torch_dir = torch_dir or probes.torch_dir()
    values = probes.read_torch_version_file(torch_dir) if torch_dir else {}
    if not values:
        return Step("torch_build", "SKIP", "torch is not installed here (the doctor's torch check says more)")
    version, cuda = str(values.get("__version__", "?")), values.get("cuda")
    if cuda is None:
        return Step("torch_build", "OK", f"torch {version}: a CPU build", data={"version": version, "cuda": None})
    if gpu is None:
        gpu = any(glob.glob(pattern) for pattern in _GPU_PATHS)
    data = {"version": version, "cuda": cuda, "gpu": gpu}
    if gpu:
        return Step("torch_build", "OK", f"torch {version}: a CUDA {cuda} build, and an NVIDIA GPU is here",
                    data=data)
    site = os.path.dirname(torch_dir)
    parts = [torch_dir] + sorted(glob.glob(os.path.join(site, "nvidia")) + glob.glob(os.path.join(site, "triton")))
    mib = _disk_mib(parts)
    data["disk_mib"] = round(mib, 1)
    size = format_size(mib * 2**20)
    where = ", ".join(os.path.basename(p) for p in parts)
    release = version.split("+", 1)[0]
    return Step("torch_build", "WARN",
                f"torch {version} is a CUDA {cuda} build on a machine with no NVIDIA GPU: {size} on disk "
                f"({where}) that the lab cannot use here (it runs on the CPU all the same). To free it, "
                f"in this venv: {CPU_WHEEL.format(release=release)}, then `pip uninstall` the nvidia-* "
                f"packages `pip list` shows", data=data)


def reproduce(family: str, run: Optional[Callable] = None) -> Step:
    """Run one family's broken scenario isolated and check that the diagnosis names its cause."""
    what = FAMILIES[family]
    sc = get_scenario(family)
    options = replace(sc.broken_options, **_SHORTER.get(family, {}))
    t0 = time.monotonic()
    try:
        result = (run or run_isolated)(file=sc.path("broken"), **options.kwargs())
    except Exception as exc:  # noqa: BLE001  a machine that cannot run it is the finding
        return Step(family, "FAIL", f"{what}: the run could not start: {type(exc).__name__}: {exc}",
                    time.monotonic() - t0)
    seconds = time.monotonic() - t0
    launcher = (result.launcher or {}).get("kind") or "cold"
    enforced = (result.memory_limit or {}).get("enforced_by")
    data = {"cause": result.cause, "outcome": result.outcome, "launcher": launcher, "enforced_by": enforced,
            "reason": result.reason}
    if result.outcome == "unsupported":
        return Step(family, "SKIP", f"{what}: unsupported here: {result.reason}", seconds, data)
    how = f"{launcher} run" + (f", budget enforced by the {enforced}" if enforced else "")
    if result.cause != sc.expected:
        return Step(family, "FAIL", f"{what}: diagnosed {result.cause!r}, expected {sc.expected!r} "
                    f"({result.outcome}; {how})", seconds, data)
    return Step(family, "OK", f"{what}: diagnosed {result.cause} ({how})", seconds, data)


ROUND_TRIP = [
    "%load_ext labutils",
    "%%isolate -o probe --timeout 60 --quiet\nimport os\nprint('isolated in', os.getpid())",
    "assert probe.ok and 'isolated in' in probe.stdout, probe",
]


def kernel_round_trip(timeout: int = 120) -> Step:
    """Run a three-cell notebook in a real Jupyter kernel: ``%load_ext labutils``, an ``%%isolate`` cell,
    and a cell that reads its result back."""
    t0 = time.monotonic()
    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError as exc:
        return Step("jupyter kernel", "FAIL", f"nbclient/nbformat missing ({exc}): pip install -r "
                    "requirements.txt")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in ROUND_TRIP])
    with tempfile.TemporaryDirectory(prefix="labutils-preflight-") as work:
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": work}})
        try:
            client.execute()
        except Exception as exc:  # noqa: BLE001  the kernel's own error is the finding
            first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
            return Step("jupyter kernel", "FAIL", f"an %%isolate cell through nbclient failed: {first[:160]}",
                        time.monotonic() - t0)
    return Step("jupyter kernel", "OK", "a kernel started, ran an %%isolate cell and read its result back",
                time.monotonic() - t0)


def _has_module(name: str) -> Optional[str]:
    return None if importlib.util.find_spec(name) is not None else f"the {name} package is not installed"


def _requirement_torch(ctx: dict) -> tuple:
    check = ctx["doctor"]["torch"] if "torch" in ctx["doctor"] else None
    if check is None or check.status == "FAIL":
        return "cannot", f"torch cannot be imported ({check.detail if check else 'no torch check'})"
    return "ok", ""


def _requirement_methods(ctx: dict) -> tuple:
    missing = [m for m in ("fork", "spawn", "forkserver") if m not in multiprocessing.get_all_start_methods()]
    return ("cannot", f"start methods {', '.join(missing)} do not exist here") if missing else ("ok", "")


def _requirement_kernel_oom(ctx: dict) -> tuple:
    step = ctx["steps"].get("oom_killed")
    if step is None or step.status != "OK" or step.data.get("enforced_by") in (None, "kernel"):
        return "ok", ""
    return "partly", ("a kernel-enforced memory limit, because no cgroup memory limit can be set here (the lab's "
                      "watchdog enforces the budget instead, and the notebook says so)")


def _requirement_cuda(ctx: dict) -> tuple:
    if ctx.get("cuda"):
        return "ok", ""
    return "partly", "its GPU half, because this torch has no CUDA device (those cells say why they skip)"


def _requirement_module(name: str, why: str) -> Callable:
    def check(ctx: dict) -> tuple:
        missing = _has_module(name)
        return ("cannot", f"{missing} ({why})") if missing else ("ok", "")

    return check


def _requirement_gloo(ctx: dict) -> tuple:
    if not ctx.get("gloo"):
        return "cannot", "torch.distributed with the gloo backend is not available in this torch build"
    if ctx.get("loopback"):
        return "cannot", (f"torchrun's local rendezvous and gloo need TCP on 127.0.0.1, and here a listener on a "
                          f"free loopback port could not be reached ({ctx['loopback']})")
    return "ok", ""


def loopback_tcp(timeout: float = 5.0) -> Optional[str]:
    """None when a TCP listener on a free port of 127.0.0.1 accepts a connection from this process (what
    ``torchrun --standalone``'s store and gloo's ranks need); else what failed, in one line."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            server.settimeout(timeout)
            with socket.create_connection(server.getsockname(), timeout=timeout):
                conn, _addr = server.accept()
                conn.close()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _requirement_kernel(ctx: dict) -> tuple:
    step = ctx["steps"].get("jupyter kernel")
    if step is None or step.status == "OK":
        return "ok", ""
    return "cannot", f"a Jupyter kernel cannot run an %%isolate cell here: {step.detail}"


_REQUIREMENTS = {
    "torch": _requirement_torch,
    "kernel": _requirement_kernel,
    "methods": _requirement_methods,
    "kernel_oom": _requirement_kernel_oom,
    "cuda": _requirement_cuda,
    "pillow": _requirement_module("PIL", "the image decoder of the corrupt files"),
    "widgets": _requirement_module("ipywidgets", "the lab's widget"),
    "gloo": _requirement_gloo,
}


def _family_requirement(step: Optional[Step]) -> tuple:
    if step is None or step.status == "OK":
        return "ok", ""
    if step.status == "SKIP":
        reason = step.data.get("reason") or step.detail
        return "partly", f"{FAMILIES[step.name]}, because {reason} {RECORDED}"
    return "cannot", f"{FAMILIES[step.name]} did not reproduce: {step.detail}"


def verdicts(ctx: dict) -> list:
    """One :class:`Verdict` per notebook from ``ctx``: ``doctor`` (a DoctorReport), ``steps`` (name ->
    Step), ``cuda`` and ``gloo`` (bools), ``loopback`` (None, or why TCP on 127.0.0.1 failed); a family
    that was not run (``--only``) counts as not checked."""
    out = []
    for notebook, needs in NOTEBOOKS.items():
        found = {"cannot": [], "partly": []}
        unchecked = []
        for need in needs:
            if need in FAMILIES:
                if need not in ctx["steps"]:
                    unchecked.append(need)
                level, why = _family_requirement(ctx["steps"].get(need))
            else:
                level, why = _REQUIREMENTS[need](ctx)
            if level in found:
                found[level].append(why)
        if found["cannot"]:
            out.append(Verdict(notebook, "cannot", "it cannot run here, because " + "; ".join(found["cannot"])))
        elif found["partly"]:
            out.append(Verdict(notebook, "partly", "it cannot show " + "; nor ".join(found["partly"])))
        else:
            note = f" (its reproduction was left out by --only: {', '.join(unchecked)})" if unchecked else ""
            out.append(Verdict(notebook, "shows", "this machine shows it" + note))
    return out


def _torch_facts() -> tuple:
    try:
        import torch
        import torch.distributed as dist
    except Exception:  # noqa: BLE001  reported by the doctor's torch check
        return False, False
    gloo = bool(dist.is_available() and getattr(dist, "is_gloo_available", lambda: False)())
    return bool(torch.cuda.is_available()), gloo


@dataclass
class PreflightReport:
    doctor: object
    steps: list
    notebooks: list
    seconds: float

    @property
    def ok(self) -> bool:
        """No lesson that cannot run, and no FAIL from the doctor or a reproduction."""
        return (self.doctor.ok and all(s.status != "FAIL" for s in self.steps)
                and all(v.level != "cannot" for v in self.notebooks))

    def to_dict(self) -> dict:
        return {"ok": self.ok, "seconds": round(self.seconds, 1), "doctor": self.doctor.to_dict(),
                "steps": [asdict(s) for s in self.steps], "notebooks": [asdict(v) for v in self.notebooks]}

    def __str__(self) -> str:
        lines = ["doctor"] + ["  " + ln for ln in str(self.doctor).splitlines()]
        lines += ["reproductions and the kernel (real runs)"] + [s.line() for s in self.steps]
        lines += ["notebooks"] + [v.line() for v in self.notebooks]
        count = {lv: sum(v.level == lv for v in self.notebooks) for lv in ("shows", "partly", "cannot")}
        lines.append(f"-- preflight {'OK' if self.ok else 'FAILED'}: {count['shows']} notebook(s) shown here, "
                     f"{count['partly']} in part only, {count['cannot']} cannot run "
                     f"({self.seconds:.0f} s)")
        return "\n".join(lines)


def preflight(families: Optional[Sequence[str]] = None, kernel: bool = True, progress=None) -> PreflightReport:
    """Run the pre-flight (all families unless ``families`` names some; the kernel round trip unless
    ``kernel`` is False) and return its report; ``progress(step)`` is called after each step."""
    t0 = time.monotonic()
    chosen = list(FAMILIES) if families is None else list(families)
    unknown = [f for f in chosen if f not in FAMILIES]
    if unknown:
        raise ValueError(f"families {unknown}: use one of {', '.join(FAMILIES)}")
    report = doctor()
    steps = []
    jobs = [torch_build] + [partial(reproduce, f) for f in chosen] + ([kernel_round_trip] if kernel else [])
    for job in jobs:
        steps.append(job())
        if progress:
            progress(steps[-1])
    cuda, gloo = _torch_facts()
    ctx = {"doctor": report, "steps": {s.name: s for s in steps}, "cuda": cuda, "gloo": gloo,
           "loopback": loopback_tcp()}
    return PreflightReport(report, steps, verdicts(ctx), time.monotonic() - t0)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line and exit status 2, no traceback
        self.exit(2, f"preflight: {message}\n")


def _families_arg(text: str) -> list:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in FAMILIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: give families from {', '.join(FAMILIES)} (comma-separated)")
    return names


def preflight_main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _Parser(prog="python -m labutils preflight",
                     description="Check in about a minute that this machine can show every lesson of the lab.")
    parser.add_argument("--only", type=_families_arg, metavar="FAMILY[,FAMILY]",
                        help=f"reproduce only these families ({', '.join(FAMILIES)})")
    parser.add_argument("--no-kernel", action="store_true", help="skip the Jupyter kernel round trip")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)

    def show(step: Step) -> None:
        if not args.json:
            print(step.line(), file=sys.stderr, flush=True)

    if not args.json:
        print("preflight: the doctor, one real run per family of failure, a Jupyter kernel (about a minute)",
              file=sys.stderr, flush=True)
    report = preflight(args.only, kernel=not args.no_kernel, progress=show)
    print(json.dumps(report.to_dict(), indent=1) if args.json else str(report))
    return 0 if report.ok else 1
