"""The Triton backend's typed config records: what each kernel of the backend is launched with,
as frozen fields, and the config name derived from them.

A :class:`~multibackend.core.config.Config` (a name and its parameters) is what the rest of the
library passes around, stores in tuning tables and reads back from JSON; a record is how this
backend makes one (:meth:`TileConfig.config`) and reads one
(:func:`tile_of`, after :func:`~.configs.config_fault` passed it). The name is never
written by hand: two configs with the same fields have the same name, and the names are the
ones tables written before the records existed hold.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from multibackend.core.config import Config

#: the kinds of matmul kernel: the pointer kernel, the persistent TMA kernel, split-K over
#: pointer loads (one kernel, or two with the reduction), TMA split-K
KINDS = ("pointer", "tma", "splitk", "tma_splitk")


@dataclass(frozen=True)
class TileConfig:
    """One matmul kernel: its kind, tile (BLOCK_M x BLOCK_N x BLOCK_K), warps, pipeline
    stages, grouping of row tiles (GROUP_M), slices of K (split-K kinds), whether split-K
    reduces in the same kernel (``fused``), and whether the TMA kernel's warps specialize."""

    kind: str
    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    group_m: int = 8
    split_k: int = 1
    fused: bool = False
    warp_specialize: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"TileConfig: kind is {self.kind!r}: expected one of {KINDS}")

    @property
    def name(self) -> str:
        shape = f"{self.block_m}x{self.block_n}x{self.block_k}"
        if self.kind == "pointer":
            return f"{shape}_w{self.warps}_s{self.stages}_g{self.group_m}"
        if self.kind == "tma":
            return (f"tma_{shape}_w{self.warps}_s{self.stages}_g{self.group_m}"
                    f"{'_ws' if self.warp_specialize else ''}")
        if self.kind == "splitk":
            return (f"splitk{'_fused' if self.fused else ''}_{shape}_s{self.split_k}"
                    f"_w{self.warps}_st{self.stages}")
        return f"tma_splitk_{shape}_s{self.split_k}_w{self.warps}_st{self.stages}"

    def config(self) -> Config:
        """The Config this record names, with the parameters the kernels of its kind read."""
        tile = dict(BLOCK_M=self.block_m, BLOCK_N=self.block_n, BLOCK_K=self.block_k,
                    num_warps=self.warps, num_stages=self.stages)
        if self.kind == "pointer":
            return Config.of(self.name, **tile, GROUP_M=self.group_m)
        if self.kind == "tma":
            return Config.of(self.name, kind="tma", **tile, GROUP_M=self.group_m,
                             WARP_SPECIALIZE=self.warp_specialize)
        if self.kind == "splitk":
            return Config.of(self.name, kind="splitk", **tile, SPLIT_K=self.split_k,
                             FUSED=self.fused)
        return Config.of(self.name, kind="tma_splitk", **tile, SPLIT_K=self.split_k)


@dataclass(frozen=True)
class DotConfig:
    """The dot kernel: elements each program reduces per step (``block``) and its warps."""

    block: int
    warps: int

    @property
    def name(self) -> str:
        return f"dot_b{self.block}_w{self.warps}"

    def config(self) -> Config:
        return Config.of(self.name, BLOCK=self.block, num_warps=self.warps)


@functools.lru_cache(maxsize=4096)
def tile_of(config: Config) -> TileConfig:
    """The record of a matmul config whose parameters :func:`~.configs.config_fault` passed
    (a staged config's own flags are not the kernel's and are left out)."""
    kind = config.get("kind") or "pointer"
    return TileConfig(kind, config.get("BLOCK_M"), config.get("BLOCK_N"), config.get("BLOCK_K"),
                      config.get("num_warps"), config.get("num_stages"),
                      group_m=config.get("GROUP_M", 8), split_k=config.get("SPLIT_K", 1),
                      fused=bool(config.get("FUSED")),
                      warp_specialize=bool(config.get("WARP_SPECIALIZE")))


@functools.lru_cache(maxsize=256)
def dot_of(config: Config) -> DotConfig:
    """The record of a dot config (its BLOCK and num_warps checked)."""
    return DotConfig(config.get("BLOCK"), config.get("num_warps"))
