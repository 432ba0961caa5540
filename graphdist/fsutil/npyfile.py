"""Reading ``.npz`` archives without trusting them.

``np.load`` allocates the array an ``.npy`` header declares before reading
its data, so a header that declares 100000 x 100000 floats in a file of a few
bytes asks for 37 GiB. :func:`read_npz` parses each header itself, checks
that the declared size is exactly what the archive holds for that entry (and
that the entry is stored, not compressed, so its size on disk is its size),
and only then reads the bytes. Object arrays (pickles) are refused.
"""

from __future__ import annotations

import io
import math
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["read_npz"]


def _header(handle: Any, entry: str, error: type[Exception], where: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(handle)
        if version in ((2, 0), (3, 0)):
            return np.lib.format.read_array_header_2_0(handle)
        raise ValueError(f"unsupported .npy format version {version}")
    except (ValueError, SyntaxError, TypeError, EOFError) as err:
        raise error(f"{where}: the entry {entry} has no valid .npy header ({err})") from None


def _read_entry(archive: zipfile.ZipFile, info: zipfile.ZipInfo, size: int, error: type[Exception],
                where: str) -> np.ndarray:
    entry = info.filename
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size \
            or info.header_offset + info.compress_size > size:
        raise error(f"{where}: the entry {entry} is compressed or declares more bytes than the archive holds; "
                    "graphdist writes stored (uncompressed) entries only")
    with archive.open(info) as handle:
        shape, fortran, dtype = _header(handle, entry, error, where)
        if dtype.hasobject:
            raise error(f"{where}: the entry {entry} holds Python objects (dtype {dtype}); they are never "
                        "unpickled")
        declared = math.prod(shape) * dtype.itemsize
        start = handle.tell()
        if start + declared != info.file_size:
            raise error(f"{where}: the entry {entry} declares {dtype}{list(shape)} ({declared:,} bytes) but holds "
                        f"{info.file_size - start:,} bytes of data; the file is corrupt or was edited")
        data = handle.read(declared)
    if len(data) != declared:
        raise error(f"{where}: the entry {entry} is truncated")
    array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    return np.array(array, order="C", copy=True)


def read_npz(source: bytes | str | os.PathLike[str], expected: dict[str, tuple[Any, tuple[int, ...]] | None], *,
             error: type[Exception], where: str) -> dict[str, np.ndarray]:
    """Reads the arrays ``expected`` names from an ``.npz`` archive, checking each before allocating it.

    Args:
        source: The archive's bytes or path.
        expected: Entry name (without ``.npy``) -> ``(dtype, shape)`` it must have, or ``None`` to take
            whatever dtype and shape its header declares (still checked against its size).
        error: Exception class raised for a bad archive.
        where: What is read, for messages (a path).

    Returns:
        Entry name -> array (C order, writable), for every entry in ``expected``.

    Raises:
        error: The archive is not a zip file, lacks an entry, or an entry's header is invalid, declares
            another size than it holds, another dtype or shape than expected, or holds objects.
    """
    if isinstance(source, bytes):
        size, opened = len(source), io.BytesIO(source)
    else:
        size, opened = Path(source).stat().st_size, Path(source).open("rb")
    out: dict[str, np.ndarray] = {}
    try:
        with opened as handle, zipfile.ZipFile(handle) as archive:
            for name, want in expected.items():
                try:
                    info = archive.getinfo(f"{name}.npy")
                except KeyError:
                    raise error(f"{where} has no entry {name}.npy; the file is incomplete or was edited") from None
                array = _read_entry(archive, info, size, error, where)
                if want is not None and (array.dtype != np.dtype(want[0]) or array.shape != tuple(want[1])):
                    raise error(f"{where}: the entry {name}.npy is {array.dtype}{list(array.shape)}, but "
                                f"{np.dtype(want[0])}{list(want[1])} was recorded for it")
                out[name] = array
    except error:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as err:
        raise error(f"{where} cannot be read ({type(err).__name__}: {err}); the file is truncated or "
                    "corrupt") from None
    return out
