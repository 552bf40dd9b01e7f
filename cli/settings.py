"""What the global options decide for every command: the cache directory, the remote tier, how
the disk tier stores states, the models' K/V and sliding-window caches, the layers on a GPU and how
chatty to be."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from snapcache import SnapshotStore

REMOTE_BUDGET_ENV = "SNAPCACHE_REMOTE_BUDGET"
KV_CACHE_ENV = "SNAPCACHE_KV_CACHE"
SWA_CACHE_ENV = "SNAPCACHE_SWA_CACHE"
FLASH_ATTN_ENV = "SNAPCACHE_FLASH_ATTN"
GPU_LAYERS_ENV = "SNAPCACHE_GPU_LAYERS"
COMPRESSION_ENV = "SNAPCACHE_COMPRESSION"


@dataclass(frozen=True, slots=True)
class Settings:
    """The global options; commands reach it as `ctx.obj`."""

    cache_dir: Path | None = None
    verbose: bool = False
    remote: str | None = None  # a redis:// URL; None: $SNAPCACHE_REMOTE, else no remote tier
    remote_budget: int | None = None  # bytes the remote tier may hold; None: the library's default
    kv_cache: str | None = None  # the models' K/V cache type (`snapcache.llama.setup.loader.KV_CACHE_TYPES`)
    swa_cache: str | None = None  # full or window (`snapcache.llama.setup.loader.SWA_CACHES`); None: window
    flash_attn: str | None = (
        None  # auto, on or off (`snapcache.llama.setup.loader.FLASH_ATTN_MODES`); None: auto
    )
    compression: str | None = None  # auto, zstd or none; None: $SNAPCACHE_COMPRESSION, else auto
    gpu_layers: int | None = None  # layers on the GPU, -1 all; None: all on a GPU build, else none

    def open_store(self) -> SnapshotStore:
        """The snapshot store in --cache-dir, else in the library's default directory.

        disk_bytes=None keeps the budget recorded in the directory: the command must not shrink a
        cache an application runs with a larger budget.
        """
        from snapcache import SnapshotStore

        if self.cache_dir is None:
            return SnapshotStore(disk_bytes=None, **self.store_options())
        return SnapshotStore(self.cache_dir, disk_bytes=None, **self.store_options())

    def llama_options(self) -> dict[str, Any]:
        """The `load_llama` arguments the global options decide: the settings a state is saved under,
        and where the model's layers run."""
        return {
            "kv_cache": self.kv_cache,
            "swa_cache": self.swa_cache,
            "flash_attention": self.flash_attn,
            "gpu_layers": self.gpu_layers,
        }

    def store_options(self) -> dict[str, Any]:
        """The SnapshotStore arguments the global options decide: the remote tier's URL and budget,
        and the disk tier's compression."""
        return {
            "remote": self.remote,
            "remote_budget_bytes": self.remote_budget,
            "compression": self.compression,
        }


def settings_of(ctx: typer.Context) -> Settings:
    """The Settings the global callback stored; defaults when a command runs on its own."""
    obj = ctx.find_object(Settings)
    return obj if obj is not None else Settings()
