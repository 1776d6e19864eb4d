#!/usr/bin/env bash
# Run the GPU cells of the lab on a CUDA machine: notebook 11 (and its solutions) and the pin-memory parts
# of notebooks 10 and 10b, under fork and under forkserver (Python 3.14's default, through the lab's
# switch). On a machine where torch.cuda.is_available() is False it refuses, with the reason.
#
#   tests/gpu/run_gpu_cells.sh            # both start methods
#   tests/gpu/run_gpu_cells.sh fork       # one
#
# The notebooks' GPU cells print "has not yet been checked on a GPU by the lab"; once this script passes on
# a GPU, report the outputs (the executed notebooks go to $OUT_DIR/<method>/, by default
# /tmp/lab-gpu-cells/<method>/) so that the text can be checked against them.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-python}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "run_gpu_cells.sh: torch.cuda.is_available() is False here ($("$PY" -c 'import torch; print("torch", torch.__version__, "CUDA build", torch.version.cuda)' 2>/dev/null || echo 'torch not importable')): this script needs a CUDA GPU; nothing was run." >&2
  exit 2
fi

METHODS=("$@")
[ ${#METHODS[@]} -eq 0 ] && METHODS=(fork forkserver)
for m in "${METHODS[@]}"; do
  case "$m" in fork|forkserver) ;; *) echo "run_gpu_cells.sh: start method '$m': use fork or forkserver" >&2; exit 2;; esac
done

NOTEBOOKS=(notebooks/11_cuda_and_accelerators.ipynb notebooks/solutions/11_cuda_and_accelerators_solutions.ipynb)
# the pin-memory parts of 10 and 10b are cells of whole notebooks: run them whole
NOTEBOOKS+=(notebooks/10_production_loader.ipynb notebooks/10b_recommended_loader.ipynb)

status=0
for m in "${METHODS[@]}"; do
  out="${OUT_DIR:-/tmp/lab-gpu-cells}/$m"
  mkdir -p "$out"
  echo "== start method $m: ${NOTEBOOKS[*]}"
  if ! "$PY" -m pytest -n 0 -p no:randomly --lab-also-start-method none --lab-start-method "$m" \
       "${NOTEBOOKS[@]}" -rA 2>&1 | tee "$out/pytest.log"; then
    status=1
  fi
  for nb in "${NOTEBOOKS[@]}"; do  # the executed notebooks, outputs kept, for the record
    LABUTILS_START_METHOD="$m" "$PY" -m jupyter nbconvert --to notebook --execute --ExecutePreprocessor.timeout=600 \
      --output-dir "$out" "$nb" >/dev/null 2>&1 || echo "  (nbconvert of $nb failed under $m; see pytest.log)"
  done
done
exit $status
