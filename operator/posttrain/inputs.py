"""Reading a user's input files (TOML configs, JSONL datasets and rollouts) and checking output paths, with
one-line refusals instead of tracebacks or hangs.

- only regular files are read: a FIFO, a socket or a device would block or never end, a directory is not a
  file; the size is bounded;
- text must be UTF-8: a NUL byte means a binary file; a byte-order mark is named as such (tomllib reports
  it as "Invalid statement"); an invalid byte is reported with its line and column;
- an output path must not be a directory, and its folder must be creatable."""

from __future__ import annotations

import codecs
import os
import stat
from pathlib import Path

from posttrain.errors import Problem, UserError

MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_DATA_BYTES = 8 * 1024**3


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def check_readable_file(path: str | Path, *, what: str = "file", field: str | None = None) -> Path:
    """The path of an existing regular file, or a UserError naming what it is instead."""
    path = Path(path)
    try:
        info = os.stat(path)  # follows symlinks: a link to a regular file is fine
    except FileNotFoundError:
        raise UserError(Problem(f"{what} not found", file=str(path), field=field,
                                fix="check the path (relative paths resolve against the current folder)")) from None  # fmt: skip
    except OSError as err:
        raise UserError(Problem(f"cannot read {what}: {err.strerror}", file=str(path), field=field)) from None
    kind = _kind(info.st_mode)
    if kind is not None:
        raise UserError(Problem(f"{what} is {kind}, not a regular file", file=str(path), field=field,
                                fix=f"pass the path of a {what} (a regular file)"))  # fmt: skip
    return path


def decode_text(data: bytes, *, path: str, what: str = "file", field: str | None = None) -> str:
    """UTF-8 text of `data`, or a UserError: binary (NUL byte), BOM, or an invalid byte at line:column."""
    if data.startswith(codecs.BOM_UTF8):
        raise UserError(Problem(f"{what} starts with a UTF-8 byte-order mark (BOM)", file=path, line=1,
                                field=field, fix="save the file as UTF-8 without a BOM"))  # fmt: skip
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise UserError(Problem(f"{what} is UTF-16 (it starts with a UTF-16 byte-order mark)", file=path,
                                line=1, field=field, fix="save the file as UTF-8"))  # fmt: skip
    nul = data.find(b"\x00")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise UserError(Problem(f"{what} is binary (a NUL byte at byte {nul}), not text", file=path,
                                line=line, field=field, fix=f"pass a UTF-8 text {what}"))  # fmt: skip
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise UserError(
            Problem(f"{what} is not UTF-8: byte 0x{data[err.start]:02x} at column {column} is invalid",
                    file=path, line=line, field=field, fix="save the file as UTF-8")
        ) from None  # fmt: skip


def read_text_input(
    path: str | Path, *, what: str = "file", field: str | None = None, max_bytes: int = MAX_CONFIG_BYTES
) -> str:
    """The UTF-8 text of a user's input file, or a UserError (never a hang on a FIFO, never a traceback)."""
    path = check_readable_file(path, what=what, field=field)
    size = path.stat().st_size
    if size > max_bytes:
        raise UserError(Problem(f"{what} is {size} bytes, more than {max_bytes}", file=str(path), field=field,
                                fix=f"pass a {what} under {max_bytes // 1024} KiB"))  # fmt: skip
    try:
        data = path.read_bytes()
    except OSError as err:
        raise UserError(Problem(f"cannot read {what}: {err.strerror}", file=str(path), field=field)) from None
    return decode_text(data, path=str(path), what=what, field=field)


def check_output_path(path: str | Path, *, flag: str = "--output") -> Path:
    """A path that can be written as a file: not a directory, its folder creatable."""
    path = Path(path)
    if path.is_dir():
        raise UserError(Problem("is a directory; an output file is needed", file=str(path), field=flag,
                                fix=f"pass a file name, e.g. {flag} {path / 'out'}"))  # fmt: skip
    if path.exists() and _kind(path.stat().st_mode) is not None:
        raise UserError(Problem(f"is {_kind(path.stat().st_mode)}, not a regular file", file=str(path),
                                field=flag, fix="pass the path of a regular file"))  # fmt: skip
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise UserError(Problem(f"{parent} is not a directory", file=str(path), field=flag,
                                fix="pass a path whose folder exists or can be created"))  # fmt: skip
    return path
