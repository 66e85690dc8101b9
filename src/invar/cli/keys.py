"""`invar keys`: the Ed25519 key pairs that sign decision receipts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from invar.cli.common import JsonOpt, emit_model

app = typer.Typer(help="Key pairs that sign decision receipts.", no_args_is_help=True, rich_markup_mode=None)


@app.command("new")
def new(
    out: Annotated[Path, typer.Option("--out", help="Folder for the key pair.")] = Path("keys"),
    name: Annotated[str, typer.Option("--name", help="File stem: writes NAME.key and NAME.pub.")] = "invar",
    as_json: JsonOpt = False,
) -> None:
    """Make an Ed25519 key pair: NAME.key (private, owner-only) and NAME.pub (give it to whoever verifies)."""
    from invar.contract.receipt import new_key_pair  # cryptography: imported when a key is made, not at --help

    key, pub, fp = new_key_pair(out, name)
    if as_json:
        from invar.cli.outputs import KeysNewOutput  # the models cost a start that prints text nothing

        emit_model(KeysNewOutput(private_key=str(key), public_key=str(pub), key_sha256=fp))
        return
    typer.echo(f"private key {key} (keep it; it signs receipts)")
    typer.echo(f"public key  {pub} (give it to verifiers)")
    typer.echo(f"key sha256  {fp}")
