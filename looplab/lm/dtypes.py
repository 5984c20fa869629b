"""A model dir's dtype: the names a command takes, and the default on each device (the faster of float32 and
bfloat16 for decoding on this CPU)."""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["DTYPES", "BF16_FLAGS", "default_dtype", "native_bfloat16"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: the CPU flags of native bfloat16 arithmetic (/proc/cpuinfo): AVX512-BF16, AMX's bfloat16 tiles
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def native_bfloat16() -> bool:
    """Whether this CPU does bfloat16 arithmetic natively (a flag of :data:`BF16_FLAGS` in /proc/cpuinfo; no
    such file, as off Linux: no)."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").split()
    except OSError:
        return False
    return any(flag in flags for flag in BF16_FLAGS)


def default_dtype(device: str = "cpu", weights: str = "float") -> str:
    """A model dir's dtype when a command names none: on a CPU the faster of the two for decoding — bfloat16
    where the CPU does bfloat16 arithmetic natively (measured 1.04–1.24× float32's tokens/s at Ouro-1.4B's,
    Nanbeige4.2-3B's and Parcae-770M's shapes on an AMX Xeon: docs/testing.md), float32 elsewhere, where
    bfloat16 is emulated; float32 on a GPU (the exactness tests' dtype), and under int8 weights (whose
    quality line is measured against float32)."""
    native = str(device).startswith("cpu") and weights == "float" and native_bfloat16()
    return "bfloat16" if native else "float32"
