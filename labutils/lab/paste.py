"""The lab's "Paste your error" box: a log's text in, the same report as ``diagnose --log`` out (HTML, from
:func:`labutils.diagnosis.diagnose.explain_log`).
"""

from __future__ import annotations

import html

from ..diagnosis.diagnose import explain_log
from ..diagnosis.logread import LogError, read_text

PLACEHOLDER = ("Paste what the job printed: the traceback, the lines before it, dmesg or kubectl describe pod "
               "output...")


def report_html(text: str) -> str:
    """The report of a pasted text as HTML (one line for an empty paste)."""
    if not text.strip():
        return "<p><i>Paste a log above, then press Diagnose.</i></p>"
    try:
        d = explain_log(read_text(text))
    except LogError as exc:
        return f"<p><b>{html.escape(str(exc))}</b></p>"
    extra = "".join(f"<li>{html.escape(t)}</li>" for t in d.proves)
    return (d._repr_html_() + (f"<div>what the text proves:</div><ul>{extra}</ul>" if extra else "")
            + f"<pre style='display:none' class='lab-paste-report'>{html.escape(str(d))}</pre>")


def paste_panel():
    """An ipywidgets VBox: Textarea (``.children[0]``), Diagnose button (``[1]``), HTML report (``[2]``)."""
    import ipywidgets as w

    area = w.Textarea(placeholder=PLACEHOLDER, layout=w.Layout(width="100%", height="14em"))
    button = w.Button(description="Diagnose", button_style="primary", tooltip="name the cause from this text")
    out = w.HTML(report_html(""))

    def diagnose(_=None) -> None:
        out.value = report_html(area.value)

    button.on_click(diagnose)
    box = w.VBox([area, button, out])
    box.add_class("lab-paste")
    return box
