"""Notebook 01: the course's offline data set, coloured geometric shapes as real JPEG files.

Nothing is downloaded. ``prepare_data()`` draws a small image-classification set (10 shape
classes, with deterministic variation in size, position, rotation, colour and noise) into an
ImageFolder layout::

    <data dir>/shapes-<size>-seed<seed>/
        manifest.json                 # counts, seed, checksums: written last
        train/<class>/<id>.jpg
        val/<class>/<id>.jpg

The set is written into a temporary folder and renamed into place only when complete, so an
interrupted run never leaves a half-made set that later looks finished. A second call finds the
manifest and reuses the set.

Where the data lives: the ``root`` argument, else the ``COURSE_DATA_DIR`` environment variable,
else ``$XDG_CACHE_HOME/pytorch-data-course`` (``~/.cache/pytorch-data-course``), which is
writable on JupyterHub, Binder and a laptop. On a cluster, point ``COURSE_DATA_DIR`` at a shared
or scratch file system and prepare the data once on a login node.
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

from ._support import new_folder

__all__ = ["CLASSES", "data_dir", "dataset_name", "describe", "draw_shape", "prepare_data", "read_manifest", "verify"]

ENV_VAR = "COURSE_DATA_DIR"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
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
    """Notebook 01, section 0: the folder that holds the course's data sets (argument, then env var, then cache)."""
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


def _regular_polygon(cx: float, cy: float, r: float, n: int, angle: float) -> list[tuple[float, float]]:
    return [
        (cx + r * math.cos(angle + 2 * math.pi * k / n), cy + r * math.sin(angle + 2 * math.pi * k / n))
        for k in range(n)
    ]


def _rotate(points: list[tuple[float, float]], cx: float, cy: float, angle: float) -> list[tuple[float, float]]:
    c, s = math.cos(angle), math.sin(angle)
    return [(cx + c * x - s * y, cy + s * x + c * y) for x, y in points]


def _star(cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    pts = []
    for k in range(10):
        rr = r if k % 2 == 0 else r * 0.45
        a = angle + math.pi * k / 5
        pts.append((cx + rr * math.cos(a), cy + rr * math.sin(a)))
    return pts


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
    """Notebook 01, section 0: one RGB image of class ``CLASSES[label]``, its variation drawn from ``rng``.

    Drawn at twice the size and downsampled, which smooths the edges.
    """
    if not 0 <= label < len(CLASSES):
        raise ValueError(f"label must be in 0..{len(CLASSES) - 1}, got {label}")
    big = image_size * 2
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
        draw.polygon(_regular_polygon(cx, cy, r, sides, angle), fill=fg)
    elif name == "star":
        draw.polygon(_star(cx, cy, r, angle), fill=fg)
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

    files: dict[str, str] = {}
    counts: dict[str, dict[str, int]] = {}
    total_bytes = 0
    per_split = {"train": spec.train_per_class, "val": spec.val_per_class}
    with tqdm(total=spec.total, desc=f"Generating {dataset_name(size, seed)}", unit="img", disable=not progress) as bar:
        for split in SPLITS:
            counts[split] = {}
            for label, cls in enumerate(CLASSES):
                folder = target / split / cls
                folder.mkdir(parents=True, exist_ok=True)
                for i in range(per_split[split]):
                    img = draw_shape(label, _image_rng(seed, split, label, i), spec.image_size)
                    path = folder / f"{i:05d}.jpg"
                    img.save(path, format="JPEG", quality=90)
                    rel = f"{split}/{cls}/{path.name}"
                    files[rel] = _sha256(path)
                    total_bytes += path.stat().st_size
                    bar.update(1)
                counts[split][cls] = per_split[split]
    digest = hashlib.sha256("".join(f"{k}:{v}\n" for k, v in sorted(files.items())).encode()).hexdigest()
    return {
        "name": "shapes",
        "format_version": FORMAT_VERSION,
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
    path = Path(folder) / MANIFEST
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(
            f"{Path(folder).name}/ has no {MANIFEST}, so it is not a complete generated set. "
            "If you made it yourself, use it directly with ImageFileDataset(path); if it is a "
            "leftover, delete it and run course_lib.data.prepare_data() again."
        ) from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{path.name} in {Path(folder).name}/ is damaged ({exc}); run prepare_data(force=True).") from None


def verify(folder: str | os.PathLike[str], checksums: bool = False) -> dict:
    """Notebook 01, section 0: check that every file the manifest lists exists (and, with ``checksums``, is intact).

    Returns the manifest; raises ``DataError`` naming the first problems found.
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    missing, damaged = [], []
    for rel, digest in manifest["files"].items():
        path = folder / rel
        if not path.is_file():
            missing.append(rel)
        elif checksums and _sha256(path) != digest:
            damaged.append(rel)
    if missing or damaged:
        what = []
        if missing:
            what.append(f"{len(missing)} missing (e.g. {missing[0]})")
        if damaged:
            what.append(f"{len(damaged)} damaged (e.g. {damaged[0]})")
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
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    base = data_dir(root)
    name = dataset_name(size, seed)
    final = base / name
    if final.exists() and not force:
        if read_manifest(final).get("format_version") == FORMAT_VERSION:
            verify(final, checksums=checksums)
            return final
        force = True  # written by another version of the generator: it is derived data, redo it
    try:
        base.mkdir(parents=True, exist_ok=True)
        with new_folder(final, MANIFEST, DataError) as tmp:
            manifest = _generate_into(tmp, SIZES[size], size, seed, progress)
            # The manifest is written last: a folder with a manifest is a finished one.
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
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
