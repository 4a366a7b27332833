"""Tables for the command line and the benchmark scripts, drawn by ``rich``."""

from __future__ import annotations

import io
import sys
from typing import Any, Sequence


def progress_bar(total: int, desc: str, unit: str, enabled: bool = True):
    """A tqdm bar on stderr, only when asked for and stdout is a terminal; else None (the
    caller logs one line per step instead)."""
    if not enabled or not total or not sys.stdout.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, file=sys.stderr)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None,
                 fit: tuple[str, int] | None = None) -> str:
    """A table with a header; ``-`` for missing values. Never wrapped: it is as wide as its
    cells, whatever the terminal. ``fit=(column, width)`` cuts that column's cells (ending
    them in ``…``) so that the table is at most ``width`` characters wide."""
    if not rows:
        return "(no rows)"
    from rich import box
    from rich.console import Console
    from rich.table import Table

    columns = list(columns or rows[0].keys())
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]

    def widths() -> list[int]:  # each column's, with the gap after it
        return [max(len(str(c)), *(len(r[i]) for r in cells)) + 3
                for i, c in enumerate(columns)]

    if fit is not None and fit[0] in columns:
        i, w = columns.index(fit[0]), widths()
        room = max(len(str(fit[0])), fit[1] - (sum(w) - w[i] + 4) - 3)
        for r in cells:
            if len(r[i]) > room:
                r[i] = r[i][:room - 1].rstrip() + "…"
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, highlight=False)
    for c in columns:
        table.add_column(str(c), no_wrap=True, overflow="ignore")
    for row in cells:
        table.add_row(*row)
    width = sum(widths()) + 4
    out = io.StringIO()
    Console(file=out, width=width, no_color=True, color_system=None, highlight=False,
            markup=False, emoji=False).print(table)
    return "\n".join(line.rstrip() for line in out.getvalue().rstrip("\n").split("\n"))
