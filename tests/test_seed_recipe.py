"""labutils/kit/seed_recipe.py is the recipe notebook 10 writes, cell by cell (notebook 10b copies it)."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _written_by_notebook_10() -> str:
    cells = json.loads((ROOT / "notebooks" / "10_production_loader.ipynb").read_text())["cells"]
    parts = []
    for cell in cells:
        src = "".join(cell["source"])
        first = src.split("\n", 1)[0]
        if cell["cell_type"] == "code" and first.startswith("%%writefile") and first.endswith("seed_recipe.py"):
            parts.append(src.split("\n", 1)[1])
    assert parts, "notebook 10 writes seed_recipe.py with %%writefile cells"
    return "\n".join(parts)


def _lines(text: str) -> list:
    return [ln.rstrip() for ln in text.splitlines() if ln.strip()]


def test_module_is_the_notebooks_recipe():
    module = (ROOT / "labutils" / "kit" / "seed_recipe.py").read_text()
    assert _lines(module) == _lines(_written_by_notebook_10())


def test_recipe_keeps_the_settings_the_notebooks_measure():
    module = (ROOT / "labutils" / "kit" / "seed_recipe.py").read_text()
    for setting in ('set_sharing_strategy("file_system")', "prefetch_factor=4", "pin_memory=True",
                    "timeout=60", "exit(0)", 'set_start_method("spawn", force=True)',
                    "if consecutive_errors >= max_consecutive_errors"):
        assert setting in module, setting
