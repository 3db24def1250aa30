"""Checks for notebook 02 (transforms)."""

from __future__ import annotations

import numbers
from typing import Any, Callable

import torch
from PIL import Image
from torchvision import tv_tensors

from ._core import Hint, attempted, exercise, require


def _check_chain(chain_cls: Any) -> None:
    """``chain_cls(*steps)`` applies the steps in order, is the identity when empty, and lists them in its repr."""
    from ..transforms import Add, Mult

    require(isinstance(chain_cls, type), "pass the class itself, `Chain`, not an instance.")
    result = chain_cls(Add(2), Mult(3))(1)
    require(result != 5, "Chain(Add(2), Mult(3))(1) gave 5: the steps ran last to first. Run them in the order given.")
    require(
        result == 9,
        f"Chain(Add(2), Mult(3))(1) should be (1 + 2) * 3 = 9, got {result!r}: each step gets the "
        "previous step's output, and __call__ returns the last one.",
    )
    require(chain_cls()(7) == 7, "an empty Chain() should return its input unchanged.")
    x = torch.tensor([0.0, 1.0])
    require(torch.equal(chain_cls(Mult(2))(x), x * 2), "Chain(Mult(2)) should work on tensors too.")
    text = repr(chain_cls(Add(2), Mult(3)))
    require(
        "Add(2)" in text and "Mult(3)" in text and text.index("Add(2)") < text.index("Mult(3)"),
        f"repr(Chain(Add(2), Mult(3))) is {text[:60]!r}: list the steps in order, e.g. Chain(Add(2), Mult(3)).",
    )


@exercise("02.1", "your Chain runs its steps in order, and maps pixels in [0, 1] onto [-1, 1], with 0.5 landing on 0.")
def to_unit_range(chain_cls: Any, transform: Any) -> None:
    """``chain_cls`` is the learner's Compose; ``transform``, built with it, maps [0, 1] linearly onto [-1, 1]."""
    attempted(chain_cls, transform)
    _check_chain(chain_cls)
    require(isinstance(transform, chain_cls), f"build to_unit_range with your Chain, got {type(transform).__name__}.")
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


@exercise(
    "02.2", "train_tf augments (random every call), val_tf is deterministic; both give float [3, 48, 48] in [0, 1]."
)
def train_and_val(train_tf: Any, val_tf: Any) -> None:
    """Both pipelines turn a PIL image into a float32 ``[3, 48, 48]`` tensor in [0, 1]."""
    attempted(train_tf, val_tf)
    # Not square, not 48 px, and one smaller than 48 px: the pipelines must resize, not only crop.
    for img in (_sample_image(90, 72), _sample_image(40, 30)):
        for name, tf in (("train_tf", train_tf), ("val_tf", val_tf)):
            out = tf(img)
            size = f"a {img.width}x{img.height} image"
            require(
                isinstance(out, torch.Tensor),
                f"{name} should end with a tensor, got {type(out).__name__}: add v2.ToImage().",
            )
            shape = tuple(out.shape)
            if shape != (3, 48, 48):
                if len(shape) == 3 and 48 in shape[1:]:
                    raise Hint(
                        f"{name} turns {size} into shape {shape}: Resize(48) with one number sets the *shorter* side; "
                        "follow it with CenterCrop(48), or use Resize((48, 48))."
                    )
                raise Hint(
                    f"{name} turns {size} into shape {shape}, expected (3, 48, 48): resize or crop to 48 pixels."
                )
            require(out.dtype == torch.float32, f"{name} gives {out.dtype}: add v2.ToDtype(torch.float32, scale=True).")
            lo, hi = float(out.min()), float(out.max())
            if hi > 1.5:
                raise Hint(
                    f"{name} values reach {hi:.3g}: use ToDtype(torch.float32, scale=True) to scale 0..255 to 0..1."
                )
            require(
                lo >= 0 and hi <= 1,
                f"{name} values span {lo:.3g}..{hi:.3g}; here both must stay in [0, 1] (leave out Normalize).",
            )
            blank = (out == 0).all(dim=0)
            require(
                not (bool(blank.all(dim=0).any()) or bool(blank.all(dim=1).any())),
                f"{name} pads {size} with black borders: a crop alone cannot enlarge an image, resize it first.",
            )
    img = _sample_image(90, 72)
    outs = [train_tf(img) for _ in range(8)]
    require(
        any(not torch.equal(outs[0], o) for o in outs[1:]),
        "train_tf gave the same output 8 times: add a random augmentation.",
    )
    require(
        torch.equal(val_tf(img), val_tf(img)), "val_tf should be deterministic: no Random* transforms in validation."
    )


_ROUND = ("circle", "ring", "crescent")


def _zero_or_one(fn: Callable[..., Any], label: int, *classes: list[str]) -> int:
    """``fn(label, *classes)`` as the int 0 or 1, or a :class:`Hint`."""
    got = fn(label, *classes)
    if got is None:
        raise Hint(f"is_round({label}) returned None: did you forget `return`?")
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if type(got).__module__ == "numpy" and getattr(got, "size", 0) == 1:  # np.int64(1), np.array(1): a number too
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, numbers.Real) or got not in (0, 1):
        raise Hint(f"is_round({label}) should return the number 0 or 1, got {got!r}.")
    return int(got)


@exercise("02.3", "is_round labels circles, rings and crescents 1 and every other shape 0, by their names.")
def is_round(fn: Callable[..., Any], classes: list[str]) -> None:
    """``fn(label)`` is 1 for round classes of ``classes``, 0 otherwise; ``fn(label, other_classes)`` follows another
    class list (the same names in another order), so that no label number is hard-coded."""
    attempted(fn)
    require(callable(fn), "is_round should be a function of the label.")
    for label, name in enumerate(classes):
        want = int(name in _ROUND)
        got = _zero_or_one(fn, label)
        require(got == want, f"is_round({label}) ({name}) should be {want}, got {got!r}.")
    permuted = list(reversed(classes))
    try:
        answers = [_zero_or_one(fn, label, permuted) for label in range(len(permuted))]
    except TypeError:
        answers = None
    if answers is None:  # a keyword-only `classes` (def is_round(label, *, classes=...)) is as good
        try:
            answers = [_zero_or_one(lambda y, c: fn(y, classes=c), label, permuted) for label in range(len(permuted))]
        except TypeError:
            raise Hint(
                "is_round takes only the label: give it a second parameter, `classes=train.classes`, and look the "
                "label's name up in it (the check passes the class names in another order, to see that no label "
                "number is hard-coded)."
            ) from None
    for label, got in enumerate(answers):
        want = int(permuted[label] in _ROUND)
        require(
            got == want,
            f"with the class names in another order, is_round({label}, classes) ({permuted[label]}) "
            f"gave {got}, not {want}: it still answers from label numbers. Look the name up, classes[label], and "
            "compare names.",
        )


# ----------------------------------------------------------------- 02.4: an image and its mask, transformed together


def _image_and_mask() -> tuple[torch.Tensor, torch.Tensor]:
    """A 60 x 80 label map (classes 0-3, no symmetry) and an image whose grey level is 60 x the label."""
    mask = torch.zeros(60, 80, dtype=torch.uint8)
    mask[:30, :40] = 1
    mask[35:, 50:] = 2
    mask[5:20, 60:75] = 3
    return (mask * 60).expand(3, 60, 80).clone(), mask


@exercise("02.4", "augment_pair crops and flips the image and its mask together; the mask keeps its class ids.")
def augment_pair(fn: Callable[[torch.Tensor, torch.Tensor], Any]) -> None:
    """``fn(image uint8 [3, H, W], mask [H, W])`` returns a float image ``[3, 48, 48]`` and an aligned integer mask."""
    attempted(fn)
    require(callable(fn), "augment_pair should be a function of (image, mask).")
    image, mask = _image_and_mask()
    outputs = []
    for seed in range(6):
        torch.manual_seed(seed)
        out = fn(image.clone(), mask.clone())
        require(
            isinstance(out, (tuple, list)) and len(out) == 2,
            f"augment_pair should return (image, mask), got {type(out).__name__}.",
        )
        img, m = out
        require(isinstance(img, torch.Tensor) and isinstance(m, torch.Tensor), "both results should be tensors.")
        require(
            tuple(m.shape)[-2:] != (60, 80),
            "the mask came back untouched: wrap it as tv_tensors.Mask(mask), so that "
            "the v2 transforms crop and flip it with the image (a plain tensor next to an image is passed through).",
        )
        require(tuple(img.shape) == (3, 48, 48), f"the image should have shape (3, 48, 48), got {tuple(img.shape)}.")
        require(tuple(m.shape)[-2:] == (48, 48), f"the mask should be 48 x 48, got {tuple(m.shape)}.")
        require(
            img.dtype == torch.float32 and 0 <= float(img.min()) and float(img.max()) <= 1,
            f"the image should be float32 in [0, 1], got {img.dtype}: end with v2.ToDtype(torch.float32, scale=True).",
        )
        require(
            not isinstance(m, tv_tensors.Image),
            "the mask came back as a tv_tensors.Image: wrapped as an image, it "
            "is resized with smooth interpolation (class ids blend into values that are no class) and converted by "
            "ToDtype like the picture. Wrap it as tv_tensors.Mask(mask): a Mask is resized by the nearest pixel and "
            "keeps its integer ids.",
        )
        require(
            not m.is_floating_point() and set(m.unique().tolist()) <= {0, 1, 2, 3},
            f"the mask holds {sorted(m.unique().tolist())[:6]}, not the class ids 0-3: a tv_tensors.Mask is never "
            "scaled or blended (ToDtype(torch.float32, scale=True) converts images only), so either the mask went "
            "through the pipeline as something else than a Mask, or your code converted it to float.",
        )
        grey = (img[0] * 255 / 60).round()
        agree = float((grey == m.reshape(48, 48).to(grey.dtype)).float().mean())
        require(
            agree > 0.85,
            f"image and mask disagree on {1 - agree:.0%} of the pixels: they were cropped or flipped "
            "differently. Call one pipeline once with both, tv_tensors.Image(image) and tv_tensors.Mask(mask).",
        )
        outputs.append(m.reshape(48, 48))
    require(
        any(not torch.equal(outputs[0], o) for o in outputs[1:]),
        "six calls gave the same crop: augmentation should be random (RandomResizedCrop, RandomHorizontalFlip).",
    )


__all__ = ["to_unit_range", "train_and_val", "is_round", "augment_pair"]
