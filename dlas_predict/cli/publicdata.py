"""``data fetch``: the public measurements of other projects (HELP, TopHub), downloaded from
their repositories at pinned commits, checked and converted into DLAS_HOME."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from dlas_predict.cli.common import PLAIN, app, handle_errors, print_json

data_app = typer.Typer(no_args_is_help=True, **PLAIN,
                       help="Public data of other projects (HELP, TopHub): fetch it.")
app.add_typer(data_app, name="data")


@data_app.command("fetch")
@handle_errors
def data_fetch(sources: List[str] = typer.Argument(..., help="help | tophub | all"),
               from_dir: Optional[Path] = typer.Option(
                   None, "--from", help="A folder holding the upstream files (same paths as "
                   "the repositories), for a machine without network."),
               mirror: Optional[str] = typer.Option(
                   None, "--mirror", help="A base URL serving the upstream paths instead of "
                   "the repositories."),
               as_json: bool = typer.Option(False, "--json")):
    """Download HELP's NAS-Bench-201 latencies and TopHub's tuned kernels from their
    repositories (pinned commits, sha256 of every file) into DLAS_HOME/data; a file that
    fails its checksum is removed. Nothing fetched is shipped."""
    from dlas_predict.publicdata import UPSTREAM, fetch

    names = list(UPSTREAM) if "all" in sources else list(dict.fromkeys(sources))
    shown: dict[str, int] = {}

    def progress(path: str, done: int, size: int) -> None:
        pct = int(100 * done / size) if size else 100
        if not as_json and shown.get(path, -10) + 10 <= pct:
            shown[path] = pct
            typer.echo(f"  {path}: {pct}%", err=True)

    out = fetch(names, from_dir, mirror, progress)
    if as_json:
        print_json({k: str(v) for k, v in out.items()})
        return
    for name, folder in out.items():
        up = UPSTREAM[name]
        typer.echo(f"{name}: {len(up.files)} file(s) of {up.repository}@{up.commit[:7]} "
                   f"checked, converted into {folder}")
