"""fedhet's version, read from the installed package's metadata."""

from __future__ import annotations


def package_version() -> str:
    """The installed fedhet's version ("0+unknown" for a source tree that was never installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedhet")
    except PackageNotFoundError:
        return "0+unknown"
