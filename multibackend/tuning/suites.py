"""The named shape suites, defined once for the tuner, the benchmarks and the report.

Each suite is a tuple of :class:`Shape` ``(batch, M, N, K)``:

- ``square``: M = N = K from 256 to 16384.
- ``llm``: the projections of Llama-2/3-style models: M (tokens in flight) in
  {1, 16, 128, 2048, 8192} times the (N, K) of the attention q/k/v/o and MLP gate/up/down
  weights of 7B (Llama-2), 8B (Llama-3, grouped-query attention), 13B and 70B models.
- ``odd``: sizes no tile divides: 1000^3, 4097x4095x4096, 333x777x999.
- ``skinny``: one dimension tiny, the others large (GEMV-like and tall-thin products).
- ``batched``: many small and medium products in one call.
- ``validation``: shapes no committed table or calibration was tuned on, to score ``auto``
  on: the projections of other model families than ``llm``'s (Qwen2.5-7B, Gemma-2-9B,
  Phi-3-mini, Mistral-NeMo-12B) at M in {1, 2, 4, 8, 16, 32, 64, 128, 512, 4096} (each
  projection at three of them, every M at several projections), odd cubes and batched
  products.
- ``misaligned``: 16-bit products whose rows are off the 16-byte grid (K or N not a
  multiple of 8: odd cubes, vocabulary projections), where cuBLAS leaves its fast kernels;
  ``misaligned_small``: such products under 512 on a side, or decode-sized, where staging
  cannot pay.
- ``decode``: decode-sized products, M in {1, 2, 4, ..., 512} times eight LLM (N, K)
  projections (Llama-3-8B's q/o, fused q/k/v, k/v, MLP up, fused gate/up and down, its
  128256-word vocabulary head, and a 70B-sized fused q/k/v), where the work is reading B once.
- ``few_tile``: products of at most two waves of 128x256 output tiles on an H100's 132
  multiprocessors, most of them less than one (cubes from 768 to 2560, small M*N with deep
  K: 128x128x65536 is one tile), where a data-parallel grid idles.
- ``calibration_decode``: decode-sized and few-tile products that the committed calibration
  of untuned ``auto`` on them is tuned on, disjoint from ``decode``, ``few_tile`` and
  ``validation`` (which score it): other projections (Llama-2-13B's, Llama-2-7B's MLP, a
  2048-wide k/v) at other token counts, and other cubes.
- ``calibration_misaligned``: other misaligned shapes, from 300 to 6145 on a side, that the
  committed calibration of the misaligned path is tuned on (never the shapes it is scored
  on).
- ``validation_wide``: ``validation`` and more shapes no shipped calibration was tuned on (some
  are in the benchmark suites ``odd``, ``few_tile``, ``batched`` and ``decode``): odd cubes from
  503 to 2600, the vocabulary heads of four tokenizers (32000, 50257, 128256 and 151936 words) at
  M from 1 to 8192, deep K (32768 to 65536) under small M x N, and more batches: the 16-bit
  problems of the wide validation.
- ``validation_types``: shapes for the other dtypes of the wide validation (int8, fp8, tf32,
  f64), none a calibration shape, every side a multiple of 16 and M above 16 (cuBLASLt's int8
  and fp8 need it): cubes, LLM
  projections at several token counts, a vocabulary head and a deep-K product.
- ``calibration_large``: large aligned products (cubes from 3072 to 12288 and rectangles
  between) that the committed calibration of a dtype's large end (int8) is tuned on, none of
  them a shape it is scored on (4096^3, 8192^3, 2048x8192x4096, ``square``, ``llm``).
"""
from __future__ import annotations

from typing import NamedTuple

from multibackend.core.errors import InvalidArgument


class Shape(NamedTuple):
    """One matmul size: ``batch`` products of (M x K) @ (K x N)."""

    batch: int
    m: int
    n: int
    k: int

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    @property
    def label(self) -> str:
        size = f"{self.m}x{self.n}x{self.k}"
        return f"{self.batch}x[{size}]" if self.batch > 1 else size


#: (N, K) of each model's projection weights: hidden size h, MLP width f, grouped-query k/v
#: width g. q and o are (h, h); k and v (g, h); gate and up (f, h); down (h, f).
LLM_PROJECTIONS = {
    "llama2-7b": {"qkvo": (4096, 4096), "gate_up": (11008, 4096), "down": (4096, 11008)},
    "llama3-8b": {"qo": (4096, 4096), "kv": (1024, 4096), "gate_up": (14336, 4096),
                  "down": (4096, 14336)},
    "llama2-13b": {"qkvo": (5120, 5120), "gate_up": (13824, 5120), "down": (5120, 13824)},
    "llama-70b": {"qo": (8192, 8192), "kv": (1024, 8192), "gate_up": (28672, 8192),
                  "down": (8192, 28672)},
}
LLM_TOKENS = (1, 16, 128, 2048, 8192)

#: (N, K) of the validation suite's models (fused q/k/v and gate/up where the model fuses
#: them): hidden size h, MLP width f, q and k/v widths
VALIDATION_PROJECTIONS = {
    "qwen2.5-7b": {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584),
                   "down": (3584, 18944)},
    "gemma2-9b": {"q": (4096, 3584), "kv": (2048, 3584), "o": (3584, 4096),
                  "gate": (14336, 3584), "down": (3584, 14336)},
    "phi3-mini": {"qkv": (9216, 3072), "o": (3072, 3072), "gate_up": (16384, 3072),
                  "down": (3072, 8192)},
    "mistral-nemo-12b": {"q": (4096, 5120), "kv": (1024, 5120), "o": (5120, 4096),
                         "gate": (14336, 5120), "down": (5120, 14336)},
}
VALIDATION_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 512, 4096)
VALIDATION_PER_PROJECTION = 3
VALIDATION_CUBES = (Shape(1, 777, 777, 777), Shape(1, 1200, 1200, 1200),
                    Shape(1, 1999, 1999, 1999), Shape(1, 3000, 3000, 3000),
                    Shape(1, 5003, 5003, 5003))
VALIDATION_BATCHED = (Shape(16, 256, 256, 256), Shape(8, 1024, 1024, 1024),
                      Shape(32, 128, 128, 4096), Shape(4, 2048, 2048, 512),
                      Shape(12, 1024, 64, 1024))


#: validation_wide's shapes beyond validation's
WIDE_CUBES = tuple(Shape(1, s, s, s) for s in (503, 640, 1000, 1331, 1500, 1777, 2047, 2333,
                                               2600))
VOCABULARIES = (32000, 50257, 128256, 151936)
VOCABULARY_TOKENS = (1, 8, 64, 512, 2048, 8192)
DEEP_K = (Shape(1, 64, 64, 65536), Shape(1, 128, 128, 32768), Shape(1, 256, 256, 49152),
          Shape(1, 16, 1024, 32768), Shape(1, 512, 128, 65536), Shape(1, 32, 4096, 32768))
WIDE_BATCHED = (Shape(64, 128, 128, 128), Shape(32, 512, 512, 512), Shape(8, 4096, 4096, 128))
#: validation_types: every side a multiple of 16
TYPES_SHAPES = (Shape(1, 1024, 1024, 1024), Shape(1, 3584, 3584, 3584), Shape(1, 6016, 6016, 6016),
                Shape(1, 32, 4096, 4096), Shape(1, 64, 14336, 4096), Shape(1, 512, 4096, 14336),
                Shape(1, 2048, 6144, 4096), Shape(1, 4096, 4096, 4096),
                Shape(1, 8192, 28672, 8192), Shape(1, 128, 128256, 4096),
                Shape(1, 256, 256, 32768), Shape(1, 1008, 2032, 3056))


def _llm() -> tuple[Shape, ...]:
    pairs = list(dict.fromkeys(nk for model in LLM_PROJECTIONS.values()
                               for nk in model.values()))
    return tuple(Shape(1, m, n, k) for m in LLM_TOKENS for n, k in pairs)


def _validation() -> tuple[Shape, ...]:
    """Each projection at VALIDATION_PER_PROJECTION token counts, walking the token list so
    that consecutive projections take the next ones (every M comes up several times)."""
    pairs = list(dict.fromkeys(nk for model in VALIDATION_PROJECTIONS.values()
                               for nk in model.values()))
    tokens = VALIDATION_TOKENS
    shapes = [Shape(1, tokens[(i * VALIDATION_PER_PROJECTION + j) % len(tokens)], n, k)
              for i, (n, k) in enumerate(pairs) for j in range(VALIDATION_PER_PROJECTION)]
    return tuple(shapes) + VALIDATION_CUBES + VALIDATION_BATCHED


#: decode's (N, K) projections and token counts
DECODE_PROJECTIONS = ((4096, 4096), (6144, 4096), (1024, 4096), (14336, 4096), (28672, 4096),
                      (4096, 14336), (128256, 4096), (10240, 8192))
DECODE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
#: calibration_decode's (N, K) projections and token counts (none of decode's)
CALIBRATION_DECODE_PROJECTIONS = ((5120, 5120), (13824, 5120), (5120, 13824), (2048, 4096),
                                  (11008, 4096))
CALIBRATION_DECODE_TOKENS = (3, 6, 12, 24, 48, 96, 192, 384)

SUITES: dict[str, tuple[Shape, ...]] = {
    "square": tuple(Shape(1, s, s, s) for s in (256, 512, 1024, 2048, 4096, 8192, 16384)),
    "llm": _llm(),
    "odd": (Shape(1, 1000, 1000, 1000), Shape(1, 4097, 4095, 4096), Shape(1, 333, 777, 999)),
    "skinny": (Shape(1, 1, 8192, 8192), Shape(1, 8192, 1, 8192), Shape(1, 8, 16384, 4096),
               Shape(1, 16384, 8, 4096), Shape(1, 8192, 8192, 16), Shape(1, 65536, 128, 128)),
    "batched": (Shape(64, 128, 128, 128), Shape(32, 512, 512, 512), Shape(8, 2048, 2048, 2048),
                Shape(128, 64, 64, 256)),
    "validation": _validation(),
    "decode": tuple(Shape(1, m, n, k) for n, k in DECODE_PROJECTIONS for m in DECODE_TOKENS),
    "few_tile": (Shape(1, 768, 768, 768), Shape(1, 1000, 1000, 1000),
                 Shape(1, 1024, 1024, 1024), Shape(1, 1536, 1536, 1536),
                 Shape(1, 2048, 2048, 2048), Shape(1, 2560, 2560, 2560),
                 Shape(1, 128, 128, 65536), Shape(1, 256, 512, 32768),
                 Shape(1, 1024, 1024, 16384), Shape(1, 512, 512, 16384),
                 Shape(1, 256, 1024, 8192), Shape(1, 1024, 2048, 4096)),
    # 16-bit rows off the 16-byte grid (K or N not a multiple of 8): cuBLAS's slow path
    "misaligned": (Shape(1, 4095, 4095, 4095), Shape(1, 4097, 4095, 4096),
                   Shape(1, 3000, 4097, 4095), Shape(1, 8191, 8191, 8191),
                   Shape(1, 2047, 32001, 4096), Shape(1, 4096, 50257, 4096)),
    "misaligned_small": (Shape(1, 17, 33, 65), Shape(1, 100, 257, 99), Shape(1, 129, 511, 255),
                         Shape(1, 333, 129, 499), Shape(1, 511, 511, 511),
                         Shape(1, 64, 4095, 4097), Shape(1, 7, 11008, 4095)),
    "calibration_decode": tuple(Shape(1, m, n, k) for n, k in CALIBRATION_DECODE_PROJECTIONS
                                for m in CALIBRATION_DECODE_TOKENS) + tuple(
        Shape(1, s, s, s) for s in (896, 1280, 1792, 2304)),
    "calibration_misaligned": (
        Shape(1, 513, 515, 517), Shape(1, 1025, 1023, 1021), Shape(1, 1537, 1535, 1539),
        Shape(1, 2049, 2047, 2045), Shape(1, 2500, 2999, 3001), Shape(1, 3583, 3585, 3581),
        Shape(1, 6143, 6145, 6141), Shape(1, 1024, 32003, 4096), Shape(1, 16, 4097, 4095),
        Shape(1, 128, 11009, 4095), Shape(1, 32, 6143, 4097), Shape(1, 300, 301, 303)),
    "validation_wide": _validation() + WIDE_CUBES + tuple(
        Shape(1, m, n, 4096) for n in VOCABULARIES for m in VOCABULARY_TOKENS) + DEEP_K
    + WIDE_BATCHED,
    "validation_types": TYPES_SHAPES,
    "calibration_large": tuple(Shape(1, s, s, s) for s in (3072, 5120, 6144, 12288)) + (
        Shape(1, 3072, 6144, 5120), Shape(1, 6144, 12288, 6144), Shape(1, 12288, 5120, 6144)),
}


def suite(name: str) -> tuple[Shape, ...]:
    """The shapes of suite ``name``."""
    try:
        return SUITES[name]
    except KeyError:
        raise InvalidArgument(f"suite is {name!r}: not a suite name "
                              f"(known: {', '.join(SUITES)})") from None


def parse_shape(text: str) -> Shape:
    """``"MxNxK"`` or ``"BxMxNxK"`` as a Shape (every dimension a positive integer)."""
    parts = text.lower().split("x")
    try:
        dims = [int(p) for p in parts]
    except ValueError:
        dims = []
    if len(dims) not in (3, 4) or min(dims) < 1:
        raise InvalidArgument(f"shape is {text!r}: expected MxNxK or BxMxNxK with positive "
                              "integers")
    return Shape(*([1] * (4 - len(dims)) + dims))
