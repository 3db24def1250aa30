"""Checks for notebook 02 (transforms)."""

from __future__ import annotations

from typing import Any, Callable

import torch
from PIL import Image

from ._core import Hint, attempted, exercise, require


@exercise("02.1", "pixels in [0, 1] now span [-1, 1], with 0.5 landing on 0.")
def to_unit_range(transform: Any) -> None:
    """``transform`` maps a float tensor in [0, 1] linearly onto [-1, 1]."""
    attempted(transform)
    require(callable(transform), "to_unit_range should be a transform (e.g. a v2.Compose), not a value.")
    x = torch.linspace(0, 1, 11).reshape(1, 1, 11)
    y = transform(x.clone())
    require(isinstance(y, torch.Tensor), f"the result should be a tensor, got {type(y).__name__}.")
    require(y.shape == x.shape, f"the shape changed from {tuple(x.shape)} to {tuple(y.shape)}: only change the values.")
    lo, mid, hi = (float(y.flatten()[i]) for i in (0, 5, 10))
    require(
        abs(lo + 1) < 1e-5 and abs(hi - 1) < 1e-5,
        f"0 should map to -1 and 1 to 1, got {lo:.3g} and {hi:.3g}. Think: multiply first or add first?",
    )
    require(abs(mid) < 1e-5, f"0.5 should map to 0, got {mid:.3g}: the map must be linear (only Add and Mult).")


def _sample_image(width: int, height: int) -> Image.Image:
    g = torch.Generator().manual_seed(0)
    arr = (torch.rand(height, width, 3, generator=g) * 255).to(torch.uint8).numpy()
    return Image.fromarray(arr)


@exercise("02.2", "train_tf augments (random every call), val_tf is deterministic; both give float [3, 48, 48] in [0, 1].")
def train_and_val(train_tf: Any, val_tf: Any) -> None:
    """Both pipelines turn a PIL image into a float32 ``[3, 48, 48]`` tensor in [0, 1]."""
    attempted(train_tf, val_tf)
    # Not square, not 48 px, and one smaller than 48 px: the pipelines must resize, not only crop.
    for img in (_sample_image(90, 72), _sample_image(40, 30)):
        for name, tf in (("train_tf", train_tf), ("val_tf", val_tf)):
            out = tf(img)
            size = f"a {img.width}x{img.height} image"
            require(isinstance(out, torch.Tensor), f"{name} should end with a tensor, got {type(out).__name__}: add v2.ToImage().")
            shape = tuple(out.shape)
            if shape != (3, 48, 48):
                if len(shape) == 3 and 48 in shape[1:]:
                    raise Hint(
                        f"{name} turns {size} into shape {shape}: Resize(48) with one number sets the *shorter* side; "
                        "follow it with CenterCrop(48), or use Resize((48, 48))."
                    )
                raise Hint(f"{name} turns {size} into shape {shape}, expected (3, 48, 48): resize or crop to 48 pixels.")
            require(out.dtype == torch.float32, f"{name} gives {out.dtype}: add v2.ToDtype(torch.float32, scale=True).")
            lo, hi = float(out.min()), float(out.max())
            if hi > 1.5:
                raise Hint(f"{name} values reach {hi:.3g}: use ToDtype(torch.float32, scale=True) to scale 0..255 to 0..1.")
            require(lo >= 0 and hi <= 1, f"{name} values span {lo:.3g}..{hi:.3g}; here both must stay in [0, 1] (leave out Normalize).")
            blank = (out == 0).all(dim=0)
            require(
                not (bool(blank.all(dim=0).any()) or bool(blank.all(dim=1).any())),
                f"{name} pads {size} with black borders: a crop alone cannot enlarge an image, resize it first.",
            )
    img = _sample_image(90, 72)
    outs = [train_tf(img) for _ in range(8)]
    require(any(not torch.equal(outs[0], o) for o in outs[1:]), "train_tf gave the same output 8 times: add a random augmentation.")
    require(torch.equal(val_tf(img), val_tf(img)), "val_tf should be deterministic: no Random* transforms in validation.")


@exercise("02.3", "is_round labels circles, rings and crescents 1 and every other shape 0.")
def is_round(fn: Callable[[int], Any], classes: list[str]) -> None:
    """``fn(label)`` is 1 for round classes, 0 otherwise, for every label."""
    attempted(fn)
    require(callable(fn), "is_round should be a function of the label.")
    expected = {i: int(c in ("circle", "ring", "crescent")) for i, c in enumerate(classes)}
    for label, want in expected.items():
        got = fn(label)
        if got is None:
            raise Hint(f"is_round({label}) returned None: did you forget `return`?")
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, (int, float)) or got not in (0, 1):
            raise Hint(f"is_round({label}) should return the number 0 or 1, got {got!r}.")
        if int(got) != want:
            raise Hint(f"is_round({label}) ({classes[label]}) should be {want}, got {got!r}.")
