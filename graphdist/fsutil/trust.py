"""Which plan and model directories graphdist runs code from: folder checks and keyed signatures.

An exported plan (and a saved Keras model) holds ONNX graphs that graphdist
compiles and runs, so it is code. Its manifest's SHA-256 checksums catch
corruption, but whoever can write the directory can change a segment and fix
the checksums up. So loading (:func:`check_trusted`) follows these rules:

1. ``trust=True`` (``--trust`` on the command line) skips rules 2 and 3; the
   checksums are still checked.
2. A directory signed with this user's key loads from any folder. A signature
   that names this user's key but does not match the manifest (a file was
   changed and the checksums fixed up), or a malformed signature file, is
   refused, whatever the folder.
3. Any other directory (unsigned, signed with another user's key, or written
   before signatures) loads only from a folder no other user can write: the
   directory, everything in it, and every directory above it belong to this
   user or root and are not writable by group or others (sticky directories
   such as ``/tmp`` above it excepted; see :mod:`graphdist.fsutil.private`).

Signatures: every plan or model directory graphdist writes gets
``graphdist-signature.json``, an HMAC-SHA256 of its manifest
(``graphdist-manifest.json``, which lists the SHA-256 of every other file)
with this user's signing key, and the key's id (a hash of the key, which does
not reveal it). The key is 32 random bytes, in hex, in
``$GRAPHDIST_SIGNING_KEY``, else ``$XDG_CONFIG_HOME/graphdist/signing-key``,
else ``~/.config/graphdist/signing-key``; it is created on the first save, with
mode ``0o600`` in a ``0o700`` directory. Like ssh with a private key, graphdist
ignores (with one warning) a key file that is a symbolic link, belongs to
another user, is readable or writable by group or others, or lies in a
directory others can write: directories are then written unsigned, and
signatures are not verified (rule 3 applies). ``GRAPHDIST_SIGNING_KEY=off``
writes unsigned directories and creates no key. Saving signs what is saved:
a plan loaded with ``trust=True`` and saved again (``LoadedPlan.save``,
``graphdist run --trust --save``) is from then on signed by this user.

This module sits in :mod:`graphdist.fsutil`, below :mod:`graphdist.errors`:
functions that refuse take the exception class to raise from their caller.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from graphdist.fsutil.private import make_private_dir, private_problem

if TYPE_CHECKING:
    from graphdist.fsutil.savedir import Manifest

__all__ = ["KEY_ENV", "SIGNATURE_FILE", "SigningKey", "check_trusted", "signature_file", "signing_key",
           "signing_key_path"]

logger = logging.getLogger(__name__)

#: The file holding a directory's signature (next to ``graphdist-manifest.json``; not listed in it).
SIGNATURE_FILE = "graphdist-signature.json"
#: Environment variable naming the signing key's file (``off``: do not sign).
KEY_ENV = "GRAPHDIST_SIGNING_KEY"
_FORMAT = "graphdist-signature"
_VERSION = 1
_ALGORITHM = "HMAC-SHA256"
_MESSAGE = b"graphdist-signature-v1\0"
_KEY_BYTES = 32
_warned: set[str] = set()


@dataclasses.dataclass(frozen=True)
class SigningKey:
    """This user's signing key: the secret and its public id (a hash of it)."""

    secret: bytes = dataclasses.field(repr=False)
    key_id: str
    path: Path


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning("%s", message)


def signing_key_path() -> Path | None:
    """The signing key's file (``None``: signing is off, ``GRAPHDIST_SIGNING_KEY=off``)."""
    env = os.environ.get(KEY_ENV, "").strip()
    if env.lower() in ("off", "none", "0", "false"):
        return None
    if env:
        return Path(env).expanduser().absolute()
    config = os.environ.get("XDG_CONFIG_HOME", "").strip()
    base = Path(config) if config and Path(config).is_absolute() else Path.home() / ".config"
    return base / "graphdist" / "signing-key"


def _key_id(secret: bytes) -> str:
    return hashlib.sha256(b"graphdist-key-id\0" + secret).hexdigest()[:16]


def _read_key(path: Path) -> SigningKey | None:
    """The key in ``path`` when it is safe to use (see the module docstring), else ``None`` with a warning."""
    ignored = f"ignoring the signing key {path}"
    problem = private_problem(path.parent, path.parent)
    if problem:
        _warn_once(f"{ignored}: {problem}, so another user could replace the key; make the directory yours and "
                   f"`chmod 700` it, or set {KEY_ENV} to a file in a private directory")
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as err:
        why = "it is a symbolic link" if os.path.islink(path) else (err.strerror or str(err))
        _warn_once(f"{ignored}: {why}; delete it and save again to create a new key")
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            _warn_once(f"{ignored}: it is not a regular file")
            return None
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            _warn_once(f"{ignored}: it belongs to user id {info.st_uid}, not to this user ({os.getuid()})")
            return None
        if hasattr(os, "getuid") and info.st_mode & 0o077:
            _warn_once(f"{ignored}: its mode {stat.S_IMODE(info.st_mode):o} lets group or others read or change it; "
                       f"`chmod 600 {path}`")
            return None
        text = os.read(fd, 4096).decode("ascii", errors="replace").strip()
    finally:
        os.close(fd)
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = b""
    if len(secret) != _KEY_BYTES:
        _warn_once(f"{ignored}: it does not hold a graphdist signing key ({2 * _KEY_BYTES} hex digits); delete it "
                   "and save again to create a new key")
        return None
    return SigningKey(secret, _key_id(secret), path)


def _create_key(path: Path) -> None:
    """Writes a new random key to ``path`` (mode ``0o600``); a key another process created first is kept."""
    make_private_dir(path.parent)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        try:
            os.write(fd, (secrets.token_bytes(_KEY_BYTES).hex() + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # never replaces an existing key
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)
    logger.info("created the signing key %s (mode 600) for the plans and models this user saves", path)


def signing_key(create: bool = False) -> SigningKey | None:
    """This user's signing key, or ``None`` (signing off, no key yet and ``create`` false, or not usable: warned).

    Args:
        create: Create the key when its file does not exist (saves do; loads never do).
    """
    path = signing_key_path()
    if path is None:
        return None
    if not os.path.lexists(path):
        if not create:
            return None
        try:
            _create_key(path)
        except OSError as err:
            _warn_once(f"cannot create the signing key {path} ({err.strerror or err}); saving unsigned plans and "
                       f"models (they load only from folders no one else can write). Set {KEY_ENV} to a file in a "
                       "writable private directory, or to 'off'")
            return None
    return _read_key(path)


def _mac(secret: bytes, manifest: bytes) -> str:
    return hmac.new(secret, _MESSAGE + manifest, hashlib.sha256).hexdigest()


def signature_file(manifest: bytes) -> bytes | None:
    """The content of :data:`SIGNATURE_FILE` for a directory whose manifest is ``manifest`` (its exact bytes),
    creating the key on first use; ``None`` when there is no usable key (see :func:`signing_key`).
    """
    key = signing_key(create=True)
    if key is None:
        return None
    doc = {"format": _FORMAT, "version": _VERSION, "algorithm": _ALGORITHM, "key_id": key.key_id,
           "signs": "graphdist-manifest.json", "hmac": _mac(key.secret, manifest)}
    return (json.dumps(doc, indent=1) + "\n").encode()


def _fix() -> str:
    return ("if you trust everyone who can write it, pass trust=True (gd.load_plan(..., trust=True), "
            "gd.keras.load_model(..., trust=True); --trust on the graphdist command line)")


def _signed_by_this_user(directory: Path, manifest: Manifest | None, error: type[Exception], what: str) -> bool:
    """Whether ``directory`` carries a valid signature by this user's key.

    Raises:
        error: The signature file is malformed, or names this user's key and does not match the manifest.
    """
    path = directory / SIGNATURE_FILE
    if not os.path.lexists(path):
        return False
    refused = f"{what}: refusing {directory}: its signature {path}"
    try:
        doc = json.loads(path.read_bytes())
        valid = (isinstance(doc, dict) and doc.get("format") == _FORMAT and doc.get("version") == _VERSION
                 and doc.get("algorithm") == _ALGORITHM and isinstance(doc.get("key_id"), str)
                 and isinstance(doc.get("hmac"), str))
    except (OSError, ValueError, UnicodeDecodeError):
        valid = False
    if not valid:
        raise error(f"{refused} is not a graphdist signature (damaged, or written by someone else); export or save "
                    f"it again, or, {_fix()}")
    key = signing_key()
    if key is None or doc["key_id"] != key.key_id:
        return False  # another user's key (or ours is not usable): the folder decides
    if manifest is None or not hmac.compare_digest(_mac(key.secret, manifest.data), doc["hmac"]):
        raise error(f"{refused} names your signing key but does not match its graphdist-manifest.json: a file was "
                    "changed after it was signed and its checksums were rewritten (a forged signature). Do not run "
                    f"it: export or save it again from its source, or, {_fix()}")
    return True


def check_trusted(directory: str | os.PathLike[str], manifest: Manifest | None, *, trust: bool,
                  error: type[Exception], what: str) -> None:
    """Refuses a plan or model directory another user could have changed (the rules: module docstring).

    Args:
        directory: The directory about to be loaded.
        manifest: Its manifest as read (``None``: none, a directory written before manifests).
        trust: The caller's explicit trust option: skip the checks.
        error: Exception class raised on refusal.
        what: The operation, for messages (``"gd.load_plan"``).

    Raises:
        error: A forged or malformed signature, or an unsigned directory in a folder others can write.
    """
    if trust:
        return
    directory = Path(os.path.abspath(directory))
    if _signed_by_this_user(directory, manifest, error, what):
        return
    problem = private_problem(directory, directory, allow_root=True, below=True)
    if problem is None:
        return
    raise error(f"{what}: refusing to load {directory}: {problem}, so another user could have changed the graphs it "
                "runs (checksums do not stop them: whoever can write a file can rewrite its checksum), and it is not "
                f"signed with your key. Copy it into a folder only you can write (`chmod go-w`), or, {_fix()}")
