"""Tables for the command line and the benchmark scripts, drawn by ``rich``."""

from __future__ import annotations

import io
from typing import Any, Sequence


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A table with a header; ``-`` for missing values. Never wrapped or cut: it is as wide
    as its cells, whatever the terminal."""
    if not rows:
        return "(no rows)"
    from rich import box
    from rich.console import Console
    from rich.table import Table

    columns = list(columns or rows[0].keys())
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, highlight=False)
    for c in columns:
        table.add_column(str(c), no_wrap=True, overflow="ignore")
    for row in cells:
        table.add_row(*row)
    width = sum(max(len(str(c)), *(len(r[i]) for r in cells)) + 3
                for i, c in enumerate(columns)) + 4
    out = io.StringIO()
    Console(file=out, width=width, no_color=True, color_system=None, highlight=False,
            markup=False, emoji=False).print(table)
    return "\n".join(line.rstrip() for line in out.getvalue().rstrip("\n").split("\n"))
