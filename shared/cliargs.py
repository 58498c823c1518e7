"""What every command line of the fleet shares: defaults in ``--help``, and ``--version``."""
from __future__ import annotations

import argparse
from importlib import metadata

DIST = "redis-llm-fleet"


def version() -> str:
    """The installed package's version (``unknown`` when run from a bare checkout)."""
    try:
        return metadata.version(DIST)
    except metadata.PackageNotFoundError:
        return "unknown"


def _unset(default) -> bool:
    """None, False (a flag that is off), [] or suppressed: nothing worth printing."""
    return default is None or default is False or default == [] or default is argparse.SUPPRESS


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults formatter, except where the help already says its default, or
    the default is ``None``/``False`` (unset, off: the help says what that means)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if _unset(action.default) or "default" in text.lower():
            return text
        if not (action.option_strings or action.nargs in ("?", "*")):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and action.option_strings and not _unset(action.default):
            action.help = "(default: %(default)s)"  # an option without help shows its default
        return super()._format_action(action)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help shows defaults; its sub-parsers are the same kind."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)


def add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
