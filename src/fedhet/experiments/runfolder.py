"""A run folder on disk: one writer at a time, only fedhet's own files touched, every file written atomically.

* Ownership by marker: a folder is fedhet's when its ``.fedhet.lock`` holds fedhet's marker (`Marker`: the kind of
  folder, run, sweep or recipe, the files fedhet wrote there and the pid of its last writer), written when fedhet
  creates the folder or finds it empty; never judged by the other files' names. A new run goes only into a missing
  or empty folder, or a run folder of fedhet's; ``overwrite`` removes the files its marker lists (and leftover
  temporary files of those), nothing else.
* Lock: a process that writes a folder holds an exclusive lock on its ``.fedhet.lock`` (released by the OS when
  the process ends, however it ends); a second writer is refused in one line (`FolderLock`).
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
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from fedhet.atomic import TEMP_SUFFIX, _replace, is_temp_of, open_plain, refuse_link, write_bytes, write_text
from fedhet.errors import ConfigError, FedhetError
from fedhet.experiments.checkpoint import CheckpointError, dump_view, loads
from fedhet.experiments.config import dump_yaml, load_yaml, parse_config
from fedhet.experiments.metrics_log import MetricsLog
from fedhet.summary_json import summary_text

CONFIG, METRICS, CLIENTS, SUMMARY, CHECKPOINT, BEST = (
    "config.yaml",
    "metrics.csv",
    "clients.csv",
    "summary.json",
    "checkpoint.pt",
    "best.pt",
)
LOCK, PARTICIPATION, NODE_STATE = ".fedhet.lock", "availability.npz", "node-state"
OWN_FILES = (CONFIG, METRICS, CLIENTS, SUMMARY, CHECKPOINT, PARTICIPATION, BEST)
MARKERS = (CONFIG, CHECKPOINT)  # in a run folder of fedhet's: there is a run to continue or replace
KINDS = ("run", "sweep", "recipe")
MAX_MARKER_BYTES = 1 << 20
# a new run folder's marker: its files, the trackers' record and the Flower simulation's node state
RUN_FILES = (*OWN_FILES, NODE_STATE, "tracking.json")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # a marker that is a link is not followed (nor written through)
STAGING_PREFIX = ".fedhet-staging-"
# keys of config.yaml that may change between a run's start and its resume: where the data is (not what it is),
# how many rounds to run (no component depends on the planned total; the runner evaluates the last round), and
# where the clients' state lives (the same rows in memory or on disk)
MOVABLE_KEYS = ("data_dir", "download", "rounds", "personal_state")


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
        self._lock: FolderLock | None = None

    # ---- opening ---------------------------------------------------------------------------------------------

    @classmethod
    def create(cls, path: Path, config_text: str, overwrite: bool = False) -> RunFolder:
        """Lock `path` for a new run (creating it), clear fedhet's files if `overwrite`, write config.yaml."""
        check_new(path, overwrite)
        folder = cls(path)
        folder._lock = FolderLock.claim(path, "run", RUN_FILES)
        try:
            if holds_run(path):
                if not overwrite:
                    raise RunFolderError(already_holds(path))
                remove_own_files(path, folder._lock.listed)
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
        marker = read_marker(path)
        if marker is None or marker.kind != "run" or not holds_run(path):
            what = "holds no run" if marker is not None and marker.kind == "run" else not_ours(path, marker)
            older = " (a run folder of fedhet 0.3.0 or earlier has none: continue it with that version)"
            old = marker is None and (path / CHECKPOINT).is_file() and (path / CONFIG).is_file()
            raise RunFolderError(f"'{path}' {what}{older if old else ''}; start a run with fedhet run --out NEW_FOLDER")
        refuse_links(path, marker)
        folder = cls(path)
        folder._lock = FolderLock.claim(path, "run")
        try:
            clean_leftovers(path)
        except BaseException:
            folder.close()
            raise
        return folder

    def close(self) -> None:
        """Release the lock."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def record(self, names: Iterable[str]) -> None:
        """List `names` in the folder's marker as fedhet's files (before they are written)."""
        assert self._lock is not None, "the run folder is not open"
        self._lock.record(names)

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
            entries = sorted(staging.iterdir())
            self.record(e.name for e in entries if e.is_file() and _bare(e.name))
            for entry in entries:
                target = self.path / entry.name
                if not (entry.is_file() and _bare(entry.name)):
                    raise RunFolderError(
                        f"a metric plugin wrote '{entry.name}', which is not a plain file with a plain name; a plugin "
                        "writes files (no folders, no names starting with a dot) into the folder it is given"
                    )
                if entry.name not in self.plugin_files:
                    self.plugin_files.append(entry.name)
                _replace(entry, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.plugin_files:
            self.record(self.plugin_files)
            summary = {**summary, "files": sorted(set(self.plugin_files))}
        write_text(self.path / SUMMARY, summary_text(summary))


# ---- the marker and the lock ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Marker:
    """What a folder's ``.fedhet.lock`` says: the folder is fedhet's (a `kind` of `KINDS`), the names of the files
    fedhet writes there (``--overwrite`` removes those, and only those), and the pid of its last writer."""

    kind: str
    files: tuple[str, ...] = ()
    pid: int | None = None

    def encode(self) -> bytes:
        return (json.dumps({"fedhet": self.kind, "pid": self.pid, "files": list(self.files)}) + "\n").encode()


def _parse_marker(data: bytes) -> Marker | None:
    try:  # the first JSON value: a shorter marker written over a longer one may leave the old tail after it
        found, _ = json.JSONDecoder().raw_decode(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(found, dict) or found.get("fedhet") not in KINDS:
        return None
    files = found.get("files")
    names = tuple(n for n in files if isinstance(n, str)) if isinstance(files, list) else ()
    pid = found.get("pid")
    return Marker(str(found["fedhet"]), names, pid if type(pid) is int else None)


def read_marker(path: Path) -> Marker | None:
    """The marker of folder `path`; None when it has none (no ``.fedhet.lock``, or one fedhet did not write)."""
    try:
        fd = os.open(path / LOCK, os.O_RDONLY | _NOFOLLOW)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            return _parse_marker(f.read(MAX_MARKER_BYTES))
    except OSError:  # a folder in its place
        return None


class FolderLock:
    """An exclusive lock on a folder of fedhet's, held until `close` (or the process ends): a lock on its
    ``.fedhet.lock``, which holds the folder's `Marker`."""

    def __init__(self, path: Path, handle: IO[bytes], marker: Marker) -> None:
        self.path, self._handle, self.marker = path, handle, marker
        self.listed = marker.files  # the files the marker listed before this claim (``--overwrite`` removes those)

    @classmethod
    def claim(cls, path: Path, kind: str, files: Iterable[str] = ()) -> FolderLock:
        """Lock `path` as fedhet's folder of `kind`, creating it, and its marker when it is new or empty; a folder
        that is not (`check_claimable`), or that another process holds, is refused in one line."""
        check_claimable(path, kind)
        try:
            path.mkdir(parents=True, exist_ok=True)
            fd = open_plain(path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)  # rewritten in place: never through a link
        except OSError as err:
            raise RunFolderError(f"cannot write the folder '{path}': {err.strerror or err}") from None
        handle = os.fdopen(fd, "r+b")
        found = _parse_marker(handle.read(MAX_MARKER_BYTES))
        if not _try_lock(handle):
            handle.close()
            pid = f" (pid {found.pid})" if found is not None and found.pid else ""
            raise RunFolderError(
                f"'{path}' is in use by another fedhet process{pid}; wait for it to end or choose another --out"
            )
        if found is not None and found.kind != kind:  # changed since the check: refused as the check would
            handle.close()
            raise RunFolderError(f"'{path}' {not_ours(path, found, kind)}; choose another --out")
        lock = cls(path, handle, Marker(kind, found.files if found is not None else (), os.getpid()))
        try:
            lock.record(files, always=True)
        except BaseException:
            lock.close()
            raise
        return lock

    def record(self, names: Iterable[str], always: bool = False) -> None:
        """Add `names` to the marker's files (rewriting it in place, under the lock: one write)."""
        new = tuple(dict.fromkeys(n for n in names if n not in self.marker.files))
        if not new and not always:
            return
        self.marker = Marker(self.marker.kind, self.marker.files + new, self.marker.pid)
        data = self.marker.encode()
        try:
            self._handle.seek(0)
            self._handle.write(data)
            self._handle.flush()
            self._handle.truncate(len(data))
        except OSError as err:
            err.filename = str(self.path / LOCK)
            raise

    def close(self) -> None:
        """Release the lock (closing the file releases it)."""
        self._handle.close()

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- folder checks and cleaning (module functions: the CLI checks before a Flower simulation starts) ------------


def holds_run(path: Path) -> bool:
    """Whether `path` is a run folder of fedhet's with a run in it (to continue or to replace)."""
    marker = read_marker(path)
    return marker is not None and marker.kind == "run" and any((path / name).exists() for name in MARKERS)


def already_holds(path: Path) -> str:
    return (
        f"'{path}' already holds a run; continue it with fedhet run --resume {path}, replace it with --overwrite, "
        "or choose another --out"
    )


def not_ours(path: Path, marker: Marker | None, kind: str = "run") -> str:
    """Why `path` is not fedhet's folder of `kind` (the middle of a one-line refusal)."""
    if marker is None:
        return f"is not a {kind} folder of fedhet's (it has no fedhet marker, {LOCK})"
    return f"is a fedhet {marker.kind} folder, not a {kind} folder"


def _is_empty(path: Path) -> bool:
    """No entries, or only a ``.fedhet.lock`` that holds no marker (left by a process killed while claiming)."""
    names = os.listdir(path)
    return not names or (names == [LOCK] and (path / LOCK).is_file() and not (path / LOCK).is_symlink())


def check_claimable(path: Path, kind: str) -> None:
    """Refuse, before anything is written, a `path` fedhet may not write a `kind` folder into: a file, a folder that
    is neither empty nor fedhet's folder of `kind` (by its marker), an unwritable place."""
    if path.exists() and not path.is_dir():
        raise RunFolderError(f"--out '{path}' is a file, not a folder; choose a folder")
    if path.is_dir():
        marker = read_marker(path)
        if marker is None and not _is_empty(path):
            raise RunFolderError(
                f"'{path}' is not empty and is not a fedhet {kind} folder (it has no fedhet marker, {LOCK}); choose "
                "a new or empty folder for --out (fedhet writes only into folders it created)"
            )
        if marker is not None and marker.kind != kind:
            raise RunFolderError(f"'{path}' {not_ours(path, marker, kind)}; choose another --out")
        if not os.access(path, os.W_OK | os.X_OK):
            raise RunFolderError(f"cannot write the folder '{path}': permission denied")
        return
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise RunFolderError(f"cannot create the folder '{path}': '{parent}' is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunFolderError(f"cannot create the folder '{path}': '{parent}' is not writable")


def check_new(path: Path, overwrite: bool) -> None:
    """Refuse, before anything is written, a `path` that cannot take a new run (a file, a folder that is neither
    empty nor fedhet's run folder, an unwritable place; a run unless `overwrite`)."""
    check_claimable(path, "run")
    if holds_run(path) and not overwrite:
        raise RunFolderError(already_holds(path))


def prepare_new(path: Path, overwrite: bool) -> None:
    """`check_new`, then claim `path` (its marker), and with `overwrite` remove the run already there (under the
    lock), so that a run started by another process (a Flower simulation) finds a fresh folder of fedhet's."""
    check_new(path, overwrite)
    with FolderLock.claim(path, "run", RUN_FILES) as lock:
        if overwrite and holds_run(path):
            remove_own_files(path, lock.listed)


def refuse_links(path: Path, marker: Marker | None = None) -> None:
    """Refuse (`LinkError`, one line) a folder of fedhet's whose marker, own files (`OWN_FILES` and those its
    `marker` lists) or node state is a symbolic or hard link: fedhet reads them, appends to metrics.csv and cuts it
    back, which would reach a file outside the folder."""
    marker = marker if marker is not None else read_marker(path)
    names = (LOCK, *OWN_FILES, NODE_STATE, *(marker.files if marker is not None else ()))
    for name in dict.fromkeys(n for n in names if n == LOCK or _bare(n)):
        refuse_link(path / name)


def _bare(name: str) -> bool:
    """A plain file name: no folder part, not hidden, not '.' or '..'."""
    return bool(name) and name == Path(name).name and "\\" not in name and not name.startswith(".")


def clean_leftovers(path: Path, names: Iterable[str] | None = None) -> None:
    """Remove what a killed fedhet process may have left: temporary files of fedhet's files (`names`, default: those
    of `OWN_FILES` and the marker) and staging folders."""
    if names is None:
        marker = read_marker(path)
        names = (*OWN_FILES, *(marker.files if marker is not None else ()))
    own = [n for n in names if _bare(n)]
    for name in os.listdir(path):
        entry = path / name
        if name.startswith(STAGING_PREFIX) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.is_file() and not entry.is_symlink() and any(is_temp_of(name, n) for n in own):
            entry.unlink(missing_ok=True)


def remove_own_files(path: Path, listed: Iterable[str] | None = None) -> None:
    """Remove the files the marker of run folder `path` lists (`listed`: what it listed before this process claimed
    it; not the marker, nothing else; nothing at all in a folder without fedhet's run marker). A link is removed,
    never what it leads to."""
    marker = read_marker(path)
    if marker is None or marker.kind != "run":
        return
    names = [n for n in dict.fromkeys(marker.files if listed is None else listed) if _bare(n)]
    for name in names:
        entry = path / name
        if name == NODE_STATE:
            if entry.is_dir() and not entry.is_symlink():
                for state in entry.iterdir():
                    if state.suffix in (".pt", TEMP_SUFFIX) and state.is_file() and not state.is_symlink():
                        state.unlink()
                if not any(entry.iterdir()):
                    entry.rmdir()
        elif entry.is_file() or entry.is_symlink():
            entry.unlink()
    clean_leftovers(path, names)


# ---- the lock --------------------------------------------------------------------------------------------------


def _try_lock(handle: IO[Any]) -> bool:
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
