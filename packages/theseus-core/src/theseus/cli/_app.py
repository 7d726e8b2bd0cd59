"""The ``theseus`` command group: shared options, readable errors, plug-in verbs.

Every verb accepts ``--import MODULE_OR_FILE`` (repeatable) and ``--debug``.
Without ``--debug`` an error is printed as one paragraph and the exit code is 1;
with it the traceback is shown. Ctrl-C in a job (which stops it at a step boundary, see
``theseus.job._signals``) exits with 130, as SIGTERM exits with 143. Extra verbs come from the entry-point group
``theseus.cli`` (each entry point is a click command or group), loaded only
when listed or invoked, so core never imports the packages that add them.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, TypeVar

import click

from theseus.cli._cluster import join_from_context
from theseus.errors import TheseusError
from theseus.job import Interrupted
from theseus.registry import import_module_or_file

F = TypeVar("F", bound=Callable[..., Any])

ENTRY_POINT_GROUP = "theseus.cli"
#: ``ctx.meta`` key of the ``--import`` targets a verb was given, in order.
IMPORTS = "theseus.imports"
_DEBUG = "theseus.debug"


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.meta[_DEBUG] = True
    return value


def _do_imports(
    ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    ctx.meta.setdefault(IMPORTS, []).extend(value)  # `theseus submit` passes them on
    if value:  # a verb with cluster options joins before user code can touch devices
        join_from_context(ctx)
    for target in value:
        try:
            import_module_or_file(target)
        except Exception as exc:
            _report(ctx, exc)
    return value


def configure_logging() -> None:
    """Progress lines of Theseus (`theseus.*` loggers) on stderr; libraries only warn.

    Called by the command line, which owns the process; a library user configures
    logging themselves.
    """
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logging.getLogger("theseus").setLevel(logging.INFO)
    for noisy in ("absl", "orbax", "jax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def common_options(f: F) -> F:
    """Add ``--import`` (repeatable) and ``--debug`` to a command."""
    f = click.option(
        "--debug",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_set_debug,
        help="Show the full traceback of an error.",
    )(f)
    f = click.option(
        "--import",
        "imports",
        multiple=True,
        metavar="MODULE_OR_FILE",
        expose_value=False,
        callback=_do_imports,
        help="Import a module or .py file first (registers its jobs); repeatable.",
    )(f)
    return f


def _report(ctx: click.Context, exc: BaseException) -> None:
    if ctx.meta.get(_DEBUG):
        raise exc
    message = " ".join(str(exc).split()) or type(exc).__name__
    notes = " ".join(getattr(exc, "__notes__", ()))  # e.g. which user method raised it
    if notes:
        message = f"{message} {notes}"
    click.echo(
        f"Error ({type(exc).__name__}): {message} (Run with --debug for the traceback.)", err=True
    )
    ctx.exit(1)


class PluginError(TheseusError, RuntimeError):
    """A plug-in verb from the ``theseus.cli`` entry-point group that cannot be used."""


class TheseusGroup(click.Group):
    """A click group that prints errors as a paragraph and loads plug-in verbs lazily."""

    def _plugins(self) -> dict[str, Any]:
        return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._plugins()))

    def _load(self, name: str) -> click.Command | None:
        ep = self._plugins().get(name)
        if ep is None:
            return None
        try:
            loaded = ep.load()
        except Exception as exc:
            raise PluginError(
                f"Could not load the '{name}' command ({ep.value}, entry-point group "
                f"{ENTRY_POINT_GROUP!r}): {type(exc).__name__}: {exc}. Reinstall the package "
                "that provides it."
            ) from exc
        if not isinstance(loaded, click.Command):
            raise PluginError(
                f"Entry point {name} = {ep.value} in group {ENTRY_POINT_GROUP!r} must be "
                f"a click command or group; got {type(loaded).__name__}."
            )
        return loaded

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        try:
            return self._load(cmd_name)
        except PluginError as exc:
            _report(ctx, exc)
            return None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            try:
                command = super().get_command(ctx, name) or self._load(name)
            except PluginError as exc:
                rows.append((name, f"(cannot load: {exc})"))
                continue
            if command is not None and not command.hidden:
                # the whole first sentence, wrapped, never cut with "..."
                rows.append((name, command.get_short_help_str(limit=1000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
        with formatter.section("The store"):
            formatter.write_text(
                "Each root's lineages, values, checkpoints and artifacts are read with "
                "theseus-store: `theseus-store runs ROOT`, then `show`, `get`, "
                "`lineage` and `fsck` (see `theseus-store --help`). Every command takes ROOT "
                "as the root folder, its store folder (ROOT/store) or a "
                "postgresql://USER@HOST:PORT/DB?files=DIR URL."
            )

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except Interrupted as stopped:  # Ctrl-C in a job: it said where it stopped
            raise click.exceptions.Exit(stopped.code) from stopped
        except Exception as exc:
            _report(ctx, exc)


@click.group(cls=TheseusGroup, context_settings={"help_option_names": ["-h", "--help"]})
@common_options
def main() -> None:
    """Theseus: train language models and look inside them.

    Jobs are registered by name; import your own with --import FILE.py.
    """
    configure_logging()
