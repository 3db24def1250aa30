"""Notebook 02: custom transforms are callables.

``Compose`` (torchvision's v1 or v2) calls each one on the output of the previous. ``Add`` and ``Mult`` are classes,
not lambdas, so they pickle into DataLoader workers under every start method, and their ``repr`` says what they do.
``decode_augment`` is the realistic CPU-bound image pipeline notebook 04 and ``python -m course_lib bench`` use.
``image_decoder`` picks the decoder that reads a file straight into a tensor: TorchCodec's, else torchvision's.
"""

from __future__ import annotations

import numbers
from typing import Callable, TypeVar

import numpy as np
import torch
from PIL import Image
from torch import nn

__all__ = ["Add", "Mult", "OneHot", "decode_augment", "image_decoder"]

_T = TypeVar("_T", torch.Tensor, np.ndarray, int, float, complex)


def _check_input(name: str, sample: object) -> None:
    if isinstance(sample, Image.Image):
        raise TypeError(
            f"{name} works on tensors and numbers, not on a PIL image: put v2.ToImage() and "
            f"v2.ToDtype(torch.float32, scale=True) before {name} in the Compose"
        )
    if not isinstance(sample, (torch.Tensor, np.ndarray, numbers.Number)):
        raise TypeError(f"{name} works on tensors, NumPy arrays and numbers, got {type(sample).__name__}")


class Add:
    """Notebook 02, section 2: add a constant to every element: ``Add(2)(x) == x + 2``."""

    def __init__(self, value: float) -> None:
        if not isinstance(value, numbers.Number):
            raise TypeError(f"Add needs a number, got {type(value).__name__}")
        self.value = value

    def __call__(self, sample: _T) -> _T:
        _check_input("Add", sample)
        return sample + self.value

    def __repr__(self) -> str:
        return f"Add({self.value!r})"


class Mult:
    """Notebook 02, section 2: multiply every element by a constant: ``Mult(3)(x) == x * 3``."""

    def __init__(self, value: float) -> None:
        if not isinstance(value, numbers.Number):
            raise TypeError(f"Mult needs a number, got {type(value).__name__}")
        self.value = value

    def __call__(self, sample: _T) -> _T:
        _check_input("Mult", sample)
        return sample * self.value

    def __repr__(self) -> str:
        return f"Mult({self.value!r})"


class OneHot:
    """Notebook 02, section 3: target transform: class index -> one-hot float vector of length ``num_classes``."""

    def __init__(self, num_classes: int) -> None:
        if num_classes < 1:
            raise ValueError("num_classes must be >= 1")
        self.num_classes = num_classes

    def __call__(self, target: int) -> torch.Tensor:
        t = int(target)
        if not 0 <= t < self.num_classes:
            raise ValueError(f"target {t} is outside 0..{self.num_classes - 1}")
        out = torch.zeros(self.num_classes)
        out[t] = 1.0
        return out

    def __repr__(self) -> str:
        return f"OneHot({self.num_classes})"


def decode_augment(size: int = 128) -> nn.Module:
    """Notebook 04, section 1: a typical training augmentation of decoded images: random crop, flip, colour jitter, to uint8 tensor.

    All four steps work on the PIL image, single-threaded on the CPU, as in real JPEG training
    pipelines: loading is then bound by the CPU, which is what DataLoader workers speed up.
    Returns a torchvision ``v2.Compose``; samples come out as ``uint8`` tensors ``(3, size, size)``.
    """
    from torchvision.transforms import v2  # imported here: the rest of the module needs no torchvision

    return v2.Compose(
        [
            v2.RandomResizedCrop(size),
            v2.RandomHorizontalFlip(),
            v2.ColorJitter(0.4, 0.4, 0.4),
            v2.PILToTensor(),
        ]
    )


def image_decoder() -> Callable[..., torch.Tensor]:
    """Notebook 02, section 4: ``decode_image(path, mode="RGB")``, a file straight to a ``uint8`` tensor, channels first.

    TorchCodec's (``torchcodec.decoders.decode_image``, 0.16 or later: no FFmpeg needed for images) where torchcodec
    imports and its native library loads; else torchvision's ``torchvision.io.decode_image``, deprecated since
    torchvision 0.29 (it warns on each call; Python shows a library's DeprecationWarning only where a filter asks).
    TorchCodec's Linux wheels on PyPI are built for a CUDA torch: beside a CPU-only torch (PyTorch's CPU index) they
    do not load, and need the CPU build from that index.
    """
    try:
        from torchcodec.decoders import decode_image
    except (ImportError, OSError, RuntimeError):  # not installed, older than 0.16, or its library does not load here
        from torchvision.io import decode_image
    return decode_image
