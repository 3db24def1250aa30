"""course_lib.checks.nb02: right answers pass, stubs are "not attempted", and each wrong answer gets its own hint."""

from __future__ import annotations

import numpy as np
import pytest

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from course_lib.checks import Status, nb02
from course_lib.transforms import Add, Mult
from exercise_status import right_and_stubs, status

pytestmark = pytest.mark.quick


class Chain:
    """The notebook's solution."""

    def __init__(self, *transforms):
        self.transforms = transforms

    def __call__(self, sample):
        for transform in self.transforms:
            sample = transform(sample)
        return sample

    def __repr__(self):
        steps = ", ".join(repr(t) for t in self.transforms)
        return f"Chain({steps})"


class Reversed(Chain):
    def __call__(self, sample):
        for transform in reversed(self.transforms):
            sample = transform(sample)
        return sample


class FirstOnly(Chain):
    def __call__(self, sample):
        return self.transforms[0](sample) if self.transforms else sample


class NoRepr(Chain):
    __repr__ = object.__repr__


class EmptyFails(Chain):
    def __call__(self, sample):
        out = None
        for transform in self.transforms:
            out = transform(sample if out is None else out)
        return out


def test_02_unit_range() -> None:
    check = nb02.to_unit_range
    assert status(check, Chain, Chain(Mult(2), Add(-1)))[0] is Status.SOLVED
    assert status(check, Chain, Chain(Add(-0.5), Mult(2)))[0] is Status.SOLVED
    assert "multiply first or add first" in status(check, Chain, Chain(Add(-1), Mult(2)))[1]
    assert status(check, ..., ...)[0] is Status.NOT_ATTEMPTED
    assert status(check, Chain, ...)[0] is Status.NOT_ATTEMPTED
    assert "ran last to first" in status(check, Reversed, Reversed(Mult(2), Add(-1)))[1]
    assert "should be (1 + 2) * 3 = 9, got 3" in status(check, FirstOnly, FirstOnly(Mult(2), Add(-1)))[1]
    assert "list the steps in order" in status(check, NoRepr, NoRepr(Mult(2), Add(-1)))[1]
    assert "empty Chain() should return its input" in status(check, EmptyFails, EmptyFails(Mult(2), Add(-1)))[1]
    assert "build to_unit_range with your Chain" in status(check, Chain, v2.Compose([Mult(2), Add(-1)]))[1]
    assert "not an instance" in status(check, Chain(), Chain())[1]


def test_02_pipelines() -> None:
    to_float = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]
    train_tf = v2.Compose([v2.RandomResizedCrop(48, antialias=True), v2.RandomHorizontalFlip(), *to_float])
    val_tf = v2.Compose([v2.Resize(52, antialias=True), v2.CenterCrop(48), *to_float])
    assert status(nb02.train_and_val, train_tf, val_tf)[0] is Status.SOLVED
    assert "deterministic" in status(nb02.train_and_val, train_tf, train_tf)[1]
    assert "add a random augmentation" in status(nb02.train_and_val, val_tf, val_tf)[1]
    unscaled = v2.Compose([v2.Resize(52, antialias=True), v2.CenterCrop(48), v2.ToImage(), v2.ToDtype(torch.float32)])
    assert "scale=True" in status(nb02.train_and_val, train_tf, unscaled)[1]
    assert "expected (3, 48, 48)" in status(nb02.train_and_val, train_tf, v2.Compose(to_float))[1]
    assert "add v2.ToImage()" in status(nb02.train_and_val, train_tf, v2.CenterCrop(48))[1]
    normalized = v2.Compose([val_tf, v2.Normalize([0.5] * 3, [0.5] * 3)])
    assert "leave out Normalize" in status(nb02.train_and_val, train_tf, normalized)[1]
    crop_only = (
        v2.Compose([v2.RandomCrop(48, pad_if_needed=True), *to_float]),
        v2.Compose([v2.CenterCrop(48), *to_float]),
    )
    assert status(nb02.train_and_val, *crop_only)[0] is Status.WRONG  # a 40x30 image is padded, not resized
    short_side = v2.Compose([v2.Resize(48, antialias=True), *to_float])
    assert "sets the *shorter* side" in status(nb02.train_and_val, train_tf, short_side)[1]


def test_checks_leave_the_learners_random_state_alone() -> None:
    to_float = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]
    train_tf = v2.Compose([v2.RandomResizedCrop(48, antialias=True), *to_float])
    val_tf = v2.Compose([v2.Resize((48, 48), antialias=True), *to_float])
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    nb02.train_and_val.evaluate(train_tf, val_tf)
    assert torch.equal(torch.rand(3), expected)


def test_02_is_round() -> None:
    classes = ["arrow", "circle", "crescent", "cross", "hexagon", "pentagon", "ring", "square", "star", "triangle"]
    check = nb02.is_round

    def is_round(label, names=classes):
        return int(names[label] in ("circle", "ring", "crescent"))

    assert status(check, is_round, classes)[0] is Status.SOLVED
    assert status(check, lambda y, c=classes: torch.tensor(is_round(y, c)), classes)[0] is Status.SOLVED
    # a NumPy integer is a number 0 or 1 too (issue 51: np.int64(0) was rejected)
    assert status(check, lambda y, c=classes: np.int64(is_round(y, c)), classes)[0] is Status.SOLVED
    assert status(check, lambda y, c=classes: np.array(is_round(y, c)), classes)[0] is Status.SOLVED
    assert "the number 0 or 1, got False" in status(check, lambda y, c=classes: np.bool_(is_round(y, c)), classes)[1]

    def keyword_only(label, *, classes=classes):  # issue 51: a keyword-only `classes` is as good
        return int(classes[label] in ("circle", "ring", "crescent"))

    assert status(check, keyword_only, classes)[0] is Status.SOLVED

    def keyword_only_numbers(label, *, classes=classes):
        return int(label in (1, 2, 6))

    assert "still answers from label numbers" in status(check, keyword_only_numbers, classes)[1]
    assert "did you forget `return`" in status(check, lambda y, c=classes: None, classes)[1]
    assert "(ring) should be 1" in status(check, lambda y, c=classes: int(c[y] == "circle" or y == 2), classes)[1]
    assert "the number 0 or 1, got 'other'" in status(check, lambda y, c=classes: "other", classes)[1]
    assert "the number 0 or 1, got tensor" in status(check, lambda y, c=classes: torch.tensor([1.0, 0.0]), classes)[1]
    # hard-coded label numbers: right for these classes, wrong for the same names in another order
    assert (
        "give it a second parameter, `classes=train.classes`"
        in status(check, lambda label: int(label in (1, 2, 6)), classes)[1]
    )
    assert (
        "still answers from label numbers"
        in status(check, lambda label, c=classes: int(label in (1, 2, 6)), classes)[1]
    )
    round_labels = {classes.index(n) for n in ("circle", "ring", "crescent")}  # looked up once, from the global list
    assert (
        "still answers from label numbers"
        in status(check, lambda label, c=classes: int(label in round_labels), classes)[1]
    )


# ----------------------------------------------------------------- 02.4: image and mask together

pair_tf = v2.Compose(
    [
        v2.RandomResizedCrop(48, scale=(0.5, 1.0), antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True),
    ]
)


def augment_pair(image, mask):
    """The notebook's solution."""
    return pair_tf(tv_tensors.Image(image), tv_tensors.Mask(mask))


def plain_mask(image, mask):
    return pair_tf(tv_tensors.Image(image), mask)


def two_calls(image, mask):
    return pair_tf(tv_tensors.Image(image)), pair_tf(tv_tensors.Mask(mask))


def mask_as_image(image, mask):
    return pair_tf(tv_tensors.Image(image), tv_tensors.Image(mask[None]))


def mask_as_image_2d(image, mask):
    return pair_tf(tv_tensors.Image(image), tv_tensors.Image(mask))


def mask_to_float(image, mask):
    img, m = augment_pair(image, mask)
    return img, m.float() / 3


def not_random(image, mask):
    tf = v2.Compose([v2.Resize((48, 48), antialias=True), v2.ToDtype(torch.float32, scale=True)])
    return tf(tv_tensors.Image(image), tv_tensors.Mask(mask))


def unscaled(image, mask):
    tf = v2.Compose([v2.RandomResizedCrop(48, antialias=True), v2.ToDtype(torch.float32)])
    return tf(tv_tensors.Image(image), tv_tensors.Mask(mask))


def test_02_augment_pair() -> None:
    check = nb02.augment_pair

    def stub(image, mask):
        raise NotImplementedError

    right_and_stubs(check, augment_pair, stub)
    assert "the mask came back untouched" in status(check, plain_mask)[1]
    assert "cropped or flipped differently" in status(check, two_calls)[1]
    as_image = status(check, mask_as_image)[1]
    assert (
        "came back as a tv_tensors.Image" in as_image and "float" not in as_image
    )  # no conversion the learner never did
    assert "came back as a tv_tensors.Image" in status(check, mask_as_image_2d)[1]
    assert "not the class ids 0-3" in status(check, mask_to_float)[1]
    assert "should be random" in status(check, not_random)[1]
    assert "float32 in [0, 1]" in status(check, unscaled)[1]
