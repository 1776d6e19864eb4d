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


FLOOD = '''{"cells": [{"cell_type": "code", "execution_count": null, "metadata": {}, "outputs": [],
  "source": ["from IPython.display import display\\n", "for i in range(12000):\\n", "    display('x' * 400)\\n",
             "print('done')"]}],
 "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
 "nbformat": 4, "nbformat_minor": 5}
'''


def test_a_cell_that_sends_more_messages_than_zeromq_queues_still_ends(pytester):
    # 12,000 outputs before the reply: nbval alone reads none of them until the cell replies, ZeroMQ drops
    # what its queues cannot hold, the "idle" status with it, and the cell fails after its output wait
    # ("Timeout of 60 seconds exceeded waiting for output"); the plugin reads them while the cell runs
    pytester.makefile(".ipynb", flood=FLOOD)
    result = pytester.runpytest("-p", "labsuite.pytest_plugin", "-p", "no:cacheprovider", "--nbval-lax",
                                "flood.ipynb")
    result.assert_outcomes(passed=1)
