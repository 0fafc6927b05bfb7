"""``reroll sandbox prune``: sweep what killed rollouts left behind, through the backend's ``prune``."""

from __future__ import annotations

from typing import Annotated

import typer
from reroll_contracts.errors import RerollError

from reroll.cli.common import console, refuse


def sandbox_prune(
    run_id: Annotated[
        str | None, typer.Option(help="Only this run's containers (its run folder's name), running or not.")
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="Also the containers of rollouts still running.")
    ] = False,
    sandbox: Annotated[
        str, typer.Option(help="The backend to sweep: docker, local, local-plain or a dotted path.")
    ] = "docker",
) -> None:
    """Remove leftover docker containers (their reroll process is gone), unused networks and their
    firewall tables (nftables ``inet reroll_*``; reroll's own only).

    That is the docker backend's prune; --sandbox names another backend's: local unmounts the
    sized file systems of killed rollouts, frees their host id ranges (killing what still runs
    under them) and removes the unpacked task images whose Docker image
    is gone (never one a running sandbox uses); local-plain has nothing to sweep."""
    from reroll.sandbox.base import load_backend

    try:
        removed = load_backend(sandbox).prune(None, run_id, running=all_)
    except RerollError as exc:
        refuse(exc)
    if sandbox != "docker":
        kinds = [kind for kind in removed if kind != "kept"]
        if not kinds:
            console.print(f"nothing to prune for the {sandbox} sandbox")
        for kind in kinds:
            console.print(f"removed {len(removed[kind])} {kind}: {' '.join(removed[kind])}")
        return
    console.print(f"removed {len(removed['containers'])} containers: {' '.join(removed['containers'])}")
    if removed["volumes"]:
        console.print(f"removed {len(removed['volumes'])} volumes: {' '.join(removed['volumes'])}")
    console.print(f"removed {len(removed['networks'])} networks: {' '.join(removed['networks'])}")
    if removed["firewall_tables"]:
        tables = " ".join(removed["firewall_tables"])
        console.print(f"removed {len(removed['firewall_tables'])} firewall tables (nftables): {tables}")
    if removed["kept"]:
        console.print(f"kept {len(removed['kept'])} containers of running rollouts (--all removes them too)")
