"""The disk cache: what is worth keeping between processes (every device's compiled binaries, BEAM's choices), by
table (a compiler's identity, or "beam") and key, in one directory (`LAZYGRAD_CACHE`, default ~/.cache/lazygrad).

Nothing found there can make a program compute a wrong value or run code lazygrad did not build:

- private: the directories are created 0700; a directory owned by another user or writable by group or others is
  refused with a warning, and kernels are then kept in memory only;
- verified: an entry starts with a header naming the hash of its table and key, its length and the hash of its
  content, all checked before any of it is used; a bad entry (truncated, swapped with another, not written by
  lazygrad) is removed, reported at DEBUG>=1, and built again;
- atomic: an entry is written to a temporary file in its directory, then renamed into place, so a reader sees a
  whole entry or none (and a crash mid-write leaves a file the check rejects, so nothing is synced to disk);
- out of the way: a cache that cannot be read or written (read-only, full) warns once, and the program goes on.

Directories are opened once and then used through their descriptors: a path changed afterwards (a symlink put in
place of a directory) cannot redirect a read or a write. Entries are trusted as far as the directory is: any
process of this user may write there, as it may anywhere else the user can.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import threading
import warnings

from lazygrad.helpers import CACHEDIR, CACHELEVEL, DEBUG

FORMAT = b"lazygrad-cache-1"  # the first word of every entry; a new layout gets a new word
HEADER_LIMIT = 256  # a header is shorter than this


class BadEntry(Exception):
    """An entry that fails its check; the message says how."""


def entry_name(table: str, key: str) -> str:
    """The file name of an entry: the hash of the format, its table and key (so versions of lazygrad that kept
    entries in another layout never read these, nor these versions theirs)."""
    return hashlib.sha256(b"%s\n%s\n%s" % (FORMAT, table.encode(), key.encode())).hexdigest()


def pack(name: str, value: bytes) -> bytes:
    """An entry's bytes: the header line, then the value."""
    return b"%s %s %d %s\n" % (FORMAT, name.encode(), len(value), hashlib.sha256(value).hexdigest().encode()) + value


def unpack(name: str, data: bytes) -> bytes:
    """The value of the entry `name` from its bytes, once the header is checked against them; else BadEntry."""
    end = data.find(b"\n", 0, HEADER_LIMIT)
    fields = data[:end].split(b" ") if end >= 0 else []
    if len(fields) != 4 or fields[0] != FORMAT:
        raise BadEntry("not an entry lazygrad wrote")
    value = data[end + 1 :]
    if fields[1] != name.encode():
        raise BadEntry("the entry of another key")
    if fields[2] != str(len(value)).encode():
        raise BadEntry(f"{len(value)} bytes where the header says {fields[2].decode(errors='replace')}")
    if fields[3] != hashlib.sha256(value).hexdigest().encode():
        raise BadEntry("its content does not match its hash")
    return value


class NotPrivate(Exception):
    """A directory other users may change; the message says why."""


def open_private(path: str, parent: int | None, follow: bool) -> int:
    """A descriptor of the directory `path` (in the directory `parent`), made 0700 where it is missing; NotPrivate
    where it belongs to another user or group or others may write to it."""
    try:
        os.mkdir(path, 0o700, dir_fd=parent)
        made = True
    except FileExistsError:
        made = False
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY | (0 if follow else os.O_NOFOLLOW), dir_fd=parent)
    status = os.fstat(descriptor)
    if status.st_uid == os.geteuid() and not status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        if made:
            os.fchmod(descriptor, 0o700)  # whatever the umask took away
        return descriptor
    os.close(descriptor)
    if status.st_uid != os.geteuid():
        raise NotPrivate(f"{path} belongs to user {status.st_uid}, not to this user ({os.geteuid()})")
    raise NotPrivate(f"group or others may write to {path} (mode {stat.S_IMODE(status.st_mode):o})")


class DiskCache:
    """The cache in one directory: `get` and `put` bytes by table and key. Safe to use from several threads."""

    def __init__(self, directory: str):
        self.directory = directory
        self._lock = threading.Lock()
        self._root: int | None = None  # descriptor of the directory, once opened and found private
        self._refused = False  # the directory is not private: never use it
        self._tables: dict[str, int] = {}  # descriptors of the tables' directories
        self._warned: set[str] = set()

    def get(self, table: str, key: str) -> bytes | None:
        """The value kept for `key` in `table`, checked; None when there is none (a bad one is removed)."""
        folder = self._table(table)
        if folder is None:
            return None
        name = entry_name(table, key)
        try:
            # no symlinks; O_NONBLOCK so that a FIFO put there cannot hang the open
            descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
        except FileNotFoundError:
            return None
        except OSError as error:
            self._remove(table, folder, name, f"cannot be opened ({error.strerror})")
            return None
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid():  # (checked before `open`: a directory
            os.close(descriptor)  # opens with os.open, and open() of it raised IsADirectoryError on every run)
            self._remove(table, folder, name, "not a file of this user")
            return None
        with open(descriptor, "rb") as file:
            try:
                data = file.read()
            except OSError as error:
                self._warn("read", f"cannot read the disk cache in {self.directory} ({error.strerror})")
                return None
        try:
            return unpack(name, data)
        except BadEntry as error:
            self._remove(table, folder, name, str(error))
            return None

    def put(self, table: str, key: str, value: bytes) -> None:
        """Keep `value` for `key` in `table` (replacing what was there); a failure only warns, once."""
        folder = self._table(table)
        if folder is None:
            return
        name = entry_name(table, key)
        temporary = f".{name}.{secrets.token_hex(8)}"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            with open(os.open(temporary, flags, 0o600, dir_fd=folder), "wb") as file:
                file.write(pack(name, value))
            os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
        except OSError as error:
            try:
                os.unlink(temporary, dir_fd=folder)
            except OSError:
                pass
            self._warn("write", f"cannot write the disk cache in {self.directory} ({error.strerror})")

    def _table(self, table: str) -> int | None:
        """The descriptor of a table's directory, made where it is missing; None where the cache is off or unusable."""
        if CACHELEVEL < 1 or self._refused:
            return None
        if (folder := self._tables.get(table)) is not None:
            return folder
        if "/" in table or table in (".", ".."):
            raise ValueError(f"disk cache: table name {table!r} is not a plain directory name")
        with self._lock:
            try:
                if self._root is None:
                    os.makedirs(os.path.dirname(self.directory), exist_ok=True)
                    # the directory itself may be a symlink the user made; inside it nothing is followed
                    self._root = open_private(self.directory, None, follow=True)
                if table not in self._tables:
                    self._tables[table] = open_private(table, self._root, follow=False)
                return self._tables[table]
            except NotPrivate as problem:
                self._refused = True
                self._warn(
                    "refused",
                    f"not using the disk cache {self.directory}: {problem}; make it private (chown it to this user, "
                    "chmod 700) or set LAZYGRAD_CACHE to a directory of your own",
                )
            except OSError as error:  # not remembered: the next kernel tries again
                self._warn("write", f"cannot make the disk cache directory {self.directory} ({error.strerror})")
            return None

    def _remove(self, table: str, folder: int, name: str, reason: str) -> None:
        try:
            os.unlink(name, dir_fd=folder)
        except IsADirectoryError:
            try:
                os.rmdir(name, dir_fd=folder)  # (an empty one; a directory with files in it is left alone)
            except OSError:
                pass
        except OSError:
            pass
        if DEBUG >= 1:
            print(f"disk cache: removed {os.path.join(self.directory, table, name)}: {reason}; building it again")

    def _warn(self, kind: str, message: str) -> None:
        """Warn once per kind of problem."""
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(f"lazygrad: {message}; kernels are kept in memory only", RuntimeWarning)


disk_cache = DiskCache(CACHEDIR)
