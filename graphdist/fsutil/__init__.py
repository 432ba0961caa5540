"""Filesystem helpers shared by the compile cache, checkpoints, plan export and saved models.

* :mod:`~graphdist.fsutil.atomic`: atomic file writes, the per-directory save
  lock, and the clean-up of what interrupted saves left behind;
* :mod:`~graphdist.fsutil.savedir`: directories graphdist writes (a manifest
  listing every file with its SHA-256; replaced only when every file there is
  one graphdist wrote; swapped in with no moment without a complete copy);
* :mod:`~graphdist.fsutil.npyfile`: ``.npz`` archives read without trusting
  their headers (declared sizes checked against the bytes before allocating);
* :mod:`~graphdist.fsutil.private`: whether a file or directory could have
  been put there by another user (compile-cache entries are used, and unsigned
  plans and saved models loaded, only when not);
* :mod:`~graphdist.fsutil.trust`: the signing key, the signatures saves write,
  and the rules that decide which plan and model directories load.

This package sits in the lowest import layer, beside :mod:`graphdist.errors`,
so it does not import it: functions that refuse take the exception class to
raise (``error=PlanError``) from their caller.
"""

from graphdist.fsutil.atomic import atomic_write_bytes, directory_lock, remove_leftovers, replace_file
from graphdist.fsutil.npyfile import read_npz
from graphdist.fsutil.private import make_private_dir, private_problem
from graphdist.fsutil.savedir import (
    MANIFEST_FILE,
    manifest_digests,
    recover_directory,
    verify_directory,
    with_manifest,
    write_directory,
)

__all__ = [
    "MANIFEST_FILE",
    "atomic_write_bytes",
    "directory_lock",
    "make_private_dir",
    "manifest_digests",
    "private_problem",
    "read_npz",
    "recover_directory",
    "remove_leftovers",
    "replace_file",
    "verify_directory",
    "with_manifest",
    "write_directory",
]
