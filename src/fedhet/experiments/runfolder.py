"""A run folder on disk: one writer at a time, only fedhet's own files touched, every file written atomically.

* Lock: a process that writes a run folder holds an exclusive lock on its ``.fedhet.lock`` (released by the OS when
  the process ends, however it ends); a second writer is refused in one line.
* Ownership: a folder is a fedhet run folder when it holds ``config.yaml`` or ``checkpoint.pt``. A new run goes
  only into a missing or empty folder (or one holding only fedhet's files); ``overwrite`` removes fedhet's own
  files only (`OWN_FILES`, the files metric plugins wrote as listed in summary.json, leftover temporary files).
* Identity: the checkpoint records a hash of the run's config (`identity`), the length and hash of metrics.csv
  at its round, and its own checksum (`fedhet.experiments.checkpoint`); a resume refuses any mismatch.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from fedhet.atomic import TEMP_SUFFIX, _replace, is_temp_of, write_bytes, write_text
from fedhet.errors import ConfigError, FedhetError
from fedhet.experiments.checkpoint import CheckpointError, dump_view, loads
from fedhet.experiments.config import dump_yaml, load_yaml, parse_config
from fedhet.experiments.metrics_log import MetricsLog

CONFIG, METRICS, CLIENTS, SUMMARY, CHECKPOINT, BEST = (
    "config.yaml",
    "metrics.csv",
    "clients.csv",
    "summary.json",
    "checkpoint.pt",
    "best.pt",
)
LOCK, PARTICIPATION, NODE_STATE = ".fedhet.lock", "availability.npz", "node-state"
# folders that fedhet's Flower tools keep in a run folder (never removed by --overwrite): the simulation's node
# state, and scripts/flower_local.sh's deployment (SuperLink database, logs, partition files)
FLOWER_FOLDERS = (NODE_STATE, "deploy")
OWN_FILES = (CONFIG, METRICS, CLIENTS, SUMMARY, CHECKPOINT, PARTICIPATION, BEST)
MARKERS = (CONFIG, CHECKPOINT)
STAGING_PREFIX = ".fedhet-staging-"
# keys of config.yaml that may change between a run's start and its resume: where the data is (not what it is),
# and how many rounds to run (no component depends on the planned total; the runner evaluates the last round)
MOVABLE_KEYS = ("data_dir", "download", "rounds")


class RunFolderError(FedhetError):
    """A run folder cannot be used: in use, not a run, already holds a run, unwritable."""


def identity(resolved: dict[str, Any]) -> str:
    """The SHA-256 that identifies a run: its resolved config without `MOVABLE_KEYS`."""
    kept = {k: v for k, v in resolved.items() if k not in MOVABLE_KEYS}
    return hashlib.sha256(dump_yaml(kept).encode()).hexdigest()


class RunFolder:
    """An open, locked run folder (use as a context manager: the lock is held until it exits)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.metrics = MetricsLog(path / METRICS)
        self.plugin_files: list[str] = []
        self._lock: IO[str] | None = None

    # ---- opening ---------------------------------------------------------------------------------------------

    @classmethod
    def create(cls, path: Path, config_text: str, overwrite: bool = False) -> RunFolder:
        """Lock `path` for a new run (creating it), clear fedhet's files if `overwrite`, write config.yaml."""
        check_new(path, overwrite)
        folder = cls(path)
        folder._acquire()
        try:
            if holds_run(path):
                if not overwrite:
                    raise RunFolderError(already_holds(path))
                remove_own_files(path)
            clean_leftovers(path)
            write_text(path / CONFIG, config_text)
            folder.metrics.start()
        except BaseException:
            folder.close()
            raise
        return folder

    @classmethod
    def open(cls, path: Path) -> RunFolder:
        """Lock the existing run folder `path` to continue its run."""
        if not path.is_dir() or not holds_run(path):
            raise RunFolderError(
                f"'{path}' is not a run folder (no {CONFIG}); start a run with fedhet run --out {path}"
            )
        folder = cls(path)
        folder._acquire()
        try:
            clean_leftovers(path)
        except BaseException:
            folder.close()
            raise
        return folder

    def _acquire(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            handle = (self.path / LOCK).open("a+", encoding="utf-8")
        except OSError as err:
            raise RunFolderError(f"cannot write the run folder '{self.path}': {err.strerror or err}") from None
        if not _try_lock(handle):
            handle.seek(0)
            owner = handle.read().strip()
            handle.close()
            pid = f" (pid {owner})" if owner.isdigit() else ""
            raise RunFolderError(
                f"'{self.path}' is in use by another fedhet process{pid}; wait for it to end or choose another --out"
            )
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._lock = handle

    def close(self) -> None:
        """Release the lock."""
        if self._lock is not None:
            self._lock.close()  # closing the file releases the lock
            self._lock = None

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the run's files -------------------------------------------------------------------------------------

    def read_config(self) -> dict[str, Any]:
        """config.yaml as a raw mapping (errors name the file)."""
        if not (self.path / CONFIG).is_file():
            raise ConfigError(
                f"'{self.path}' has no {CONFIG}, without which its run cannot continue; restore it, or start afresh "
                f"with fedhet run --out {self.path} --overwrite"
            )
        raw = load_yaml(self.path / CONFIG)
        if not raw:
            raise ConfigError(
                f"'{self.path / CONFIG}' is empty; restore it, or start afresh with fedhet run --out {self.path} "
                "--overwrite"
            )
        try:
            parse_config(raw)
        except ConfigError as err:
            raise ConfigError(f"'{self.path / CONFIG}': {err}") from None
        return raw

    def write_config(self, config_text: str) -> None:
        write_text(self.path / CONFIG, config_text)

    def write_checkpoint(self, payload: dict[str, Any]) -> None:
        """Write checkpoint.pt atomically, recording where metrics.csv ends at this round."""
        log = self.metrics
        payload = {
            **payload,
            "metrics_columns": log.columns,
            "metrics_rows": len(log.rows),
            "metrics_sha256": log.sha256(),
        }
        write_bytes(self.path / CHECKPOINT, dump_view(payload))

    def write_best(self, params: Any, round_: int, metric: str, value: float) -> None:
        """Write best.pt atomically: the selected round's model (``selection``), in the checkpoint's safe format."""
        write_bytes(self.path / BEST, dump_view({"round": round_, "metric": metric, "value": value, "params": params}))

    def read_checkpoint(self) -> dict[str, Any] | None:
        """The checkpoint's payload (None when the run has none yet); format and checksum checked."""
        path = self.path / CHECKPOINT
        if not path.exists() and not path.is_symlink():
            return None
        try:
            return loads(path, f"checkpoint '{path}'")
        except CheckpointError as err:
            raise CheckpointError(
                f"{err}; delete it to restart this run from round 0, or start afresh with fedhet run --out "
                f"{self.path} --overwrite"
            ) from None

    def restore_metrics(self, saved: dict[str, Any] | None) -> list[dict[str, float]]:
        """Cut metrics.csv back to the checkpoint's round and return its rows (the run's history)."""
        if saved is None:
            self.metrics.start()
            return []
        try:
            columns, count, sha = saved["metrics_columns"], saved["metrics_rows"], saved["metrics_sha256"]
            if not (isinstance(columns, list) and all(isinstance(c, str) for c in columns)) or type(count) is not int:
                raise ValueError("the checkpoint does not describe it")
            return self.metrics.restore(columns, count, str(sha))
        except (ValueError, KeyError) as err:
            raise CheckpointError(
                f"'{self.metrics.path}' does not match the checkpoint ({err}); restore it, or start afresh with "
                f"fedhet run --out {self.path} --overwrite"
            ) from None

    def save_plugin_files(self, save: Iterable[Any]) -> None:
        """Let each metric plugin write its files (``plugin.save(folder)``) into a private staging folder, then
        move them in one by one atomically."""
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.path))
        try:
            for plugin in save:
                plugin.save(staging)
            for entry in sorted(staging.iterdir()):
                target = self.path / entry.name
                if entry.is_dir():
                    shutil.rmtree(target, ignore_errors=True)
                if entry.name not in self.plugin_files:
                    self.plugin_files.append(entry.name)
                _replace(entry, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.plugin_files:
            summary = {**summary, "files": sorted(set(self.plugin_files))}
        write_text(self.path / SUMMARY, json.dumps(summary, indent=2) + "\n")


# ---- folder checks and cleaning (module functions: the CLI checks before a Flower simulation starts) ------------


def holds_run(path: Path) -> bool:
    """Whether `path` is a fedhet run folder."""
    return any((path / name).exists() for name in MARKERS)


def already_holds(path: Path) -> str:
    return (
        f"'{path}' already holds a run; continue it with fedhet run --resume {path}, replace it with --overwrite, "
        "or choose another --out"
    )


def check_new(path: Path, overwrite: bool) -> None:
    """Refuse, before anything is written, a `path` that cannot take a new run (a file, a folder of other files,
    an unwritable place; a run unless `overwrite`)."""
    if path.exists() and not path.is_dir():
        raise RunFolderError(f"--out '{path}' is a file, not a folder; choose a folder for the run")
    if path.is_dir():
        if holds_run(path):
            if not overwrite:
                raise RunFolderError(already_holds(path))
        elif _foreign(path):
            raise RunFolderError(
                f"'{path}' is not empty and is not a fedhet run folder; choose a new or empty folder for --out "
                "(fedhet never overwrites files it did not write)"
            )
        if not os.access(path, os.W_OK | os.X_OK):
            raise RunFolderError(f"cannot write the run folder '{path}': permission denied")
        return
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise RunFolderError(f"cannot create the run folder '{path}': '{parent}' is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunFolderError(f"cannot create the run folder '{path}': '{parent}' is not writable")


def prepare_new(path: Path, overwrite: bool) -> None:
    """`check_new`, then with `overwrite` remove the run already in `path` (under the lock), so that a run started
    by another process (a Flower simulation) finds a fresh folder."""
    check_new(path, overwrite)
    if overwrite and path.is_dir() and holds_run(path):
        folder = RunFolder(path)
        folder._acquire()
        try:
            remove_own_files(path)
        finally:
            folder.close()


def _foreign(path: Path) -> list[str]:
    """Entries of `path` that fedhet did not write."""
    return [name for name in os.listdir(path) if not _own_name(name)]


def _own_name(name: str) -> bool:
    if name in OWN_FILES or name == LOCK or name in FLOWER_FOLDERS or name.startswith(STAGING_PREFIX):
        return True
    return any(is_temp_of(name, own) for own in OWN_FILES)


def clean_leftovers(path: Path) -> None:
    """Remove what a killed fedhet process may have left: temporary files and staging folders."""
    for name in os.listdir(path):
        entry = path / name
        if name.startswith(STAGING_PREFIX) and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        elif name.startswith(".") and name.endswith(TEMP_SUFFIX) and entry.is_file():
            entry.unlink(missing_ok=True)


def remove_own_files(path: Path) -> None:
    """Remove fedhet's files from the run folder `path` (not the lock, not anything a user put there)."""
    names = list(OWN_FILES)
    try:
        listed = json.loads((path / SUMMARY).read_text(encoding="utf-8")).get("files", [])
        names.extend(n for n in listed if isinstance(n, str) and n == Path(n).name and not n.startswith("."))
    except (OSError, ValueError, AttributeError):
        pass
    for name in names:
        entry = path / name
        if entry.is_file() or entry.is_symlink():
            entry.unlink()
    node_state = path / NODE_STATE
    if node_state.is_dir():
        for entry in node_state.iterdir():
            if entry.suffix in (".pt", TEMP_SUFFIX) and entry.is_file():
                entry.unlink()
        if not any(node_state.iterdir()):
            node_state.rmdir()
    clean_leftovers(path)


# ---- the lock --------------------------------------------------------------------------------------------------


def _try_lock(handle: IO[str]) -> bool:
    """Take an exclusive, non-blocking lock on the open file `handle`; False if another process holds it."""
    if sys.platform == "win32":  # pragma: no cover
        import msvcrt

        try:
            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    import fcntl

    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
