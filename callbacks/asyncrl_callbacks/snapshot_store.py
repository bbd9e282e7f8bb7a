"""Host-memory store of weight snapshots keyed by version, with a staleness cap and a memory budget."""

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn


class SnapshotBudgetError(RuntimeError):
    """Raised when keeping one more snapshot would exceed ``max_resident`` or ``max_bytes``."""


def module_tensors(module: nn.Module) -> dict[str, Tensor]:
    """Parameters and buffers by name, as ``torch.func.functional_call`` expects them.

    Buffers are included because the forward needs them (e.g. rotary ``inv_freq``, which is a
    non-persistent buffer and so absent from ``state_dict()``). Tied parameters appear once, under
    their first name; ``functional_call(tie_weights=True)`` re-ties them.
    """
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


#: What a snapshot copies: "trainable" (the parameters that require a gradient, and the buffers)
#: or "all" (every parameter and buffer).
KEEPS = ("trainable", "all")


def kept_tensors(module: nn.Module, keep: str) -> dict[str, Tensor]:
    """The tensors a snapshot of ``module`` copies (``keep``: see :data:`KEEPS`)."""
    tensors = module_tensors(module)
    if keep == "all":
        return tensors
    frozen = {name for name, parameter in module.named_parameters() if not parameter.requires_grad}
    return {name: tensor for name, tensor in tensors.items() if name not in frozen}


def tensor_identity(tensor: Tensor) -> tuple[int, int] | None:
    """What changes when a tensor's values may have: its storage and its in-place-write counter (an
    optimizer step, a ``load_state_dict`` or any other in-place write moves the counter of the tensor
    it writes; autograd checks saved tensors with it). None for a sharded tensor (a DTensor), whose
    local shard is what gets written: never known to be unchanged."""
    if hasattr(tensor, "to_local"):
        return None
    return tensor.data_ptr(), tensor._version


def _identity(tensors: Mapping[str, Tensor]) -> dict[str, tuple[int, int] | None]:
    return {name: tensor_identity(tensor) for name, tensor in tensors.items()}


class SnapshotStore:
    """Snapshots of a module's tensors on the host, one per version.

    Args:
        max_staleness: Largest version gap a trained token may have. Saving version ``v`` drops the
            versions older than ``v - max_staleness``: no admissible token can refer to them.
        max_resident: Most snapshots kept at once, or ``None`` for no count limit.
        max_bytes: Most bytes of snapshots kept at once, or ``None`` for no byte limit.
        storage_dtype: Dtype for floating-point *parameters* on the host (e.g. ``torch.bfloat16`` to
            halve the memory; the forward then runs on rounded weights, so pi_old is no longer
            exact), or its name (``"bfloat16"``, as a config file writes it). Buffers keep their
            dtype (rotary frequencies lose too much in bf16).
        pin_memory: Use pinned host memory for tensors that come from CUDA (faster, asynchronous
            transfers both ways).
        keep: ``"trainable"`` (default) copies the parameters that require a gradient and the
            buffers; a frozen parameter (a frozen layer, the base weights under a LoRA adapter) is
            read from the live module, which is checked not to have written it since the snapshot
            was saved. ``"all"`` copies every parameter too.

    Raises:
        ValueError: When an argument is out of range or a budget cannot hold every version a token
            may refer to (``max_staleness + 1`` snapshots).
    """

    def __init__(
        self,
        max_staleness: int | None,
        max_resident: int | None = None,
        max_bytes: int | None = None,
        storage_dtype: torch.dtype | str | None = None,
        pin_memory: bool = True,
        keep: str = "trainable",
    ) -> None:
        storage_dtype = as_dtype(storage_dtype)
        if keep not in KEEPS:
            raise ValueError(f"keep={keep!r}: choose one of {', '.join(KEEPS)}")
        if max_staleness is not None:  # None: set later with `set_max_staleness`, before the first save
            _check_budget_arguments(max_staleness, max_resident, max_bytes, storage_dtype)
        self.max_staleness = max_staleness
        self.max_resident = max_resident
        self.max_bytes = max_bytes
        self.storage_dtype = storage_dtype
        self.pin_memory = pin_memory
        self.keep = keep
        self._snapshots: dict[int, dict[str, Tensor]] = {}
        #: Per version, the frozen parameters it reads from the live module, as they were at its save
        #: (None for a version restored from a checkpoint: the module's own restore writes them).
        self._shared: dict[int, dict[str, tuple[int, int] | None] | None] = {}

    def set_max_staleness(self, max_staleness: int) -> None:
        """Set the staleness window (e.g. from the rollout side's cap) before any snapshot is saved."""
        if self._snapshots:
            raise RuntimeError("max_staleness can only be set while no snapshot is resident")
        _check_budget_arguments(max_staleness, self.max_resident, self.max_bytes, self.storage_dtype)
        self.max_staleness = max_staleness

    @property
    def versions(self) -> tuple[int, ...]:
        """Resident versions, oldest first."""
        return tuple(sorted(self._snapshots))

    @property
    def latest_version(self) -> int | None:
        """The newest resident version, or ``None`` when empty."""
        return max(self._snapshots, default=None)

    @property
    def resident_bytes(self) -> int:
        """Bytes held by all resident snapshots."""
        return sum(_nbytes(tensors) for tensors in self._snapshots.values())

    def __contains__(self, version: int) -> bool:
        return version in self._snapshots

    def __len__(self) -> int:
        return len(self._snapshots)

    def get(self, version: int) -> dict[str, Tensor]:
        """The host tensors of ``version``.

        Raises:
            KeyError: Naming the version and the resident ones.
        """
        if version not in self._snapshots:
            raise KeyError(
                f"no snapshot of version {version} (resident: {list(self.versions)}); it was released, "
                "dropped as older than max_staleness, or predates a resume. Drop tokens whose version "
                "is missing (check has_version) or keep it referenced in release_unreferenced."
            )
        return self._snapshots[version]

    def snapshot_nbytes(self, module: nn.Module) -> int:
        """Bytes one snapshot of ``module`` takes on the host with this store's storage dtype."""
        params = dict(module.named_parameters())
        return sum(
            t.numel() * self._host_dtype(t, name in params).itemsize
            for name, t in kept_tensors(module, self.keep).items()
        )

    def shared_tensors(self, version: int, module: nn.Module) -> dict[str, Tensor]:
        """The live tensors that ``version``'s snapshot does not hold (its frozen parameters).

        Raises:
            ValueError: One of them was written since ``version`` was saved (then its snapshot no
                longer describes that version: use ``keep="all"``).
        """
        shared = self._frozen_tensors(module)
        saved = self._shared.get(version)
        if saved is not None:
            changed = sorted(
                name for name, identity in _identity(shared).items() if identity is None or saved.get(name) != identity
            )
            if changed or saved.keys() != shared.keys():
                raise ValueError(
                    f"frozen parameters changed since the snapshot of version {version} was saved ({', '.join(changed) or 'which ones are frozen'}): "
                    'a snapshot with keep="trainable" reads them from the live module; use keep="all"'
                )
        return shared

    def save(self, module: nn.Module, version: int) -> int:
        """Copy ``module``'s parameters and buffers to the host as ``version``.

        Versions older than ``version - max_staleness`` are dropped first. Saving a resident version
        again replaces it.

        Returns:
            Bytes of the new snapshot.

        Raises:
            ValueError: ``max_bytes`` cannot hold ``max_staleness + 1`` snapshots of this module.
            SnapshotBudgetError: The budget is full of versions that are still allowed.
        """
        if self.max_staleness is None:
            raise RuntimeError("set max_staleness (set_max_staleness) before saving a snapshot")
        self._snapshots.pop(version, None)
        self.drop_stale(max(version, self.latest_version if self.latest_version is not None else version))
        nbytes = self.snapshot_nbytes(module)
        self._check_room(nbytes)
        self._snapshots[version] = self._copy_to_host(module)
        self._shared[version] = _identity(self._frozen_tensors(module))
        return nbytes

    def put(self, version: int, tensors: Mapping[str, Tensor]) -> None:
        """Insert host tensors as ``version`` (used to restore checkpointed snapshots)."""
        pin = self.pin_memory and torch.cuda.is_available()
        self._snapshots[version] = {name: t.pin_memory() if pin else t for name, t in tensors.items()}
        self._shared[version] = None

    def drop_stale(self, current_version: int) -> list[int]:
        """Drop versions older than ``current_version - max_staleness``; returns them."""
        oldest_allowed = current_version - self.max_staleness
        return self._drop([v for v in self._snapshots if v < oldest_allowed])

    def release_unreferenced(self, live_versions: Iterable[int]) -> list[int]:
        """Drop every version outside ``live_versions`` except the newest one; returns the dropped.

        The newest version is kept because the engine is sampling with it, so tokens that will refer
        to it may not be queued yet.
        """
        keep = set(live_versions) | {self.latest_version}
        return self._drop([v for v in self._snapshots if v not in keep])

    def _drop(self, versions: list[int]) -> list[int]:
        # Popping the only reference lets the allocator reclaim the host memory at once.
        for version in versions:
            del self._snapshots[version]
            self._shared.pop(version, None)
        return sorted(versions)

    def _check_room(self, nbytes: int) -> None:
        needed = self.max_staleness + 1
        if self.max_bytes is not None and self.max_bytes < needed * nbytes:
            raise ValueError(
                f"max_bytes={self.max_bytes} cannot hold max_staleness + 1 = {needed} snapshots of "
                f"{nbytes} bytes each (need {needed * nbytes}); raise max_bytes, lower max_staleness "
                "or set storage_dtype=torch.bfloat16."
            )
        if self.max_resident is not None and len(self) + 1 > self.max_resident:
            raise SnapshotBudgetError(
                f"max_resident={self.max_resident} reached (resident versions {list(self.versions)}); "
                "call release_unreferenced with the versions still referenced, or raise max_resident."
            )
        if self.max_bytes is not None and self.resident_bytes + nbytes > self.max_bytes:
            raise SnapshotBudgetError(
                f"max_bytes={self.max_bytes} reached ({self.resident_bytes} bytes resident in versions "
                f"{list(self.versions)}, {nbytes} more needed); call release_unreferenced or raise max_bytes."
            )

    def _frozen_tensors(self, module: nn.Module) -> dict[str, Tensor]:
        """The module's tensors a snapshot does not copy (none with keep="all")."""
        kept = kept_tensors(module, self.keep)
        return {name: tensor for name, tensor in module_tensors(module).items() if name not in kept}

    def _copy_to_host(self, module: nn.Module) -> dict[str, Tensor]:
        params = dict(module.named_parameters())
        host = {}
        cuda_device = None
        for name, tensor in kept_tensors(module, self.keep).items():
            pin = self.pin_memory and tensor.is_cuda
            dtype = self._host_dtype(tensor, name in params)
            copy = torch.empty(tensor.shape, dtype=dtype, device="cpu", pin_memory=pin)
            # non_blocking into pinned memory queues every copy before one synchronisation.
            host[name] = copy.copy_(tensor.detach(), non_blocking=pin)
            cuda_device = tensor.device if pin else cuda_device
        if cuda_device is not None:
            torch.cuda.synchronize(cuda_device)
        return host

    def _host_dtype(self, tensor: Tensor, is_param: bool) -> torch.dtype:
        if self.storage_dtype is not None and is_param and tensor.is_floating_point():
            return self.storage_dtype
        return tensor.dtype


def as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """``torch.bfloat16`` from ``"bfloat16"``, ``"torch.bfloat16"`` or the dtype itself."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, dtype.removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"storage_dtype={dtype!r} is not a torch dtype name (e.g. 'bfloat16')")
    return resolved


def _nbytes(tensors: Mapping[str, Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _check_budget_arguments(
    max_staleness: int, max_resident: int | None, max_bytes: int | None, storage_dtype: torch.dtype | None
) -> None:
    if not isinstance(max_staleness, int) or max_staleness < 0:
        raise ValueError(f"max_staleness must be an integer >= 0, got {max_staleness!r}")
    if max_resident is not None and max_resident < max_staleness + 1:
        raise ValueError(
            f"max_resident={max_resident} cannot hold every version a token may refer to: with "
            f"max_staleness={max_staleness} that is max_staleness + 1 = {max_staleness + 1} versions."
        )
    if max_bytes is not None and max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes!r}")
    if storage_dtype is not None and not storage_dtype.is_floating_point:
        raise ValueError(f"storage_dtype must be a floating-point dtype, got {storage_dtype}")
