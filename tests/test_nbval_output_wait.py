"""The plugin gives nbval's cells a longer wait for their messages than nbval's hard-coded 5 s."""

from labsuite import pytest_plugin


def test_notebook_cells_wait_longer_other_items_untouched():
    class Cell:
        output_timeout = 5

    class Longer:
        output_timeout = 300

    class Other:
        pass

    cell, longer, other = Cell(), Longer(), Other()
    pytest_plugin.pytest_collection_modifyitems(None, None, [cell, longer, other])
    assert cell.output_timeout == pytest_plugin.NBVAL_OUTPUT_TIMEOUT == 60
    assert longer.output_timeout == 300  # never shortened
    assert not hasattr(other, "output_timeout")
