# parity:
# No __main__ guard under spawn: the child re-runs the script and fails with the bootstrapping error.
import multiprocessing as mp

print("top level runs")
ctx = mp.get_context("spawn")
p = ctx.Process(target=print, args=("child",))
p.start()
p.join()
print("exitcode", p.exitcode)
