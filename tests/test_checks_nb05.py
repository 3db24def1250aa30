"""course_lib.checks.nb05: right answers pass, stubs are "not attempted", and each wrong answer gets its own hint."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader, get_worker_info

from course_lib.checks import Status, nb05
from exercise_status import right_and_stubs, status


# ----------------------------------------------------------------- 05.1: a generator per worker


def _reseed(worker_id: int) -> None:
    info = get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed)


def _by_worker_id(worker_id: int) -> None:
    get_worker_info().dataset.rng = np.random.default_rng(worker_id)


def _fresh_entropy(worker_id: int) -> None:
    get_worker_info().dataset.rng = np.random.default_rng()


def _stub(worker_id: int) -> None:
    raise NotImplementedError


def _crashes(worker_id: int) -> None:
    1 / 0


@pytest.mark.quick
@pytest.mark.timeout(120)
def test_05_seed_workers() -> None:
    assert status(nb05.seed_workers, _reseed)[0] is Status.SOLVED
    assert "same shifts" in status(nb05.seed_workers, lambda worker_id: None)[1]
    assert "fresh entropy" in status(nb05.seed_workers, _fresh_entropy)[1]
    assert "worker id" in status(nb05.seed_workers, _by_worker_id)[1]
    stub = status(nb05.seed_workers, _stub)
    assert stub[0] is Status.NOT_ATTEMPTED and "`_stub`" in stub[1]  # raised in a worker, still named
    assert status(nb05.seed_workers, ...)[0] is Status.NOT_ATTEMPTED
    assert "function itself" in status(nb05.seed_workers, 3)[1]
    crashed = status(nb05.seed_workers, _crashes)[1]
    assert crashed == "running your answer raised in a DataLoader worker: ZeroDivisionError: division by zero"


# ----------------------------------------------------------------- 05.2: a module that spawn workers import

GOOD = """
import numpy as np
import torch
from torch.utils.data import get_worker_info


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


def seed_worker(worker_id):
    info = get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed)
"""

STUB = """
import torch


class GaussianNoise:
    def __init__(self, std=0.1):
        raise NotImplementedError

    def __call__(self, image):
        raise NotImplementedError

    def __repr__(self):
        raise NotImplementedError


def seed_worker(worker_id):
    raise NotImplementedError
"""

SEED = "    info.dataset.rng = np.random.default_rng(info.seed)"
WRONG = {
    "no_clamp": (GOOD.replace(").clamp(0, 1)", ")"), "with std=1 values left [0, 1]"),
    "numpy": (
        GOOD.replace(
            "torch.randn_like(image)", "torch.from_numpy(np.random.standard_normal(tuple(image.shape))).float()"
        ),
        "with the same torch.manual_seed the noise differs",
    ),
    "generator_in_init": (
        GOOD.replace("self.std = std", "self.std = std\n        self.g = torch.Generator().manual_seed(0)").replace(
            "torch.randn_like(image)", "torch.randn(image.shape, generator=self.g)"
        ),
        "with the same torch.manual_seed the noise differs",
    ),
    "in_place": (
        GOOD.replace(
            "return (image + torch.randn_like(image) * self.std).clamp(0, 1)",
            "return image.add_(torch.randn_like(image) * self.std).clamp_(0, 1)",
        ),
        "changed its input in place",
    ),
    "variance": (GOOD.replace("* self.std)", "* self.std ** 2)"), "standard deviation of 0.010"),
    "no_repr": (
        GOOD.replace('    def __repr__(self):\n        return f"GaussianNoise(std={self.std})"\n', ""),
        "give it a __repr__",
    ),
    "no_validation": (GOOD.replace("            raise ValueError", "            pass  #"), "should raise ValueError"),
    "no_type_error": (GOOD.replace("raise TypeError(", "print("), "should raise TypeError saying what to do"),
    "useless_type_error": (
        GOOD.replace(
            'raise TypeError("GaussianNoise works on tensors: put it after v2.ToImage() and '
            'v2.ToDtype(torch.float32, scale=True)")',
            'raise TypeError("wrong type")',
        ),
        "which does not tell the user what to do",
    ),
    "type_error_expects_only": (
        GOOD.replace(
            '"GaussianNoise works on tensors: put it after v2.ToImage() and v2.ToDtype(torch.float32, scale=True)"',
            '"expected a tensor"',
        ),
        "which does not tell the user what to do",
    ),
    "empty_type_error": (
        GOOD.replace(
            '"GaussianNoise works on tensors: put it after v2.ToImage() and v2.ToDtype(torch.float32, scale=True)"', ""
        ),
        "which does not tell the user what to do",
    ),
    "noise_drawn_once": (
        GOOD.replace("self.std = std", "self.std = std\n        self.noise = None").replace(
            "return (image + torch.randn_like(image) * self.std).clamp(0, 1)",
            "if self.noise is None:\n            self.noise = torch.randn_like(image) * self.std\n"
            "        return (image + self.noise).clamp(0, 1)",
        ),
        "draw new noise in __call__",
    ),
    "wrong_name": (GOOD.replace("class GaussianNoise", "class Noise"), "should define a class GaussianNoise"),
    "no_seed_worker": (GOOD.split("\n\ndef seed_worker")[0], "should define a function seed_worker"),
    "seed_worker_does_nothing": (
        GOOD.replace(SEED, "    pass"),
        "still draw the same shifts (your module's seed_worker",
    ),
    "seed_worker_fresh_entropy": (
        GOOD.replace(SEED, "    info.dataset.rng = np.random.default_rng()"),
        "not from fresh entropy",
    ),
    "seed_worker_by_id": (
        GOOD.replace(SEED, "    info.dataset.rng = np.random.default_rng(worker_id)"),
        "the worker id alone",
    ),
}


# other TypeErrors that tell the user what to do: a fix, or what is expected and what came
GOOD_MESSAGE = '"GaussianNoise works on tensors: put it after v2.ToImage() and v2.ToDtype(torch.float32, scale=True)"'
RIGHT_MESSAGES = {
    "names_the_type": 'f"GaussianNoise expects a float tensor, got {type(image).__name__}"',
    "names_pil": '"GaussianNoise needs a torch.Tensor, not a PIL image"',
    "names_a_fix": '"convert the image first: v2.ToImage(), then v2.ToDtype"',
}


@pytest.mark.quick
def test_05_the_rule_for_a_helpful_type_error() -> None:
    from PIL import Image

    image = Image.new("RGB", (4, 4))
    for message in (
        "put it after v2.ToImage()",
        "expected a tensor, got Image",
        "needs a tensor, not a PIL image",
        "use transforms.ToTensor() first",
        "got Image; convert with pil_to_tensor",
    ):
        assert nb05._tells_what_to_do(message, image), message
    for message in (
        "wrong type",
        "expected a tensor",
        "TypeError",
        "bad input: Image",
        "image must be an image tensor",
    ):
        assert not nb05._tells_what_to_do(message, image), message


def write_module(folder: Path, name: str, source: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return path


@pytest.fixture
def module_folder(tmp_path: Path):
    yield tmp_path
    for name in ["good_module", "stub_module", "edited_module", *(f"module_{k}" for k in [*WRONG, *RIGHT_MESSAGES])]:
        sys.modules.pop(name, None)
    if str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


@pytest.mark.quick
@pytest.mark.timeout(300)
def test_05_worker_module(module_folder: Path) -> None:
    check = nb05.worker_module
    assert status(check, ...)[0] is Status.NOT_ATTEMPTED
    assert status(check, write_module(module_folder, "stub_module", STUB))[0] is Status.NOT_ATTEMPTED
    assert "run the %%writefile cell first" in status(check, module_folder / "missing.py")[1]
    assert status(check, write_module(module_folder, "good_module", GOOD))[0] is Status.SOLVED
    for name, message in RIGHT_MESSAGES.items():  # the TypeError's message is judged before any worker starts
        source = GOOD.replace(GOOD_MESSAGE, message)
        assert source != GOOD
        nb05._check_noise(nb05._load(write_module(module_folder, f"module_{name}", source)).GaussianNoise)  # no Hint
    for name, (source, hint) in WRONG.items():
        message = status(check, write_module(module_folder, f"module_{name}", source))[1]
        assert hint in message, (name, message)


@pytest.mark.quick
@pytest.mark.timeout(120)
def test_05_worker_module_sees_edits_and_spawned_copies(module_folder: Path) -> None:
    """A module edited after its first import is checked as edited; a generator made in __init__ and drawn the
    same in both spawn workers is caught there, where it matters."""
    path = write_module(module_folder, "edited_module", WRONG["no_clamp"][0])
    assert "values left [0, 1]" in status(nb05.worker_module, path)[1]
    write_module(module_folder, "edited_module", GOOD)
    assert status(nb05.worker_module, path)[0] is Status.SOLVED
    same_in_workers = (
        GOOD.replace("self.std = std", "self.std = std\n        self.calls = 0")
        .replace(
            "torch.randn_like(image)", "(torch.randn_like(image) if self.calls < 4 else torch.zeros_like(image) + 0.1)"
        )
        .replace("        if not isinstance", "        self.calls += 1\n        if not isinstance")
    )
    write_module(module_folder, "edited_module", same_in_workers)
    assert "both spawn workers drew the same noise" in status(nb05.worker_module, path)[1]


# ----------------------------------------------------------------- 05.3: records that forked workers share


class CompactRecords:
    def __init__(self, records):
        self.paths = np.array([path for path, _ in records])
        self.labels = np.array([label for _, label in records], dtype=np.int64)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return str(self.paths[i]), int(self.labels[i])


class ObjectArray(CompactRecords):  # one Python object per path, as in a list
    def __init__(self, records):
        super().__init__(records)
        self.paths = np.array([path for path, _ in records], dtype=object)


class KeptList(CompactRecords):  # the arrays are made, but the list is what __getitem__ reads
    def __init__(self, records):
        super().__init__(records)
        self.records = records

    def __getitem__(self, i):
        return self.records[i]


class AsBytes(CompactRecords):
    def __getitem__(self, i):
        return self.paths[i].encode(), int(self.labels[i])


class NumpyLabel(CompactRecords):  # a NumPy integer is a fine label
    def __getitem__(self, i):
        return str(self.paths[i]), self.labels[i]


class ShiftedByOne(CompactRecords):
    def __getitem__(self, i):
        return str(self.paths[i - 1]), int(self.labels[i - 1])


class Stub:
    def __init__(self, records):
        raise NotImplementedError


@pytest.mark.quick
@pytest.mark.timeout(120)
def test_05_compact_records() -> None:
    right_and_stubs(nb05.compact_records, CompactRecords, Stub)
    assert status(nb05.compact_records, NumpyLabel)[0] is Status.SOLVED
    for wrong in (ObjectArray, KeptList):
        verdict, hint = status(nb05.compact_records, wrong)
        assert verdict is Status.WRONG and "copied" in hint and "dtype=object" in hint, (wrong, hint)
    assert "as bytes" in status(nb05.compact_records, AsBytes)[1]
    assert "not the path" in status(nb05.compact_records, ShiftedByOne)[1]
    assert "class itself" in status(nb05.compact_records, CompactRecords([("a", 1)]))[1]


# ----------------------------------------------------------------- 05.4: the copy-on-read meter


def _private(field: str = "Private_Dirty:") -> float:
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith(field))


class _ReadAll:
    def __init__(self, items, field="Private_Dirty:"):
        self.items, self.field = items, field

    def __len__(self):
        return 1

    def __getitem__(self, index):
        before = _private(self.field)
        for i in range(len(self.items)):
            self.items[i]
        return _private(self.field) - before


def _meter(context: str = "fork", field: str = "Private_Dirty:"):
    def copied_mb(items):
        loader = DataLoader(_ReadAll(items, field), batch_size=None, num_workers=1, multiprocessing_context=context)
        return float(next(iter(loader)))

    return copied_mb


def _meter_stub(items):
    raise NotImplementedError


@pytest.mark.quick
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps_rollup and fork: Linux only")
@pytest.mark.timeout(120)
def test_05_copied_mb() -> None:
    right_and_stubs(nb05.copied_mb, _meter(), _meter_stub)
    for wrong in (_meter("spawn"), _meter(field="Rss:"), lambda items: _ReadAll(items)[0]):  # spawned; Rss; no worker
        verdict, hint = status(nb05.copied_mb, wrong)
        assert verdict is Status.WRONG and "inside the worker" in hint and "fork" in hint, hint
    assert "as a number" in status(nb05.copied_mb, lambda items: str(_meter()(items)))[1]
    assert "function itself" in status(nb05.copied_mb, 3.0)[1]
