"""A sweep job's folder name: its number and overrides (`conf/train.yaml`'s `hydra.sweep.subdir`),
cut to what a file name may hold.

Hydra's own `${hydra.job.num}_${hydra.job.override_dirname}` names every job by all of its
overrides; a sweep with a dozen settings on the command line makes a name over the 255 bytes a file
name may have, and every job fails with "File name too long" before it starts. A name that long is
cut and ends with a hash of the whole overrides, so two jobs still get two folders.
"""

from __future__ import annotations

import hashlib

from omegaconf import OmegaConf

#: Bytes of a job folder's name at most (a file name may have 255; room for Hydra's own suffixes).
MAX_NAME_BYTES = 200
RESOLVER = "lit_asyncrl.job_dirname"


def job_dirname(number: int | str, overrides: str) -> str:
    """`<number>_<overrides>`, or, when longer than `MAX_NAME_BYTES`, its start and a hash of the overrides."""
    name = f"{number}_{overrides}"
    if len(name.encode()) <= MAX_NAME_BYTES:
        return name
    digest = hashlib.sha256(overrides.encode()).hexdigest()[:10]
    head = name.encode()[: MAX_NAME_BYTES - len(digest) - 1].decode(errors="ignore")
    return f"{head}_{digest}"


def register_resolver() -> None:
    """Make `${lit_asyncrl.job_dirname:NUM,OVERRIDES}` resolvable (once per process)."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, job_dirname)
