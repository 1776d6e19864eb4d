# parity: fast
# The script imports its own modules: a sibling file and a package with a relative import inside.
import helper
from pkg import tools

print(helper.greet(), tools.twice(21), tools.__name__, helper.__name__)
