"""``python -m fedhet``: the ``fedhet`` command line."""

from fedhet.cli.main import app

if __name__ == "__main__":  # pragma: no branch
    app(prog_name="fedhet")
