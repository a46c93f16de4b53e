"""The CUTLASS backend's typed config record: one compiled kernel (named by the generator's
procedural name, ``Candidate.name``) and the runtime settings of its tile scheduler, with
the config name derived from them. The settings are launch arguments of the one compiled
kernel, so every record of a kernel shares its build.

The backend offers :meth:`KernelConfig.config`; a config handed in (or read back from a
tuning table) becomes a record again through :func:`kernel_config`, which checks the
settings and names the rule a bad one breaks.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from multibackend.core.config import Config
from multibackend.core.errors import InvalidArgument

#: raster orders of the 3.x tile schedulers, in the caller's terms: "m" walks consecutive
#: tiles down the rows of D (the kernel's N, as it computes D^T), "n" along its columns;
#: the values are the launcher's RasterOrderOptions
RASTERS = {"heuristic": 0, "m": 2, "n": 1}
#: stream-K decompositions (DecompositionMode): the launcher's default lets CUTLASS choose
DECOMPOSITIONS = {"heuristic": 0, "data_parallel": 1, "split_k": 2, "stream_k": 3}


@dataclass(frozen=True)
class KernelConfig:
    """A CUTLASS kernel and its scheduler's CTA swizzle, raster order and (stream-K kernels)
    decomposition and split count. ``params`` are the kernel's own (its candidate's)."""

    kernel: str
    params: tuple = ()
    swizzle: int = 1
    raster: str = "heuristic"
    decomposition: str = "heuristic"
    splits: int = 1

    @property
    def name(self) -> str:
        name = self.kernel
        if self.decomposition == "split_k":
            name = f"{name.removesuffix('_streamk')}_splitk{self.splits}"
        elif self.decomposition != "heuristic":
            name += "_forced" if self.decomposition == "stream_k" else f"_{self.decomposition}"
        if self.raster != "heuristic":
            name += f"_along_{self.raster}"
        if self.swizzle != 1:
            name += f"_sw{self.swizzle}"
        return name

    def config(self) -> Config:
        params = {**dict(self.params), "kernel": self.kernel, "swizzle": self.swizzle,
                  "raster": self.raster}
        if self.decomposition == "split_k":
            params.update(decomposition=self.decomposition, splits=self.splits)
        elif self.decomposition != "heuristic":
            params.update(decomposition=self.decomposition)
        return Config.of(self.name, **params)


@functools.lru_cache(maxsize=4096)
def kernel_config(config: Config) -> KernelConfig:
    """The record of ``config``; raises naming the rule where its scheduler settings are not
    ones the launcher takes."""
    raster = config.get("raster", "heuristic")
    decomposition = config.get("decomposition", "heuristic")
    splits = config.get("splits", 1)
    swizzle = config.get("swizzle", 1)
    if raster not in RASTERS or decomposition not in DECOMPOSITIONS:
        raise InvalidArgument(f"config {config.name!r}: raster {raster!r} (one of "
                              f"{sorted(RASTERS)}), decomposition {decomposition!r} (one "
                              f"of {sorted(DECOMPOSITIONS)})")
    if not isinstance(splits, int) or splits < 1 or (splits > 1 and decomposition != "split_k"):
        raise InvalidArgument(f"config {config.name!r}: splits {splits!r} must be an integer "
                              "of at least 1, and above 1 only with decomposition 'split_k'")
    if not isinstance(swizzle, int) or swizzle < 1:
        raise InvalidArgument(f"config {config.name!r}: swizzle {swizzle!r} must be an "
                              "integer of at least 1")
    own = tuple((k, v) for k, v in config.params
                if k not in ("kernel", "swizzle", "raster", "decomposition", "splits"))
    return KernelConfig(config.get("kernel", config.name), own, swizzle, raster,
                        decomposition, splits)
