# parity: fast
# A python subprocess: same interpreter, output captured.
import subprocess
import sys

out = subprocess.run([sys.executable, "-c", "import sys; print(sys.argv[1:])", "a"], capture_output=True,
                     text=True, check=True)
print("child said", out.stdout.strip())
