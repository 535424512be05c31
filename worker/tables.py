"""Plain-text tables and durations for people reading a terminal.

Operators scan columns, so every column is padded to its widest cell and
numbers line up on the right; scripts should use `--json` instead of parsing this.
"""

from __future__ import annotations

from collections.abc import Sequence

GAP = "  "


def render_table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, right: Sequence[int] = ()) -> str:
    """Aligned columns under a header line; `right` lists the columns (by index) that hold numbers."""
    cells = [[str(header) for header in headers], *[["-" if cell is None else str(cell) for cell in row] for row in rows]]
    widths = [max(len(row[column]) for row in cells) for column in range(len(headers))]
    lines = []
    for row in cells:
        padded = [
            cell.rjust(width) if column in right else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths))
        ]
        lines.append(GAP.join(padded).rstrip())
    return "\n".join(lines)


def human_duration(seconds: float) -> str:
    """`45s`, `1m20s`, `2h03m`, `3d04h`: the two largest units, rounded down (never negative)."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
