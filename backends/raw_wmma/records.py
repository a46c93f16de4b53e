"""The raw WMMA backend's typed config records: one frozen record per kernel family of
``raw_wmma/*.cu``, holding the numbers its entry points are compiled with, and the config
name derived from them (the same name the CUDA sources' entry points carry after their
family's prefix, so a name read back from a tuning table finds its kernel).

The backend offers :meth:`config` of each record; a config handed back by name is looked
up in :mod:`.kernels`' tables, which hold these records by name.
"""
from __future__ import annotations

from dataclasses import dataclass

from multibackend.core.config import Config

#: the pipeline stages of every TMA-fed warpgroup tile (RW_TMA_TILES in mma_kmajor.cu)
TMA_STAGES = 4


@dataclass(frozen=True)
class FastTile:
    """``wmma_fast.cu``: 16-bit WMMA fragments fed by cp.async, BM x BN x BK in stages,
    warps_m x warps_n warps."""

    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int

    @property
    def name(self) -> str:
        return f"fast_{self.bm}x{self.bn}x{self.bk}_s{self.stages}"

    @property
    def warps(self) -> int:
        return self.warps_m * self.warps_n

    def config(self) -> Config:
        return Config.of(self.name, BM=self.bm, BN=self.bn, BK=self.bk, STAGES=self.stages,
                         WARPS=self.warps, FRAG="16x16x16")


@dataclass(frozen=True)
class TmaTile:
    """``mma_kmajor.cu``'s TMA-fed warpgroup kernel: BM / 64 consumer warpgroups and one
    producer warpgroup, a cluster of ``cluster`` CTAs sharing B's loads; with ``split`` > 1,
    K cut into that many splits whose partials a second kernel sums (split-K)."""

    bm: int
    bn: int
    cluster: int
    split: int = 1

    @property
    def name(self) -> str:
        base = f"tma_{self.bm}x{self.bn}_c{self.cluster}"
        return base if self.split == 1 else f"{base}_k{self.split}"

    @property
    def stages(self) -> int:
        return TMA_STAGES

    @property
    def warps(self) -> int:
        return self.bm // 16 + 4

    def config(self) -> Config:
        return Config.of(self.name, BM=self.bm, BN=self.bn, STAGES=self.stages,
                         WARPS=self.warps, CLUSTER=self.cluster, SPLIT_K=self.split)


@dataclass(frozen=True)
class WgmmaTile:
    """``mma_kmajor.cu``'s warpgroup kernel fed by cp.async: one warp per 16 rows."""

    bm: int
    bn: int
    stages: int

    @property
    def name(self) -> str:
        return f"wgmma_{self.bm}x{self.bn}_s{self.stages}"

    @property
    def warps(self) -> int:
        return self.bm // 16

    def config(self) -> Config:
        return Config.of(self.name, BM=self.bm, BN=self.bn, STAGES=self.stages,
                         WARPS=self.warps)


@dataclass(frozen=True)
class MmaTile:
    """``mma_kmajor.cu``'s PTX mma.sync kernel: the instruction m16n8k``mma_k``, BM x BN in
    stages, warps_m x warps_n warps."""

    mma_k: int
    bm: int
    bn: int
    warps_m: int
    warps_n: int
    stages: int

    @property
    def name(self) -> str:
        return f"mma_m16n8k{self.mma_k}_{self.bm}x{self.bn}_s{self.stages}"

    @property
    def warps(self) -> int:
        return self.warps_m * self.warps_n

    def config(self) -> Config:
        return Config.of(self.name, MMA_K=self.mma_k, BM=self.bm, BN=self.bn,
                         STAGES=self.stages, WARPS=self.warps)


@dataclass(frozen=True)
class WmmaFragment:
    """``wmma_generic.cu`` / ``wmma_subbyte.cu``: one WMMA fragment shape (``MxNxK``), a
    BM x BN tile of four warps."""

    frag: str
    bm: int
    bn: int

    @property
    def name(self) -> str:
        return f"wmma_{self.frag}"

    def config(self) -> Config:
        return Config.of(self.name, FRAG=self.frag, BM=self.bm, BN=self.bn, STAGES=1, WARPS=4)


@dataclass(frozen=True)
class DotBlocks:
    """``dot.cu``: ``threads`` per block, at most ``blocks_per_sm`` blocks per multiprocessor."""

    blocks_per_sm: int
    threads: int

    @property
    def name(self) -> str:
        return f"dot_{self.blocks_per_sm}bps"

    def config(self) -> Config:
        return Config.of(self.name, THREADS=self.threads, BLOCKS_PER_SM=self.blocks_per_sm)


def by_name(*records) -> dict:
    """The records keyed by their names, in the order given (the default first)."""
    return {record.name: record for record in records}
