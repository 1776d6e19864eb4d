#!/usr/bin/env bash
# Run the GPU cells of the lab on a CUDA machine: notebook 11 (and its solutions) and the pin-memory parts
# of notebooks 10 and 10b, under fork and under forkserver (Python 3.14's default, through the lab's
# switch). On a machine where torch.cuda.is_available() is False it refuses, with the reason.
#
#   tests/gpu/run_gpu_cells.sh            # both start methods
#   tests/gpu/run_gpu_cells.sh fork       # one
#
# Each start method is one pytest (nbval) pass over the notebooks, the check, and beside it one execution of
# notebooks 11, its solutions and 02 with nbclient whose outputs are kept, the record: $OUT_DIR/<method>/, by
# default /tmp/lab-gpu-cells/<method>/. PYTHON picks the interpreter (default: python3, else python);
# GPU_JOBS the pytest processes (default 4: the notebooks run side by side).
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-$(command -v python3 || command -v python)}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "run_gpu_cells.sh: torch.cuda.is_available() is False here ($("$PY" -c 'import torch; print("torch", torch.__version__, "CUDA build", torch.version.cuda)' 2>/dev/null || echo 'torch not importable')): this script needs a CUDA GPU; nothing was run." >&2
  exit 2
fi
for mod in nbval nbclient ipykernel labutils; do
  "$PY" -c "import $mod" 2>/dev/null || { echo "run_gpu_cells.sh: $PY cannot import $mod: install requirements.txt first (pip install -r requirements.txt)" >&2; exit 2; }
done

METHODS=("$@")
[ ${#METHODS[@]} -eq 0 ] && METHODS=(fork forkserver)
for m in "${METHODS[@]}"; do
  case "$m" in fork|forkserver) ;; *) echo "run_gpu_cells.sh: start method '$m': use fork or forkserver" >&2; exit 2;; esac
done

# 11 is the GPU lesson; 02 has a GPU branch (CUDA in a worker, fork after CUDA)
RECORDED=(notebooks/11_cuda_and_accelerators.ipynb notebooks/solutions/11_cuda_and_accelerators_solutions.ipynb
          notebooks/02_spawn_and_pickling.ipynb)
# the pin-memory parts of 10 and 10b are cells of whole notebooks: run them whole (GPU_RECORDED_ONLY=1 skips them)
NOTEBOOKS=("${RECORDED[@]}")
[ "${GPU_RECORDED_ONLY:-0}" = 1 ] || NOTEBOOKS+=(notebooks/10_production_loader.ipynb notebooks/10b_recommended_loader.ipynb)

status=0
for m in "${METHODS[@]}"; do
  out="${OUT_DIR:-/tmp/lab-gpu-cells}/$m"
  mkdir -p "$out"
  echo "== start method $m: ${NOTEBOOKS[*]}"
  record_log=$(mktemp)
  LABUTILS_START_METHOD="$m" "$PY" - "$out" "${RECORDED[@]}" > "$record_log" 2>&1 <<'PY' &
import sys, os, nbformat
from nbclient import NotebookClient
out, paths = sys.argv[1], sys.argv[2:]
failed = 0
for path in paths:
    nb = nbformat.read(path, as_version=4)
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": os.path.dirname(path)}}).execute()
    except Exception as exc:  # the record keeps the outputs up to the failing cell
        failed += 1
        print(f"{path}: {type(exc).__name__}: {str(exc)[-2000:]}")
    nbformat.write(nb, os.path.join(out, os.path.basename(path)))
sys.exit(1 if failed else 0)
PY
  record=$!
  if ! "$PY" -m pytest -n "${GPU_JOBS:-4}" -p no:randomly --lab-also-start-method none --lab-start-method "$m" \
       "${NOTEBOOKS[@]}" -rA > "$out/pytest.log" 2>&1; then
    status=1
  fi
  tail -n 25 "$out/pytest.log"
  wait "$record" || { status=1; echo "  the recorded execution failed under $m:"; grep -v IPKernelApp "$record_log"; }
  rm -f "$record_log"
done
exit $status
