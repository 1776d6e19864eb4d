# parity: fast intended=environment
# The variables the lab adds to a run's environment (an intended difference: they name the run).
import os

added = ("LABUTILS_", "PYTHONUNBUFFERED", "TMPDIR", "TEMP", "TMP")
print(sorted(k for k in os.environ if k.startswith(added)))
