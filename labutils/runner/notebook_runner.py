"""Run by path as the script of an isolated run (:func:`labutils.runner.notebook.run_notebook`): start a
Jupyter kernel, execute the notebook in it cell by cell, emit what the kernel recorded, and leave no kernel
process behind. ``sys.argv[1]`` is the JSON config: ``path`` (the notebook) and ``start_method``.

The kernel's first cell (not the learner's) loads :mod:`labutils.runner.kernel_preamble` by path. A
failing cell is named by its index among the learner's cells and its first line of code.
"""

import json
import os
import runpy
import signal
import sys
import types

import nbformat
import psutil
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, DeadKernelError

_HERE = os.path.dirname(os.path.abspath(__file__))
_rd = types.SimpleNamespace(**runpy.run_path(os.path.join(_HERE, "rundir.py")))  # the run directory's names
PREAMBLE = os.path.join(_HERE, "kernel_preamble.py")
FIRST_CELL = f"__import__('runpy').run_path({PREAMBLE!r})['install'](get_ipython())\n"


class NotebookRun:
    """One notebook executed in a kernel started here."""

    def __init__(self, path: str, start_method):
        self.path = path
        self.run_dir = os.environ["LABUTILS_RUN_DIR"]
        self.evidence = os.path.join(self.run_dir, _rd.KERNEL)
        os.makedirs(self.evidence, exist_ok=True)
        os.environ["LABUTILS_KERNEL_EVIDENCE"] = self.evidence
        os.environ["LABUTILS_KERNEL_START_METHOD"] = start_method or ""
        self.nb = nbformat.read(path, as_version=4)
        self.original = list(self.nb.cells)
        self.nb.cells.insert(0, nbformat.v4.new_code_cell(FIRST_CELL))
        self.client = NotebookClient(self.nb, timeout=None, kernel_name="python3", allow_errors=False,
                                     resources={"metadata": {"path": os.path.dirname(path)}})
        self.client.on_cell_start = self.on_cell_start
        self.kernel_pid = self.cell = self.error = self.error_text = self.kernel_rc = None
        self.kernel_died = False

    def describe(self, cell_index: int) -> dict:
        idx = cell_index - 1
        src = self.original[idx].source if 0 <= idx < len(self.original) else ""
        code_index = sum(1 for c in self.original[:idx + 1] if c.cell_type == "code")
        head = next((ln for ln in src.splitlines() if ln.strip() and not ln.startswith("#")), src[:80])
        return {"index": idx, "code_index": code_index, "head": head[:120]}

    def emit(self, record: dict) -> None:
        with open(os.path.join(self.run_dir, _rd.EMITTED), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, default=repr) + "\n")

    def kernel_process(self):
        return getattr(getattr(self.client.km, "provisioner", None), "process", None) if self.client.km else None

    def on_cell_start(self, cell, cell_index):
        if self.kernel_pid is None:
            self.kernel_pid = getattr(self.kernel_process(), "pid", None)
        self.cell = cell_index
        if cell_index >= 1:  # the cell running now, in case the run is stopped (stall, time limit) in it
            self.emit({"notebook_cell": self.describe(cell_index)})

    def execute(self) -> None:
        try:
            self.client.execute()
        except CellExecutionError:
            self.error = "cell"
        except DeadKernelError as exc:
            self.error, self.kernel_died = "dead", True
            self.error_text = f"the kernel died: {exc}"[:300]
        except Exception as exc:  # noqa: BLE001 - nbclient's own failure is reported, not raised
            self.error = "runner"
            self.error_text = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            proc = self.kernel_process()
            if proc is not None:
                try:
                    self.kernel_rc = proc.wait(timeout=2)
                except Exception:  # noqa: BLE001 - a kernel still running: its code now, or None
                    self.kernel_rc = proc.poll()
            self.kill_leftovers()

    def ours(self) -> list:
        """Every process that carries this run's kernel evidence folder in its environment."""
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if proc.pid == os.getpid():
                continue
            try:
                if proc.environ().get("LABUTILS_KERNEL_EVIDENCE") == self.evidence:
                    found.append(proc)
            except (psutil.Error, OSError):
                continue
        return found

    def kill_leftovers(self) -> None:
        """SIGKILL what is left of the kernel: its process group if the kernel is still ours, then the
        kernel's workers; its resource tracker last, once it has unlinked what they left."""
        if self.kernel_pid:
            try:
                if psutil.Process(self.kernel_pid).ppid() == os.getpid():
                    os.killpg(os.getpgid(self.kernel_pid), signal.SIGKILL)
            except (psutil.Error, OSError):
                pass
        for proc in self.ours():
            if not _tracker(proc):
                _kill(proc)
        _gone, alive = psutil.wait_procs([p for p in self.ours() if _tracker(p)], timeout=5)
        for proc in alive:
            _kill(proc)

    def record(self) -> dict:
        cell = self.describe(self.cell) if self.error in ("cell", "dead") and (self.cell or 0) >= 1 else None
        streams = [(out.get("name"), out.get("text", "")) for c in self.nb.cells[1:]
                   for out in c.get("outputs", []) if out.get("output_type") == "stream"]
        return {
            "cell": cell, "error": self.error, "error_text": self.error_text, "kernel_died": self.kernel_died,
            "kernel_returncode": self.kernel_rc, "kernel_pid": self.kernel_pid,
            "exc": _rd.read_json(os.path.join(self.evidence, _rd.EXC)) if self.error == "cell" else None,
            "procs": _rd.read_jsonl(os.path.join(self.evidence, _rd.PROCS)),
            "exits": _rd.read_json(os.path.join(self.evidence, _rd.KERNEL_EXITS)) or {},
            "stdout": "".join(t for n, t in streams if n == "stdout"),
            "stderr": "".join(t for n, t in streams if n == "stderr"),
        }


def _tracker(proc) -> bool:
    return "resource_tracker" in " ".join(proc.info.get("cmdline") or [])


def _kill(proc) -> None:
    try:
        proc.kill()
    except psutil.Error:
        pass


def main() -> None:
    cfg = json.loads(sys.argv[1])
    run = NotebookRun(cfg["path"], cfg["start_method"])
    run.execute()
    run.emit({"notebook": run.record()})
    print(f"notebook {cfg['path']}: {run.error or 'ran to the end'}")


if __name__ == "__main__":
    main()
