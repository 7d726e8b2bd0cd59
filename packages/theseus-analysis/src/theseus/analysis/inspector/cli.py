"""The command line: ``theseus inspect show FILE`` and ``theseus inspect diff FILE REF``.

``theseus-core``'s ``theseus`` command finds this group through the
``theseus.cli`` entry point; ``python -m theseus.analysis.inspector`` runs it alone.
``diff`` exits with status 1 when anything differs, so it can gate a port in CI;
unreadable input exits with status 2.
"""

from __future__ import annotations

from typing import Any

import click

from ._compare import KeyComparison, compare_recordings, key_statistics
from ._errors import InspectorError
from ._read import read_from_safetensors, read_metadata, recording_files

__all__ = ["inspect"]


def _load(path: str, key_pattern: str) -> dict[str, Any]:
    try:
        return read_from_safetensors(path, framework="numpy", key_pattern=key_pattern)
    except InspectorError as error:
        raise click.UsageError(str(error)) from None


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3e}"


@click.group(name="inspect")
def inspect() -> None:
    """Show or compare recordings of a forward pass (safetensors files or folders)."""


@inspect.command()
@click.argument("file", type=click.Path(exists=True))
@click.option(
    "--key-pattern", default=".*", show_default=True, help="Regex; keys where it matches."
)
@click.option("--meta", is_flag=True, help="Print each file's metadata (the recorded key order).")
def show(file: str, key_pattern: str, meta: bool) -> None:
    """Print shape, dtype, mean, std, min, max, NaN and Inf counts of each key of FILE."""
    data = _load(file, key_pattern)
    if meta:
        for part in recording_files(file):
            click.echo(f"# {part}")
            metadata = read_metadata(part)
            for index in sorted(
                metadata, key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0, k)
            ):
                click.echo(f"#   {index}: {metadata[index]}")
    width = max([len(k) for k in data] + [3])
    click.echo(
        f"{'key':<{width}}  {'shape':<18} {'dtype':<9} {'mean':>10} {'std':>10} "
        f"{'min':>10} {'max':>10} {'nan':>6} {'inf':>6}"
    )
    for key, array in data.items():
        s = key_statistics(array)
        click.echo(
            f"{key:<{width}}  {s['shape']!s:<18} {s['dtype']:<9} {s['mean']:>10.3e} "
            f"{s['std']:>10.3e} {s['min']:>10.3e} {s['max']:>10.3e} {s['nan']:>6} {s['inf']:>6}"
        )
    click.echo(f"{len(data)} keys")


def _line(result: KeyComparison, width: int) -> str:
    if result.status == "only-file":
        detail = f"only in FILE, shape {result.shapes[0]}"
    elif result.status == "only-ref":
        detail = f"only in REF, shape {result.shapes[1]}"
    elif result.status == "shape":
        detail = f"shape mismatch: {result.shapes[0]} vs {result.shapes[1]}"
    else:
        detail = (
            f"max abs {_number(result.max_abs)}  max rel {_number(result.max_rel)}  "
            f"{result.exceed}/{result.total} exceed"
        )
    label = {"close": "close", "differs": "DIFFERS", "shape": "SHAPE"}.get(result.status, "MISSING")
    return f"{result.key:<{width}}  {label:<7}  {detail}"


@inspect.command()
@click.argument("file", type=click.Path(exists=True))
@click.argument("ref", type=click.Path(exists=True))
@click.option("--key-pattern", default=".*", show_default=True, help="Regex on FILE's keys.")
@click.option(
    "--key-map",
    nargs=2,
    multiple=True,
    metavar="PATTERN REPLACEMENT",
    help="Rename FILE's keys (re.sub, applied in the order given); repeatable.",
)
@click.option("--rtol", default=1e-5, show_default=True, help="Relative tolerance (vs REF).")
@click.option("--atol", default=1e-6, show_default=True, help="Absolute tolerance.")
def diff(
    file: str,
    ref: str,
    key_pattern: str,
    key_map: tuple[tuple[str, str], ...],
    rtol: float,
    atol: float,
) -> None:
    """Compare FILE with the reference REF key by key; exit 1 when anything differs."""
    data = _load(file, key_pattern)
    reference = _load(ref, ".*")
    try:
        results = compare_recordings(data, reference, key_map, rtol=rtol, atol=atol)
    except InspectorError as error:
        raise click.UsageError(str(error)) from None
    if key_pattern != ".*":
        results = [r for r in results if r.status != "only-ref"]
    width = max([len(r.key) for r in results] + [3])
    for result in results:
        click.echo(_line(result, width))
    counts = {
        status: sum(r.status == status for r in results)
        for status in ("close", "differs", "shape", "only-file", "only-ref")
    }
    click.echo(
        f"{counts['close']} close, {counts['differs']} differ, {counts['shape']} shape "
        f"mismatches, {counts['only-file']} only in FILE, {counts['only-ref']} only in REF "
        f"(rtol={rtol:g}, atol={atol:g})"
    )
    if results and counts["only-file"] + counts["only-ref"] == len(results):
        click.echo(
            "no key in common: rename FILE's keys with --key-map PATTERN REPLACEMENT "
            "(e.g. --key-map '\\.forward$' '.__call__' for PyTorch against JAX)."
        )
    if counts["close"] != len(results):
        raise SystemExit(1)
