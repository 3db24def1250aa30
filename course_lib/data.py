"""Notebook 01: the course's offline data set, coloured geometric shapes as real JPEG files.

``prepare_data()`` draws a small image-classification set (10 shape classes, deterministic variation in size,
position, rotation, colour and noise) into ``<data dir>/shapes-<size>-seed<seed>/{train,val}/<class>/`` (see
:func:`data_dir`) with a ``manifest.json`` (counts, seed, checksums) written last: a set with a manifest is a
finished one, and a second call reuses it.
"""

from __future__ import annotations

import colorsys
import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from .support import check_int, new_folder, scratch_folder

__all__ = [
    "CLASSES",
    "data_dir",
    "dataset_name",
    "describe",
    "draw_shape",
    "prepare_data",
    "read_manifest",
    "scratch_folder",
    "verify",
]

ENV_VAR = "COURSE_DATA_DIR"
_FORMAT_VERSION = 1
_MANIFEST = "manifest.json"
SPLITS = ("train", "val")
# Sorted, so that label i here is label i for torchvision's ImageFolder (which sorts folders).
CLASSES = ("arrow", "circle", "crescent", "cross", "hexagon", "pentagon", "ring", "square", "star", "triangle")


class DataError(RuntimeError):
    """The data folder is missing, incomplete or damaged; the message says what to do."""


@dataclass(frozen=True)
class _SizeSpec:
    """How many images per class and split, and their side length in pixels."""

    train_per_class: int
    val_per_class: int
    image_size: int

    @property
    def total(self) -> int:
        return len(CLASSES) * (self.train_per_class + self.val_per_class)


SIZES: dict[str, _SizeSpec] = {
    "tiny": _SizeSpec(train_per_class=8, val_per_class=2, image_size=32),  # unit tests
    "small": _SizeSpec(train_per_class=80, val_per_class=20, image_size=64),  # the default
    "medium": _SizeSpec(train_per_class=400, val_per_class=80, image_size=128),  # decode-bound
    "workshop": _SizeSpec(train_per_class=1000, val_per_class=200, image_size=128),
}
DEFAULT_SIZE = "small"


def data_dir(root: str | os.PathLike[str] | None = None) -> Path:
    """Notebook 01, section 0: the folder that holds the course's data sets (argument, then env var, then cache).

    On a cluster, point ``COURSE_DATA_DIR`` at a shared or scratch file system and prepare the data once on a login node.
    """
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or "~/.cache"
    return Path(cache).expanduser() / "pytorch-data-course"


def dataset_name(size: str = DEFAULT_SIZE, seed: int = 0) -> str:
    """Notebook 01, section 0: folder name of one generated set, e.g. ``shapes-small-seed0``."""
    return f"shapes-{size}-seed{seed}"


# --------------------------------------------------------------------------- drawing
def _polygon(cx: float, cy: float, radii: list[float], angle: float) -> list[tuple[float, float]]:
    """Corners at ``radii[k]`` from the centre, evenly spaced around it starting at ``angle``."""
    n = len(radii)
    return [
        (cx + rk * math.cos(angle + 2 * math.pi * k / n), cy + rk * math.sin(angle + 2 * math.pi * k / n))
        for k, rk in enumerate(radii)
    ]


def _rotate(points: list[tuple[float, float]], cx: float, cy: float, angle: float) -> list[tuple[float, float]]:
    c, s = math.cos(angle), math.sin(angle)
    return [(cx + c * x - s * y, cy + s * x + c * y) for x, y in points]


def _cross(r: float) -> list[tuple[float, float]]:
    w = r * 0.35
    return [(-w, -r), (w, -r), (w, -w), (r, -w), (r, w), (w, w), (w, r), (-w, r), (-w, w), (-r, w), (-r, -w), (-w, -w)]


def _arrow(r: float) -> list[tuple[float, float]]:
    w = r * 0.25
    return [(-r, -w), (0.1 * r, -w), (0.1 * r, -0.7 * r), (r, 0), (0.1 * r, 0.7 * r), (0.1 * r, w), (-r, w)]


def _hsv_to_rgb(h: float, s: float, v: float) -> tuple[int, int, int]:
    r, g, b = colorsys.hsv_to_rgb(h, s, v)
    return int(r * 255), int(g * 255), int(b * 255)


def draw_shape(label: int, rng: np.random.Generator, image_size: int = 64) -> Image.Image:
    """Notebook 01, section 0: one RGB image of class ``CLASSES[label]``, its variation drawn from ``rng``."""
    if not 0 <= label < len(CLASSES):
        raise ValueError(f"label must be in 0..{len(CLASSES) - 1}, got {label}")
    big = image_size * 2  # drawn at twice the size, then downsampled: smoother edges
    bg_v = float(rng.uniform(0.05, 0.35)) if rng.random() < 0.5 else float(rng.uniform(0.7, 0.95))
    bg = _hsv_to_rgb(float(rng.random()), float(rng.uniform(0.0, 0.25)), bg_v)
    fg = _hsv_to_rgb(float(rng.random()), float(rng.uniform(0.6, 1.0)), 0.95 if bg_v < 0.5 else 0.55)
    img = Image.new("RGB", (big, big), bg)
    draw = ImageDraw.Draw(img)
    r = big * float(rng.uniform(0.18, 0.38))
    margin = r * 1.05
    cx = float(rng.uniform(margin, big - margin))
    cy = float(rng.uniform(margin, big - margin))
    angle = float(rng.uniform(0, 2 * math.pi))
    name = CLASSES[label]
    box = (cx - r, cy - r, cx + r, cy + r)
    if name == "circle":
        draw.ellipse(box, fill=fg)
    elif name == "ring":
        draw.ellipse(box, outline=fg, width=max(2, int(r * 0.3)))
    elif name == "crescent":
        draw.ellipse(box, fill=fg)
        dx, dy = 0.45 * r * math.cos(angle), 0.45 * r * math.sin(angle)
        draw.ellipse((cx - r + dx, cy - r + dy, cx + r + dx, cy + r + dy), fill=bg)
    elif name in ("triangle", "square", "pentagon", "hexagon"):
        sides = {"triangle": 3, "square": 4, "pentagon": 5, "hexagon": 6}[name]
        draw.polygon(_polygon(cx, cy, [r] * sides, angle), fill=fg)
    elif name == "star":
        draw.polygon(_polygon(cx, cy, [r, r * 0.45] * 5, angle), fill=fg)
    elif name == "cross":
        draw.polygon(_rotate(_cross(r), cx, cy, angle), fill=fg)
    else:  # arrow
        draw.polygon(_rotate(_arrow(r), cx, cy, angle), fill=fg)
    img = img.resize((image_size, image_size), Image.Resampling.BILINEAR)
    noise_sigma = float(rng.uniform(0.0, 12.0))
    arr = np.asarray(img, dtype=np.float32)
    arr = arr + rng.normal(0.0, noise_sigma, size=arr.shape).astype(np.float32)
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def _image_rng(seed: int, split: str, label: int, index: int) -> np.random.Generator:
    # One independent stream per image: the same image whatever order or subset is generated.
    return np.random.default_rng([seed, SPLITS.index(split), label, index])


# --------------------------------------------------------------------------- writing
def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _generate_into(target: Path, spec: _SizeSpec, size: str, seed: int, progress: bool) -> dict:
    from tqdm.auto import tqdm

    files: dict[str, str] = {}  # path in the set -> its sha256
    total_bytes = 0
    per_split = {"train": spec.train_per_class, "val": spec.val_per_class}
    with tqdm(total=spec.total, desc=f"Generating {dataset_name(size, seed)}", unit="img", disable=not progress) as bar:
        for split in SPLITS:
            for label, cls in enumerate(CLASSES):
                (target / split / cls).mkdir(parents=True, exist_ok=True)
                for i in range(per_split[split]):
                    img = draw_shape(label, _image_rng(seed, split, label, i), spec.image_size)
                    path = target / split / cls / f"{i:05d}.jpg"
                    img.save(path, format="JPEG", quality=90)
                    files[f"{split}/{cls}/{path.name}"] = _sha256(path)
                    total_bytes += path.stat().st_size
                    bar.update(1)
    digest = hashlib.sha256("".join(f"{k}:{v}\n" for k, v in sorted(files.items())).encode()).hexdigest()
    counts = {split: dict.fromkeys(CLASSES, n) for split, n in per_split.items()}
    return {
        "name": "shapes",
        "format_version": _FORMAT_VERSION,
        "size": size,
        "seed": seed,
        **asdict(spec),
        "classes": list(CLASSES),
        "counts": counts,
        "total_images": len(files),
        "total_bytes": total_bytes,
        "digest": digest,
        "files": files,
    }


def read_manifest(folder: str | os.PathLike[str]) -> dict:
    """Notebook 01, section 0: load ``manifest.json`` of a generated set; a clear ``DataError`` if it is not there."""
    path = Path(folder) / _MANIFEST
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(
            f"{Path(folder).name}/ has no {_MANIFEST}, so it is not a complete generated set. If you made it "
            "yourself, use it directly with ImageFileDataset(path); if it is a leftover, delete it and run "
            "course_lib.data.prepare_data() again."
        ) from None
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{path.name} in {Path(folder).name}/ is damaged ({exc}); run prepare_data(force=True)."
        ) from None


def verify(folder: str | os.PathLike[str], checksums: bool = False) -> dict:
    """Notebook 01, section 0: check that every file the manifest lists exists (and, with ``checksums``, is intact).
    Returns the manifest; raises ``DataError`` naming the first problems found."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    missing, damaged = [], []
    for rel, digest in manifest["files"].items():
        if not (folder / rel).is_file():
            missing.append(rel)
        elif checksums and _sha256(folder / rel) != digest:
            damaged.append(rel)
    what = [
        f"{len(found)} {kind} (e.g. {found[0]})"
        for kind, found in (("missing", missing), ("damaged", damaged))
        if found
    ]
    if what:
        raise DataError(
            f"{folder.name}/ is incomplete: {', '.join(what)} of {len(manifest['files'])} files. "
            f"Re-create it with prepare_data(size={manifest['size']!r}, seed={manifest['seed']}, force=True) "
            f"or `python -m course_lib prepare --size {manifest['size']} --force`."
        )
    return manifest


def prepare_data(
    size: str = DEFAULT_SIZE,
    seed: int = 0,
    root: str | os.PathLike[str] | None = None,
    *,
    progress: bool = True,
    force: bool = False,
    checksums: bool = False,
) -> Path:
    """Notebook 01, section 0: generate the shapes set (or reuse it if it is already there) and return its folder.

    ``size`` is one of ``SIZES`` (``"small"`` takes a second or two, ``"workshop"`` is for
    instructors who want a heavier set). ``force=True`` regenerates it; ``checksums=True``
    re-hashes every file of an existing set before reusing it.
    """
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    seed = check_int(seed, "seed")
    base, name = data_dir(root), dataset_name(size, seed)
    final = base / name
    # a set written by another version of the generator is derived data: it is made again
    if final.exists() and not force and read_manifest(final).get("format_version") == _FORMAT_VERSION:
        verify(final, checksums=checksums)
        return final
    if base.exists() and not base.is_dir():
        raise DataError(
            f"cannot create the data folder: {base.name} is a file. Set {ENV_VAR} to a folder, or pass root=..."
        )
    try:
        with new_folder(final, _MANIFEST, DataError) as tmp:
            manifest = _generate_into(tmp, SIZES[size], size, seed, progress)
            (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))  # last: the set is finished
    except OSError as exc:  # read-only shared folder, full disk, quota...
        raise DataError(
            f"cannot write the {name} set into {base}: {exc.strerror or exc}. Set {ENV_VAR} to a writable "
            f"folder with free space; if an instructor prepared a shared folder, ask for "
            f"`python -m course_lib prepare --size {size}` there."
        ) from exc
    verify(final)
    return final


def describe(folder: str | os.PathLike[str]) -> str:
    """Notebook 01, section 0: a one-line, machine-independent summary of a generated set (no absolute paths)."""
    m = read_manifest(folder)
    n_train = sum(m["counts"]["train"].values())
    n_val = sum(m["counts"]["val"].values())
    return (
        f"{Path(folder).name}: {n_train} train + {n_val} val images of "
        f"{m['image_size']}x{m['image_size']} px, {len(m['classes'])} classes, seed {m['seed']}"
    )
