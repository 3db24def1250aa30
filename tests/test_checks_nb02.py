"""course_lib.checks.nb02: right answers pass, stubs are "not attempted", and each wrong answer gets its own hint."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from course_lib.checks import Status, nb02
from course_lib.transforms import Add, Mult
from exercise_status import right_and_stubs, status


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
    crop_only = v2.Compose([v2.RandomCrop(48, pad_if_needed=True), *to_float]), v2.Compose([v2.CenterCrop(48), *to_float])
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
    assert status(nb02.is_round, lambda y: int(classes[y] in ("circle", "ring", "crescent")), classes)[0] is Status.SOLVED
    assert "did you forget `return`" in status(nb02.is_round, lambda y: None, classes)[1]
    assert "(ring) should be 1" in status(nb02.is_round, lambda y: int(classes[y] == "circle" or y == 2), classes)[1]
    assert "the number 0 or 1, got 'other'" in status(nb02.is_round, lambda y: "other", classes)[1]
    assert "the number 0 or 1, got tensor" in status(nb02.is_round, lambda y: torch.tensor([1.0, 0.0]), classes)[1]
    assert status(nb02.is_round, lambda y: torch.tensor(int(classes[y] in ("circle", "ring", "crescent"))), classes)[0] is Status.SOLVED


# ----------------------------------------------------------------- 02.4: image and mask together

pair_tf = v2.Compose([v2.RandomResizedCrop(48, scale=(0.5, 1.0), antialias=True), v2.RandomHorizontalFlip(),
                      v2.ToDtype(torch.float32, scale=True)])


def augment_pair(image, mask):
    """The notebook's solution."""
    return pair_tf(tv_tensors.Image(image), tv_tensors.Mask(mask))


def plain_mask(image, mask):
    return pair_tf(tv_tensors.Image(image), mask)


def two_calls(image, mask):
    return pair_tf(tv_tensors.Image(image)), pair_tf(tv_tensors.Mask(mask))


def mask_as_image(image, mask):
    return pair_tf(tv_tensors.Image(image), tv_tensors.Image(mask[None]))


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
    assert "not the class ids 0-3" in status(check, mask_as_image)[1]
    assert "not the class ids 0-3" in status(check, mask_to_float)[1]
    assert "should be random" in status(check, not_random)[1]
    assert "float32 in [0, 1]" in status(check, unscaled)[1]


# ----------------------------------------------------------------- 02.5: a transform class in a module, spawn workers

GOOD = '''
import torch


class GaussianNoise:
    def __init__(self, std=0.1):
        if std < 0:
            raise ValueError(f"std must be >= 0, got {std}")
        self.std = std

    def __call__(self, image):
        if not isinstance(image, torch.Tensor):
            raise TypeError("GaussianNoise works on tensors: put it after v2.ToImage() and v2.ToDtype(torch.float32, scale=True)")
        return (image + torch.randn_like(image) * self.std).clamp(0, 1)

    def __repr__(self):
        return f"GaussianNoise(std={self.std})"
'''

WRONG = {
    "no_clamp": (GOOD.replace(").clamp(0, 1)", ")"), "with std=1 values left [0, 1]"),
    "numpy": (GOOD.replace("torch.randn_like(image)", "torch.from_numpy(__import__('numpy').random.standard_normal("
                           "tuple(image.shape))).float()"), "with the same torch.manual_seed the noise differs"),
    "generator_in_init": (GOOD.replace("self.std = std", "self.std = std\n        self.g = torch.Generator().manual_seed(0)")
                          .replace("torch.randn_like(image)", "torch.randn(image.shape, generator=self.g)"),
                          "with the same torch.manual_seed the noise differs"),
    "in_place": (GOOD.replace("return (image + torch.randn_like(image) * self.std).clamp(0, 1)",
                              "return image.add_(torch.randn_like(image) * self.std).clamp_(0, 1)"), "changed its input in place"),
    "variance": (GOOD.replace("* self.std)", "* self.std ** 2)"), "standard deviation of 0.010"),
    "no_repr": (GOOD.split("    def __repr__")[0], "give it a __repr__"),
    "no_validation": (GOOD.replace("            raise ValueError", "            pass  #"), "should raise ValueError"),
    "no_type_error": (GOOD.replace("raise TypeError(", "print("), "should raise TypeError saying what to do"),
    "noise_drawn_once": (GOOD.replace("self.std = std", "self.std = std\n        self.noise = None").replace(
        "return (image + torch.randn_like(image) * self.std).clamp(0, 1)",
        "if self.noise is None:\n            self.noise = torch.randn_like(image) * self.std\n"
        "        return (image + self.noise).clamp(0, 1)"), "draw new noise in __call__"),
    "wrong_name": (GOOD.replace("class GaussianNoise", "class Noise"), "should define a class GaussianNoise"),
}


def write_module(folder: Path, name: str, source: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return path


@pytest.fixture
def module_folder(tmp_path: Path):
    yield tmp_path
    for name in ["good_noise", "edited_noise", *(f"noise_{k}" for k in WRONG)]:
        sys.modules.pop(name, None)
    if str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


def test_02_noise_module(module_folder: Path) -> None:
    check = nb02.noise_module
    assert status(check, ...)[0] is Status.NOT_ATTEMPTED
    assert "run the %%writefile cell first" in status(check, module_folder / "missing.py")[1]
    assert status(check, write_module(module_folder, "good_noise", GOOD))[0] is Status.SOLVED
    for name, (source, hint) in WRONG.items():
        message = status(check, write_module(module_folder, f"noise_{name}", source))[1]
        assert hint in message, (name, message)


def test_02_noise_module_sees_edits_and_spawned_copies(module_folder: Path) -> None:
    """A module edited after its first import is checked as edited; a generator made in __init__ and drawn the
    same in both spawn workers is caught there, where it matters."""
    path = write_module(module_folder, "edited_noise", WRONG["no_clamp"][0])
    assert "values left [0, 1]" in status(nb02.noise_module, path)[1]
    write_module(module_folder, "edited_noise", GOOD)
    assert status(nb02.noise_module, path)[0] is Status.SOLVED
    same_in_workers = GOOD.replace("self.std = std", "self.std = std\n        self.calls = 0").replace(
        "torch.randn_like(image)", "(torch.randn_like(image) if self.calls < 4 else torch.zeros_like(image) + 0.1)"
    ).replace("        if not isinstance", "        self.calls += 1\n        if not isinstance")
    write_module(module_folder, "edited_noise", same_in_workers)
    assert "both spawn workers drew the same noise" in status(nb02.noise_module, path)[1]
