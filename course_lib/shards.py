"""Tar shards in the WebDataset format: write them, look inside them, and read them (notebook 08).

A *shard* is an ordinary POSIX tar file. Each sample is a group of consecutive members that share
a *key*: ``circle-00012.jpg``, ``circle-00012.cls``, ``circle-00012.json`` form the sample with
key ``circle-00012``. A data set is many such shards, named with a running number so that a
brace pattern (``shapes-train-{000000..000007}.tar``) lists them all.

This module writes the course's shapes images (and a raw tensor set for high-rate measurements)
as shards, the way the image set of :mod:`course_lib.data` is written: into a temporary folder
renamed into place when complete, with a ``manifest.json`` written last, and reused by a second
call with the same parameters. Writing is deterministic: the same input gives byte-identical
tar files (fixed member times and owners).

Reading is webdataset's job, and notebook 08 shows its pipeline itself. What lives here is what
a notebook should not re-type: turning paths into a brace pattern, listing a shard's members
(read-only: nothing is ever extracted to disk, nothing is unpickled), making a damaged copy for
the corrupted-shard lesson, checking that a job has enough shards, and measuring many small files
against the same samples in shards.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import itertools
import json
import os
import re
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from . import data as _data
from ._support import new_folder

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
#: Member times in every shard written here. webdataset's TarWriter stamps ``time.time()`` by
#: default, which makes two writes of the same samples differ; a fixed time makes them identical.
TAR_MTIME = 946684800  # 2000-01-01T00:00:00Z
_NUMBERED = re.compile(r"^(?P<stem>.*?)(?P<num>\d+)(?P<ext>\.tar(?:\.gz)?)$")


class ShardError(RuntimeError):
    """Shards are missing, damaged, or too few for a job; the message says what to do."""


@dataclass(frozen=True)
class ShardSet:
    """A folder of shards written by this module, as its manifest describes it.

    ``urls`` is the brace pattern webdataset expands (an absolute path: pass it to
    ``wds.WebDataset`` but do not print it; :meth:`describe` is the printable summary).
    """

    folder: Path
    urls: str
    paths: list[Path]
    samples: int
    bytes: int
    counts: list[int] = field(default_factory=list)
    keys: list[list[str]] = field(default_factory=list, repr=False)

    @property
    def names(self) -> list[str]:
        """The shards' file names (no folder): safe to print."""
        return [p.name for p in self.paths]

    @property
    def pattern(self) -> str:
        """The brace pattern without the folder, e.g. ``shapes-train-{000000..000007}.tar``."""
        return brace_urls(self.names)

    def all_keys(self) -> list[str]:
        """Every sample key, shard by shard, in the order they were written."""
        return [k for shard in self.keys for k in shard]

    def describe(self) -> str:
        """A one-line, machine-independent summary."""
        return (
            f"{len(self.paths)} shards {self.pattern}: {self.samples} samples, "
            f"{self.bytes / 1e6:.1f} MB ({', '.join(map(str, sorted(set(self.counts))))} samples per shard)"
        )


# --------------------------------------------------------------------------- patterns and listings


def brace_urls(paths: Sequence[str | os.PathLike[str]]) -> str:
    """One string naming all ``paths``, in webdataset's brace notation where it can.

    Numbers are sorted and deduplicated: consecutive ones become a range
    (``a-{000000..000007}.tar``), others a list (``a-{000001,000004}.tar``); shards that do not
    share a folder and a name stem are joined with ``::``, which webdataset also splits on.
    """
    if not paths:
        raise ValueError("no paths given: brace_urls needs at least one shard")
    groups: dict[tuple[str, str, str, int], list[int]] = {}
    singles: list[str] = []
    for p in map(str, paths):
        folder, name = os.path.split(p)
        m = _NUMBERED.match(name)
        if not m:
            singles.append(p)
            continue
        key = (folder, m["stem"], m["ext"], len(m["num"]))
        groups.setdefault(key, []).append(int(m["num"]))
    parts = []
    for (folder, stem, ext, width), nums in groups.items():
        nums = sorted(set(nums))
        prefix = os.path.join(folder, stem) if folder else stem
        if len(nums) == 1:
            parts.append(f"{prefix}{nums[0]:0{width}d}{ext}")
        elif nums == list(range(nums[0], nums[-1] + 1)):
            parts.append(f"{prefix}{{{nums[0]:0{width}d}..{nums[-1]:0{width}d}}}{ext}")
        else:
            parts.append(prefix + "{" + ",".join(f"{n:0{width}d}" for n in nums) + "}" + ext)
    return "::".join(parts + singles)


def expand_urls(urls: str) -> list[str]:
    """The shard names a brace pattern stands for (webdataset's own expansion)."""
    from webdataset.shardlists import expand_urls as _expand

    return list(_expand(urls))


def find_shards(location: str | os.PathLike[str]) -> list[Path]:
    """The existing shard files a folder, a brace pattern or a glob names, sorted.

    Raises :class:`ShardError`, saying how to write shards, when the folder is missing, holds no
    ``.tar`` file, or when the pattern names files that do not exist.
    """
    how = (
        "Write shards first, e.g. course_lib.shards.write_image_shards(folder) for the shapes images, "
        "or check the path."
    )
    text = str(location)
    path = Path(text).expanduser()
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.name.endswith((".tar", ".tar.gz")) and p.is_file())
        if not found:
            raise ShardError(f"the folder {path.name}/ holds no .tar shards. {how}")
        return found
    if "{" in text or "::" in text:
        names = [Path(u).expanduser() for u in expand_urls(text)]
        missing = [p for p in names if not p.is_file()]
        if missing:
            folder = missing[0].parent
            where = "" if folder.is_dir() else f" (its folder {folder.name}/ does not exist)"
            raise ShardError(
                f"{len(missing)} of the {len(names)} shards the pattern names do not exist, "
                f"e.g. {missing[0].name}{where}. {how}"
            )
        return names
    if any(c in text for c in "*?["):
        found = sorted(p for p in path.parent.glob(path.name) if p.is_file())
        if not found:
            raise ShardError(f"no file matches {path.name} in {path.parent.name}/. {how}")
        return found
    if path.is_file():
        return [path]
    raise ShardError(f"no shard folder or file {path.name!r} (in {path.parent.name or '.'}/). {how}")


def list_members(shard: str | os.PathLike[str]) -> list[tuple[str, int]]:
    """``(member name, size in bytes)`` for every member of a shard, in tar order.

    Read-only: the tar's headers are read with :mod:`tarfile`, nothing is extracted to disk.
    A damaged shard raises :class:`ShardError` naming it.
    """
    shard = Path(shard)
    members: list[tuple[str, int]] = []
    try:
        with tarfile.open(shard, mode="r|*") as tar:  # a stream: one pass, as webdataset reads it
            for info in tar:
                members.append((info.name, info.size))
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ShardError(
            f"{shard.name} is damaged after {len(members)} members ({exc}); write it again "
            "(write_image_shards(..., force=True)) or skip it with handler=wds.warn_and_continue"
        ) from None
    return members


def verify_shards(shards: "ShardSet | Iterable[str | os.PathLike[str]]") -> dict[str, int]:
    """Read every member of every shard to its end; ``{shard name: samples}`` if all are intact.

    A truncated or garbled shard raises :class:`ShardError` naming it: cheaper to learn before a
    job than in its third hour. Given a :class:`ShardSet`, the counts are also compared with its
    manifest, which catches a shard cut at a member boundary (tarfile reads that as a shorter,
    valid archive).
    """
    expected = dict(zip(shards.names, shards.counts)) if isinstance(shards, ShardSet) else {}
    paths = shards.paths if isinstance(shards, ShardSet) else list(shards)
    counts = {}
    for p in paths:
        p = Path(p)
        keys: set[str] = set()
        try:
            with tarfile.open(p, mode="r|*") as tar:
                for info in tar:
                    f = tar.extractfile(info)  # a file object over the tar stream, in memory
                    if f is not None:
                        f.read()
                    keys.add(info.name.split(".", 1)[0])
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise ShardError(f"{p.name} is damaged ({exc}) after {len(keys)} samples; write it again") from None
        if p.name in expected and len(keys) != expected[p.name]:
            raise ShardError(
                f"{p.name} holds {len(keys)} samples but its manifest says {expected[p.name]}: it was cut short "
                "(at a member boundary, so no reader notices); write it again"
            )
        counts[p.name] = len(keys)
    return counts


def shard_error_summary(exc: BaseException) -> str:
    """One line for an error webdataset raised while reading a shard, naming the shard.

    webdataset appends the open file and the shard's URL to the exception's arguments; this keeps
    the first message and the shard's file name (not its absolute path).
    """
    args = list(getattr(exc, "args", ()))
    message = str(args[0]) if args else str(exc)
    message = re.sub(r"\s*@\s*<[^>]*>", "", message)  # "... @ <_io.BufferedReader name='/abs/...'>"
    shard = next((os.path.basename(a) for a in reversed(args[1:]) if isinstance(a, str) and ".tar" in a), None)
    if shard is None:
        m = re.search(r"name='([^']+)'", str(args[0]) if args else "")
        shard = os.path.basename(m.group(1)) if m else None
    return f"{type(exc).__name__}: {message}" + (f" (shard {shard})" if shard else "")


def corrupt_copy(shard: str | os.PathLike[str], out: str | os.PathLike[str], keep: float = 0.5,
                 cut: str = "data") -> Path:
    """Write a truncated copy of ``shard`` to ``out``: what an interrupted copy or a full disk leaves.

    The copy ends at the sample at ``keep`` (a fraction of the samples); the samples before it are
    intact. ``cut="data"`` ends it just after the tar header of that sample's first member, so a
    reader fails with "unexpected end of data". ``cut="header"`` ends it in the middle of that
    header, which Python's tarfile (and so webdataset) takes for the end of the archive: the rest
    of the shard vanishes *without an error*.
    """
    if not 0.0 < keep < 1.0:
        raise ValueError(f"keep must be between 0 and 1 (a fraction of the samples), got {keep}")
    if cut not in ("data", "header"):
        raise ValueError(f"cut must be 'data' or 'header', got {cut!r}")
    shard, out = Path(shard), Path(out)
    with tarfile.open(shard, mode="r:") as tar:
        firsts: dict[str, tarfile.TarInfo] = {}
        for m in tar.getmembers():
            firsts.setdefault(m.name.split(".", 1)[0], m)  # a sample's first member
    if len(firsts) < 2:
        raise ValueError(f"{shard.name} holds {len(firsts)} sample(s); corrupt_copy needs at least 2")
    victim = list(firsts.values())[max(1, int(len(firsts) * keep))]
    end = victim.offset_data + victim.size // 2 if cut == "data" else victim.offset + tarfile.BLOCKSIZE // 2
    with open(shard, "rb") as src:
        head = src.read(end)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(head)
    return out


def load_npy(payload: bytes) -> np.ndarray:
    """Decode a ``.npy`` member; ``allow_pickle=False``, so a data file can never run code."""
    return np.load(io.BytesIO(payload), allow_pickle=False)


# --------------------------------------------------------------------------- writing


def shard_folder(split: str, size: str = _data.DEFAULT_SIZE, seed: int = 0,
                 root: str | os.PathLike[str] | None = None) -> Path:
    """Notebook 08, section 2: where the shards of one split live, beside the images they come from:
    ``<data dir>/webdataset/shapes-<size>-seed<seed>/<split>`` (``python -m course_lib prepare --all``
    writes them there once; the notebook then reuses them)."""
    return _data.data_dir(root) / "webdataset" / _data.dataset_name(size, seed) / split


def _shardset_from_manifest(folder: Path, manifest: dict) -> ShardSet:
    paths = [folder / s["name"] for s in manifest["shards"]]
    return ShardSet(
        folder=folder,
        urls=brace_urls(paths),
        paths=paths,
        samples=int(manifest["samples"]),
        bytes=int(manifest["bytes"]),
        counts=[int(s["samples"]) for s in manifest["shards"]],
        keys=[list(s["keys"]) for s in manifest["shards"]],
    )


def read_shardset(folder: str | os.PathLike[str]) -> ShardSet:
    """The :class:`ShardSet` a folder's manifest describes; a clear error if it is not one."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ShardError(f"no shard folder {folder.name}/; write it with write_image_shards(...) first")
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        raise ShardError(
            f"{folder.name}/ has no {MANIFEST}, so it was not written (completely) by write_image_shards; "
            "use its shards with find_shards(folder), or write them again"
        ) from None
    except json.JSONDecodeError as exc:
        raise ShardError(f"{MANIFEST} in {folder.name}/ is damaged ({exc}); write the shards again with force=True") from None
    missing = [s["name"] for s in manifest["shards"] if not (folder / s["name"]).is_file()]
    if missing:
        raise ShardError(f"{folder.name}/ lacks {len(missing)} of its shards (e.g. {missing[0]}); write them again with force=True")
    return _shardset_from_manifest(folder, manifest)


def _reusable(folder: Path, params: dict) -> ShardSet | None:
    """The existing set in ``folder`` if it was written with the same parameters and is whole."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if manifest.get("format_version") != FORMAT_VERSION or manifest.get("params") != params:
        return None
    for s in manifest["shards"]:
        p = folder / s["name"]
        if not p.is_file() or p.stat().st_size != s["bytes"]:
            return None
    return _shardset_from_manifest(folder, manifest)


def _write_atomically(
    out_dir: str | os.PathLike[str],
    params: dict,
    samples: Iterator[dict],
    name_prefix: str,
    maxcount: int,
    maxsize: float | None,
    force: bool,
) -> ShardSet:
    """Write ``samples`` with webdataset's ShardWriter into a temporary folder, then rename it."""
    import webdataset as wds

    final = Path(out_dir).expanduser()
    if maxcount < 1:
        raise ValueError(f"maxcount must be at least 1, got {maxcount}")
    if maxsize is not None and maxsize < 1:
        raise ValueError(f"maxsize must be a positive number of bytes, got {maxsize}")
    if not force:
        reused = _reusable(final, params)
        if reused is not None:
            return reused
    with new_folder(final, MANIFEST, ShardError) as tmp:
        pattern = str(tmp / f"{name_prefix}-%06d.tar")
        # verbose=0: ShardWriter prints every file name it opens (an absolute path) otherwise
        with wds.ShardWriter(
            pattern, maxcount=maxcount, maxsize=float("inf") if maxsize is None else maxsize,
            verbose=0, mtime=TAR_MTIME,
        ) as writer:
            written = 0
            for sample in samples:
                writer.write(sample)
                written += 1
        if written == 0:
            raise ValueError("no samples to write")
        shards = []
        for p in sorted(tmp.glob(f"{name_prefix}-*.tar")):
            keys = list(dict.fromkeys(n.split(".", 1)[0] for n, _ in list_members(p)))  # in order, once each
            blob = p.read_bytes()
            shards.append({"name": p.name, "samples": len(keys), "bytes": len(blob),
                           "sha256": hashlib.sha256(blob).hexdigest(), "keys": keys})
        manifest = {"format_version": FORMAT_VERSION, "params": params,
                    "pattern": brace_urls([s["name"] for s in shards]),
                    "samples": sum(s["samples"] for s in shards), "bytes": sum(s["bytes"] for s in shards),
                    "shards": shards}
        # The manifest is written last: a folder with a manifest is a finished one.
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return read_shardset(final)


def _image_samples(folder: Path, split: str, order: np.ndarray, paths: np.ndarray, targets: np.ndarray,
                   classes: list[str]) -> Iterator[dict]:
    for i in order:
        rel = str(paths[i])  # "<class>/<file>.jpg", relative to the split folder
        cls_name, file_name = rel.split("/")
        stem = file_name.rsplit(".", 1)[0]
        label = int(targets[i])
        meta = {"source": f"{split}/{rel}", "class": cls_name, "index": int(i)}
        yield {
            "__key__": f"{cls_name}-{stem}",  # no dots: webdataset splits key and extension at the first dot
            "jpg": (folder / split / rel).read_bytes(),  # the original JPEG bytes, not re-encoded
            "cls": str(label).encode("ascii"),
            "json": json.dumps(meta, sort_keys=True).encode("utf-8"),
        }


def write_image_shards(
    out_dir: str | os.PathLike[str],
    split: str = "train",
    size: str = _data.DEFAULT_SIZE,
    seed: int = 0,
    root: str | os.PathLike[str] | None = None,
    maxcount: int = 100,
    maxsize: float | None = None,
    prefix: str = "shapes",
    shuffle: bool = True,
    force: bool = False,
) -> ShardSet:
    """Write the generated shapes images of one split as tar shards in ``out_dir``; return them.

    Each sample is ``KEY.jpg`` (the original file's bytes), ``KEY.cls`` (the label as text) and
    ``KEY.json`` (source file, class name, index in ``ImageFileDataset`` order). A shard is closed
    after ``maxcount`` samples or once its payload reaches ``maxsize`` bytes, whichever comes
    first. ``shuffle`` writes the samples in a random order drawn from ``seed``: the image folders
    are sorted by class, and a reader's shuffle buffer cannot undo a class-sorted stream. A second
    call with the same arguments reuses the shards (``force=True`` rewrites them).
    """
    from .datasets import ImageFileDataset

    if split not in _data.SPLITS:
        raise ValueError(f"split must be one of {', '.join(_data.SPLITS)}, got {split!r}")
    if not re.fullmatch(r"[A-Za-z0-9_-]+", prefix):
        raise ValueError(f"prefix {prefix!r} may hold only letters, digits, '-' and '_' (no dots: they end the key)")
    folder = _data.prepare_data(size, seed, root, progress=False)
    digest = _data.read_manifest(folder)["digest"]
    dataset = ImageFileDataset(folder, split)
    order = np.random.default_rng(seed).permutation(len(dataset)) if shuffle else np.arange(len(dataset))
    params = {"kind": "images", "split": split, "size": size, "seed": seed, "source_digest": digest,
              "maxcount": maxcount, "maxsize": maxsize, "prefix": prefix, "shuffle": shuffle}
    samples = _image_samples(folder, split, order, dataset.paths, dataset.targets, dataset.classes)
    return _write_atomically(out_dir, params, samples, f"{prefix}-{split}", maxcount, maxsize, force)


def _tensor_samples(n: int, values: int, seed: int) -> Iterator[dict]:
    import numpy.lib.format as npformat

    for i in range(n):
        # one stream per sample: the same bytes whatever maxcount splits them into
        array = np.random.default_rng([seed, i]).random(values, dtype=np.float32)
        buf = io.BytesIO()
        npformat.write_array(buf, array, allow_pickle=False)
        yield {"__key__": f"{i:08d}", "npy": buf.getvalue(), "cls": str(i % 10).encode("ascii")}


def write_tensor_shards(
    out_dir: str | os.PathLike[str],
    n: int,
    sample_bytes: int = 1 << 20,
    maxcount: int = 64,
    seed: int = 0,
    prefix: str = "tensors",
    force: bool = False,
) -> ShardSet:
    """Write ``n`` raw float32 samples as shards: ``KEY.npy`` (``sample_bytes / 4`` values in
    [0, 1)) and ``KEY.cls`` (``index % 10``). Nothing to decode but the array itself, so reading
    them measures the loader, not JPEG decoding. Deterministic and reused like
    :func:`write_image_shards`; read ``.npy`` members with :func:`load_npy` (no pickles).
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if sample_bytes < 4 or sample_bytes % 4:
        raise ValueError(f"sample_bytes must be a positive multiple of 4 (float32 values), got {sample_bytes}")
    if not re.fullmatch(r"[A-Za-z0-9_-]+", prefix):
        raise ValueError(f"prefix {prefix!r} may hold only letters, digits, '-' and '_'")
    params = {"kind": "tensors", "n": n, "sample_bytes": sample_bytes, "seed": seed,
              "maxcount": maxcount, "maxsize": None, "prefix": prefix}
    return _write_atomically(out_dir, params, _tensor_samples(n, sample_bytes // 4, seed), prefix, maxcount, None, force)


# --------------------------------------------------------------------------- ranks, workers and shards


def shards_needed(world_size: int, num_workers: int) -> int:
    """The fewest shards that give every reader one: ranks × workers (``num_workers=0``: the
    rank's main process reads, one reader per rank)."""
    if world_size < 1 or num_workers < 0:
        raise ValueError(f"need world_size >= 1 and num_workers >= 0, got {world_size} and {num_workers}")
    return world_size * max(1, num_workers)


def check_enough_shards(n_shards: int, world_size: int, num_workers: int) -> None:
    """Raise :class:`ShardError` when some rank's worker would get no shard at all."""
    need = shards_needed(world_size, num_workers)
    if n_shards < need:
        readers = f"{world_size} rank{'s' if world_size > 1 else ''} × {max(1, num_workers)} worker{'s' if num_workers > 1 else ''}"
        raise ShardError(
            f"{n_shards} shard{'s' if n_shards != 1 else ''} for {readers} = {need} readers: {need - n_shards} of them "
            f"would read nothing. At least {need} shards are needed (a multiple of {need} keeps the readers even): "
            "write smaller shards (a lower maxcount), use fewer workers, or use resampled=True with with_epoch."
        )


@contextlib.contextmanager
def simulated_reader(rank: int = 0, world_size: int = 1, worker: int | None = None,
                     num_workers: int | None = None) -> Iterator[None]:
    """Make webdataset's splitters in *this* process believe it is ``rank`` of ``world_size``.

    webdataset asks for the rank in the ``RANK``/``WORLD_SIZE`` environment variables first (torchrun
    sets them) and for the worker in ``WORKER``/``NUM_WORKERS`` (nobody sets those: they exist for
    this kind of test). DataLoader workers started inside the block inherit the setting.
    """
    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "WORKER", "NUM_WORKERS")}
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size))
    if worker is not None:
        os.environ.update(WORKER=str(worker), NUM_WORKERS=str(num_workers if num_workers is not None else 1))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def reader_shares(shards: Sequence[str | os.PathLike[str]] | str, world_size: int, num_workers: int) -> list[list[list[str]]]:
    """Which shards each rank's each worker reads: ``shares[rank][worker]`` is a list of names.

    Runs webdataset's own ``split_by_node`` then ``split_by_worker`` for every (rank, worker), in
    this process (see :func:`simulated_reader`). ``num_workers=0`` counts as one reader per rank.
    """
    import webdataset as wds

    urls = expand_urls(shards) if isinstance(shards, str) else [str(s) for s in shards]
    out = []
    for rank in range(world_size):
        row = []
        for worker in range(max(1, num_workers)):
            with simulated_reader(rank, world_size, worker, max(1, num_workers)):
                got = wds.split_by_worker(wds.split_by_node(iter([{"url": u} for u in urls])))
                row.append([os.path.basename(d["url"]) for d in got])
        out.append(row)
    return out


def count_batches(loader: Iterable, limit: int | None = None) -> tuple[int, int]:
    """Iterate ``loader`` (at most ``limit`` batches); return ``(batches, samples)``.

    A batch's size is the length of its first field. The iterator is closed and collected
    before returning or raising: a DataLoader iterator left half-read (an endless resampled
    stream, a worker's error) would otherwise be copied into the next loader's forked workers,
    whose garbage collector then tries to stop workers that are not theirs and prints errors.
    """
    gc.collect()  # collect earlier leftovers here, before this loader forks its workers
    it = iter(loader)
    batches = samples = 0
    failure: BaseException | None = None
    try:
        for batch in itertools.islice(it, limit):
            batches += 1
            first = batch[0] if isinstance(batch, (tuple, list)) else batch
            samples += len(first) if hasattr(first, "__len__") and not isinstance(first, (str, bytes)) else 1
    except Exception as exc:
        failure = exc.with_traceback(None)  # the traceback's frames would keep the iterator alive
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
        del it
        gc.collect()
    if failure is not None:
        raise failure
    return batches, samples


# --------------------------------------------------------------------------- many small files vs shards


def read_small_files(paths: Sequence[str | os.PathLike[str]], latency: float = 0.0) -> int:
    """Open and read every file (one sample each); ``latency`` seconds of sleep per open simulate a
    parallel file system's metadata round trip. Returns the bytes read."""
    total = 0
    for p in paths:
        if latency:
            time.sleep(latency)
        with open(p, "rb") as f:
            total += len(f.read())
    return total


def read_shards(paths: Sequence[str | os.PathLike[str]], latency: float = 0.0) -> int:
    """Stream every member of every shard into memory, as webdataset does (one open per shard,
    with the same simulated ``latency``). Returns the bytes read."""
    total = 0
    for p in paths:
        if latency:
            time.sleep(latency)
        with open(p, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
            for info in tar:
                member = tar.extractfile(info)  # a view on the stream, read into memory
                if member is not None:
                    total += len(member.read())
    return total


@dataclass(frozen=True)
class FilesVsShards:
    """Samples per second reading the same samples as small files and as shards."""

    samples: int
    files: int
    shards: int
    latency: float
    rates: dict[str, float]  # "small files", "shards", "small files + latency", "shards + latency"

    def ratio(self, simulated: bool) -> float:
        """How many times the shards' rate the small files' rate is (with the latency or not)."""
        suffix = " + latency" if simulated else ""
        return self.rates["shards" + suffix] / self.rates["small files" + suffix]


def compare_small_files_and_shards(
    image_paths: Sequence[str | os.PathLike[str]],
    shard_paths: Sequence[str | os.PathLike[str]],
    latency: float = 0.001,
    repeat: int = 3,
) -> FilesVsShards:
    """Measure reading ``image_paths`` one file per sample against ``shard_paths`` holding the same
    samples, on the local disk and with ``latency`` seconds added per ``open`` (a simulation of
    metadata cost; the local runs read from the page cache, so they measure per-file overhead).

    Only bytes are read (no decoding): decoding costs the same either way. Best of ``repeat``.
    """
    if latency < 0:
        raise ValueError(f"latency must be >= 0 seconds, got {latency}")
    if not image_paths or not shard_paths:
        raise ValueError("give at least one image file and one shard")
    samples = sum(int(s) for s in verify_shards(shard_paths).values())
    if samples != len(image_paths):
        raise ValueError(f"the shards hold {samples} samples but {len(image_paths)} image files were given; "
                         "compare the same samples")

    def best(fn, *args) -> float:
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - start)
        return min(times)

    rates = {
        "small files": samples / best(read_small_files, image_paths, 0.0),
        "shards": samples / best(read_shards, shard_paths, 0.0),
        "small files + latency": samples / best(read_small_files, image_paths, latency),
        "shards + latency": samples / best(read_shards, shard_paths, latency),
    }
    return FilesVsShards(samples, len(image_paths), len(shard_paths), latency, rates)
