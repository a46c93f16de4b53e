"""Untuned ``auto``'s shape-aware rule: measured ground, or cuBLAS.

Without a tuning table, ``auto`` must not pick a backend slower than ``torch.matmul``. So it
picks cuBLAS (torch's own path) unless the calibration data shipped with the package — tuning
tables measured against torch.matmul, in the tuner's timing modes, on a GPU of the same
compute capability (``multibackend/data/calibration-*.json``) — says otherwise near this
shape. The entries of the problem's family (op, dtypes, precision, layouts, batched or not,
rows on or off the 16-byte grid) measured on this very GPU model are the ground where there
are any; else those of every model of the compute capability, which must then agree (an
H100's and an H200's winners differ on 7 (f16) and 8 (bf16) of 44 decode-sized entries).
Every such entry within a factor of :data:`RADIUS_FACTOR` in each of M, N and K must have
been won by the same backend (the tuner lets a backend win only by more than the spread it
measured, and an entry counts for it only where it also beat torch.matmul by more than that
spread, and than first-call autotuning's least lead, in the entry's other timing mode), and
there must be at least one.
Then that backend runs with the entry's config where this very shape was measured, else with
its own default for the shape: a config is chosen for the grid it makes on its shape, and on a
neighbour it can leave SMs idle (H100, graph mode: the 16x128 tile measured at 24x5120x13824
ran 32x4096x14336 as 64 programs at 0.95x torch.matmul, where Triton's own first-call pick
ran 128 programs at 1.04x). Anywhere else the answer is cuBLAS: where nothing was measured,
the rule does not guess.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from importlib import resources
from typing import NamedTuple

from multibackend.choose import tables
from multibackend.core import environment
from multibackend.core.config import Config
from multibackend.core.problem import Problem

RADIUS_FACTOR = 2.0
DATA_PACKAGE = "multibackend.data"


@dataclass(frozen=True)
class Advice:
    """What the calibration data says about one problem."""

    backend: str | None  # None: no confident answer (cuBLAS)
    config: Config | None  # None: the backend's own default (no entry of this very shape)
    detail: str


class Measured(NamedTuple):
    """One calibration entry and the GPU model it was measured on."""

    gpu: str
    key: str
    entry: dict


@functools.lru_cache(maxsize=8)
def entries_for(cc: tuple[int, int] | None) -> tuple[Measured, ...]:
    """Every calibration entry measured on a GPU of compute capability ``cc``."""
    if cc is None:
        return ()
    wanted = f"{cc[0]}.{cc[1]}"
    found: list[Measured] = []
    for item in sorted(resources.files(DATA_PACKAGE).iterdir(), key=lambda p: p.name):
        if not (item.name.startswith("calibration-") and item.name.endswith(".json")):
            continue
        table = json.loads(item.read_text())
        if str(table.get("environment", {}).get("cc")) != wanted:
            continue
        gpu = str(table["environment"].get("gpu"))
        found += [Measured(gpu, key, entry) for key, entry in table["entries"].items()]
    return tuple(found)


def ground(problem: Problem) -> tuple[list[Measured], str]:
    """The entries of ``problem``'s family that the rule reads (see the module docstring),
    and where they come from, in words."""
    family = tables.family(problem)
    of_family = [m for m in entries_for(problem.cc) if m.entry.get("family") == family]
    gpu = environment.device_name(problem.device)
    own = [m for m in of_family if m.gpu == gpu]
    if own:
        return own, f"measured on this GPU model, {gpu}"
    if not of_family:
        return [], "none of this family measured on a GPU of this compute capability"
    models = ", ".join(sorted({m.gpu for m in of_family}))
    return of_family, (f"none on {gpu}: " if gpu else "") + (
        f"measured on {models}, of the same compute capability")


def winner(entry: dict) -> str:
    """The backend an entry counts for: its winner where it beat torch.matmul, in every
    timing mode a call can run in and every other mode the entry records (a call's mode is
    not known when ``auto`` decides), by more than the spread the entry measured (its
    timings' own noise) and than first-call autotuning's least lead in that mode
    (:data:`multibackend.choose.store.MIN_SPREAD`); else cuBLAS. A mode without both figures is
    no evidence of a win, so it leaves the entry to cuBLAS too, as does a figure that is not
    a number. The tuner decided the entry's own mode, from its runs paired round by round
    with cuBLAS's (a sounder test than the ratio of two medians, so it is not redone here);
    the other mode is held here (H200, bf16: a win of 0.3% in eager mode at 3x5120x13824, spread
    3.1%, carried Triton to 2x3584x18944, which ran 0.83x torch.matmul there in eager
    mode)."""
    from multibackend.core.names import BASELINE, MIN_SPREAD

    name = entry["backend"]
    if name == BASELINE:
        return name
    key = f"{name}:{entry['config']['name']}"
    spread = float(entry.get("spread") or 0.0)
    timings = entry.get("timings_ms", {})
    for mode in dict.fromkeys([*MIN_SPREAD, *timings]):
        figures = timings.get(mode)
        if not isinstance(figures, dict) or key not in figures:
            return BASELINE
        base = [ms for k, ms in figures.items() if k.startswith(f"{BASELINE}:")]
        if not base or not figures[key] == figures[key]:  # no figure, or NaN
            return BASELINE
        if mode == entry.get("mode"):  # the tuner decided it, from runs paired round by round
            continue
        margin = 1.0 + max(spread, MIN_SPREAD.get(mode, 0.0))
        if not figures[key] * margin < min(base):
            return BASELINE
    return name


def advise(problem: Problem) -> Advice:
    """The calibrated backend for ``problem``, or why there is none (see the docstring)."""
    measured, source = ground(problem)
    radius = math.log2(RADIUS_FACTOR)
    near = sorted(((tables.distance(problem, m.entry), f"{m.gpu}: {m.key}", m.entry)
                   for m in measured), key=lambda t: t[0])
    near = [t for t in near if t[0] <= radius]
    if not near:
        return Advice(None, None, f"no calibration measurement within {RADIUS_FACTOR:g}x of "
                                  f"the shape ({source})")
    winners = {winner(e) for _, _, e in near}
    dist, key, nearest = near[0]
    figures = tables.lead_text(nearest)
    if len(winners) > 1 or winners == {"cublas"}:
        return Advice(None, None, f"{len(near)} calibration measurement(s) within "
                                  f"{RADIUS_FACTOR:g}x won by {', '.join(sorted(winners))}; "
                                  f"nearest {key} (log2 distance {dist:.2f}): {figures}")
    config = Config.from_dict(nearest["config"]) if dist == 0 else None
    return Advice(nearest["backend"], config,
                  f"all {len(near)} calibration measurement(s) within {RADIUS_FACTOR:g}x won "
                  f"by {nearest['backend']}; nearest {key} (log2 distance {dist:.2f}): "
                  f"{figures}" + ("" if config else f"; {nearest['backend']} chooses its "
                                  "config for this shape"))
