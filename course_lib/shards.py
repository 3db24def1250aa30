"""Notebook 09: tar shards in the WebDataset format: write them, look inside them, split them over ranks and workers.

A shard is a plain tar file; a sample is the consecutive members that share a key (``circle-00012.jpg``,
``circle-00012.cls``, ``circle-00012.json``). Shards are written byte for byte the same every time, into a
temporary folder renamed into place with its ``manifest.json``, and reused by a second call. Reading is
webdataset's job; here is what a notebook should not re-type: brace patterns, member listings (nothing
is ever extracted to disk or unpickled), a damaged copy, shard counts for a job, small files vs shards.
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

from . import claims as _claims, data as _data
from .support import check_int, new_folder

__all__ = [
    "ShardError",
    "ShardSet",
    "brace_urls",
    "check_enough_shards",
    "compare_small_files_and_shards",
    "corrupt_copy",
    "count_batches",
    "epoch_seconds",
    "list_members",
    "read_shardset",
    "reader_shares",
    "shard_error_summary",
    "shard_folder",
    "shards_needed",
    "simulated_reader",
    "verify_shards",
    "write_image_shards",
    "write_tensor_shards",
]

_StrPath = str | os.PathLike[str]  # a path, as a string or a Path
_MANIFEST = "manifest.json"
_FORMAT_VERSION = 1
TAR_MTIME = 946684800  # 2000-01-01: the members' time (webdataset's, time.time(), would make two writes differ)
_NUMBERED = re.compile(r"^(?P<stem>.*?)(?P<num>\d+)(?P<ext>\.tar(?:\.gz)?)$")  # a path, e.g. "data/a-000007.tar"


class ShardError(RuntimeError):
    """Notebook 09, section 6: shards are missing, damaged, or too few for a job; the message says what to do."""


@dataclass(frozen=True)
class ShardSet:
    """Notebook 09, section 2: a folder of shards written here, as its manifest describes it. ``urls`` (the brace
    pattern for ``wds.WebDataset``) holds an absolute path: print :meth:`describe` instead."""

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
        per_shard = ", ".join(map(str, sorted(set(self.counts))))
        return (
            f"{len(self.paths)} shards {self.pattern}: {self.samples} samples, "
            f"{self.bytes / 1e6:.1f} MB ({per_shard} samples per shard)"
        )


def brace_urls(paths: Sequence[_StrPath]) -> str:
    """Notebook 09, section 2: one string naming all ``paths``, in webdataset's brace notation where it can: sorted
    numbers make a range (``a-{000000..000007}.tar``) or a list (``a-{000001,000004}.tar``); others join with ``::``."""
    if not paths:
        raise ValueError("no paths given: brace_urls needs at least one shard")
    groups: dict[tuple[str, str, int], list[int]] = {}  # (folder and stem, extension, digits) -> numbers
    singles = []
    for p in map(str, paths):
        if m := _NUMBERED.match(p):
            groups.setdefault((m["stem"], m["ext"], len(m["num"])), []).append(int(m["num"]))
        else:
            singles.append(p)
    parts = []
    for (stem, ext, width), nums in groups.items():
        nums = sorted(set(nums))
        texts = [f"{n:0{width}d}" for n in nums]
        if len(nums) > 1 and nums[-1] - nums[0] == len(nums) - 1:  # consecutive: a range
            texts = [f"{texts[0]}..{texts[-1]}"]
        parts.append(f"{stem}{texts[0]}{ext}" if len(nums) == 1 else f"{stem}{{{','.join(texts)}}}{ext}")
    return "::".join(parts + singles)


def _expand_urls(urls: str) -> list[str]:
    """Notebook 09, section 2: the shard names a brace pattern stands for (webdataset's own expansion)."""
    from webdataset.shardlists import expand_urls as expand

    return list(expand(urls))


def find_shards(location: _StrPath) -> list[Path]:
    """Notebook 13, section 4: the existing shard files a folder, a brace pattern or a glob names, sorted; a
    :class:`ShardError` saying how to write shards if there are none, or if the pattern names missing files."""
    how = "Write shards first (course_lib.shards.write_image_shards(folder) for the shapes images), or check the path."
    text = str(location)
    path = Path(text).expanduser()
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.name.endswith((".tar", ".tar.gz")) and p.is_file())
        problem = f"the folder {path.name}/ holds no .tar shards"
    elif "{" in text or "::" in text:
        found = [Path(u).expanduser() for u in _expand_urls(text)]
        missing = [p for p in found if not p.is_file()]
        if missing:
            where = "" if missing[0].parent.is_dir() else f" (its folder {missing[0].parent.name}/ does not exist)"
            raise ShardError(
                f"{len(missing)} of the {len(found)} shards the pattern names do not exist, "
                f"e.g. {missing[0].name}{where}. {how}"
            )
        problem = f"the pattern {path.name} names no shards"
    elif any(c in text for c in "*?["):
        found = sorted(p for p in path.parent.glob(path.name) if p.is_file())
        problem = f"no file matches {path.name} in {path.parent.name}/"
    else:
        found = [path] if path.is_file() else []
        problem = f"no shard folder or file {path.name!r} (in {path.parent.name or '.'}/)"
    if not found:
        raise ShardError(f"{problem}. {how}")
    return found


def list_members(shard: _StrPath) -> list[tuple[str, int]]:
    """Notebook 09, section 1: ``(member name, size in bytes)`` for every member of a shard, in tar order, each read
    into memory as webdataset streams it (never extracted to disk); a damaged shard raises :class:`ShardError`."""
    members: list[tuple[str, int]] = []
    try:
        with tarfile.open(shard, mode="r|*") as tar:
            for info in tar:
                if info.isfile():
                    tar.extractfile(info).read()  # type: ignore[union-attr]
                members.append((info.name, info.size))
    except (tarfile.TarError, EOFError, OSError) as exc:
        samples = len({name.split(".", 1)[0] for name, _ in members})
        raise ShardError(
            f"{Path(shard).name} is damaged ({exc}) after {samples} samples; write it again "
            "(write_image_shards(..., force=True)) or skip it with handler=wds.warn_and_continue"
        ) from None
    return members


def verify_shards(shards: ShardSet | Iterable[_StrPath]) -> dict[str, int]:
    """Notebook 09, section 9: read every member of every shard; ``{shard name: samples}`` if all are intact, else a
    :class:`ShardError`. A :class:`ShardSet`'s manifest also catches a shard cut at a member boundary (a valid tar)."""
    expected = dict(zip(shards.names, shards.counts)) if isinstance(shards, ShardSet) else {}
    counts = {}
    for p in map(Path, shards.paths if isinstance(shards, ShardSet) else shards):
        counts[p.name] = len({name.split(".", 1)[0] for name, _ in list_members(p)})
        if counts[p.name] != expected.get(p.name, counts[p.name]):
            raise ShardError(
                f"{p.name} holds {counts[p.name]} samples but its manifest says {expected[p.name]}: "
                "it was cut short (at a member boundary, so no reader notices); write it again"
            )
    return counts


def shard_error_summary(exc: BaseException) -> str:
    """Notebook 09, section 9: one line for an error webdataset raised while reading a shard: its first message and
    the shard's file name, without the open file and absolute URL that webdataset appends to its arguments."""
    args = list(getattr(exc, "args", ()))
    message = str(args[0]) if args else str(exc)
    shard = next((os.path.basename(a) for a in reversed(args[1:]) if isinstance(a, str) and ".tar" in a), None)
    if shard is None and (m := re.search(r"name='([^']+)'", message)):
        shard = os.path.basename(m.group(1))
    message = re.sub(r"\s*@\s*<[^>]*>", "", message)  # "... @ <_io.BufferedReader name='/abs/...'>"
    return f"{type(exc).__name__}: {message}" + (f" (shard {shard})" if shard else "")


def corrupt_copy(shard: _StrPath, out: _StrPath, keep: float = 0.5, cut: str = "data") -> Path:
    """Notebook 09, section 9: write a truncated copy of ``shard`` to ``out``, as a broken copy or a full disk leaves.

    The copy ends at the sample at ``keep`` (a fraction of the samples): ``cut="data"`` just after its first
    member's tar header (readers fail: "unexpected end of data"); ``cut="header"`` inside that header, which
    tarfile (so webdataset) takes for the end of the archive: the rest vanishes *without an error*.
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
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(shard.read_bytes()[:end])
    return out


def load_npy(payload: bytes) -> np.ndarray:
    """Notebook 12, section 3: decode a ``.npy`` member; ``allow_pickle=False``, so a data file can never run code."""
    return np.load(io.BytesIO(payload), allow_pickle=False)


def shard_folder(split: str, size: str = _data.DEFAULT_SIZE, seed: int = 0, root: _StrPath | None = None) -> Path:
    """Notebook 09, section 2: where one split's shards live, beside their images (``python -m course_lib prepare --all``
    writes them there once): ``<data dir>/webdataset/shapes-<size>-seed<seed>/<split>``."""
    return _data.data_dir(root) / "webdataset" / _data.dataset_name(size, seed) / split


def _manifest(folder: Path) -> dict:
    """A shard folder's manifest, once every shard it lists is there; a :class:`ShardError` otherwise."""
    try:
        manifest = json.loads((folder / _MANIFEST).read_text())
    except (OSError, ValueError):
        raise ShardError(
            f"{folder.name}/ has no readable {_MANIFEST}: write_image_shards did not write it (completely); "
            "write it (again) with force=True"
        ) from None
    missing = [s["name"] for s in manifest["shards"] if not (folder / s["name"]).is_file()]
    if missing:
        raise ShardError(
            f"{folder.name}/ lacks {len(missing)} of its shards (e.g. {missing[0]}); write it again: force=True"
        )
    return manifest


def read_shardset(folder: _StrPath) -> ShardSet:
    """Notebook 09, section 9: the :class:`ShardSet` a folder's manifest describes; a clear error if it is not one."""
    folder = Path(folder).expanduser()
    shards = _manifest(folder)["shards"]
    paths = [folder / s["name"] for s in shards]
    return ShardSet(
        folder,
        brace_urls(paths),
        paths,
        sum(s["samples"] for s in shards),
        sum(s["bytes"] for s in shards),
        [s["samples"] for s in shards],
        [s["keys"] for s in shards],
    )


def _check_writer(prefix: str, maxcount: int, maxsize: float | None) -> None:
    if not re.fullmatch(r"[A-Za-z0-9_-]+", prefix):
        raise ValueError(f"prefix {prefix!r} may hold only letters, digits, '-' and '_' (no dots: they end the key)")
    check_int(maxcount, "maxcount", 1)
    if maxsize is not None and maxsize < 1:
        raise ValueError(f"maxsize must be a positive number of bytes, got {maxsize}")


def _writable_beside(final: Path) -> bool:
    """Whether ``final`` can be made: its nearest existing folder (``final`` itself, or a parent) is writable."""
    existing = next(p for p in (final, *final.parents) if p.exists())
    return os.access(existing, os.W_OK)


def _write_atomically(
    out_dir: _StrPath,
    params: dict,
    samples: Iterator[dict],
    name_prefix: str,
    maxcount: int,
    maxsize: float | None,
    force: bool,
) -> ShardSet:
    """Write ``samples`` with webdataset's ShardWriter into a temporary folder, then rename it (or reuse it)."""
    import webdataset as wds

    final = Path(out_dir).expanduser()
    with contextlib.suppress(ShardError):
        old = {} if force else _manifest(final)
        if (
            old.get("format_version") == _FORMAT_VERSION
            and old.get("params") == params
            and all((final / s["name"]).stat().st_size == s["bytes"] for s in old["shards"])
        ):
            return read_shardset(final)  # written before with the same parameters, and whole
    if not _writable_beside(final):
        raise ShardError(
            f"cannot write the shards in {final}: that folder is not writable (a shared course folder, read-only "
            "for learners). Ask the instructor to run `python -m course_lib prepare --all` there, which writes "
            "every notebook's shards once, or set COURSE_DATA_DIR to a folder of your own"
        )
    with new_folder(final, _MANIFEST, ShardError) as tmp:
        # verbose=0: ShardWriter prints every file name it opens (an absolute path) otherwise
        with wds.ShardWriter(
            str(tmp / f"{name_prefix}-%06d.tar"),
            maxcount=maxcount,
            verbose=0,
            mtime=TAR_MTIME,
            maxsize=float("inf") if maxsize is None else maxsize,
        ) as writer:
            for sample in samples:
                writer.write(sample)
        shards = []
        for p in sorted(tmp.glob(f"{name_prefix}-*.tar")):
            keys = list(dict.fromkeys(n.split(".", 1)[0] for n, _ in list_members(p)))  # in order, once each
            blob = p.read_bytes()
            shards.append(
                {
                    "name": p.name,
                    "samples": len(keys),
                    "bytes": len(blob),
                    "sha256": hashlib.sha256(blob).hexdigest(),
                    "keys": keys,
                }
            )
        manifest = {
            "format_version": _FORMAT_VERSION,
            "params": params,
            "pattern": brace_urls([s["name"] for s in shards]),
            "samples": sum(s["samples"] for s in shards),
            "bytes": sum(s["bytes"] for s in shards),
            "shards": shards,
        }
        if not manifest["samples"]:
            raise ValueError("no samples to write")
        (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=1))  # last: a folder with a manifest is finished
    return read_shardset(final)


def _image_samples(
    folder: Path, split: str, order: np.ndarray, paths: np.ndarray, targets: np.ndarray
) -> Iterator[dict]:
    for i in order:
        rel = str(paths[i])  # "<class>/<file>.jpg", relative to the split folder
        cls_name, file_name = rel.split("/")
        meta = {"source": f"{split}/{rel}", "class": cls_name, "index": int(i)}
        yield {
            "__key__": f"{cls_name}-{file_name.rsplit('.', 1)[0]}",  # no dots: webdataset splits key and extension there
            "jpg": (folder / split / rel).read_bytes(),  # the original JPEG bytes, not re-encoded
            "cls": str(int(targets[i])).encode("ascii"),
            "json": json.dumps(meta, sort_keys=True).encode("utf-8"),
        }


def write_image_shards(
    out_dir: _StrPath,
    split: str = "train",
    size: str = _data.DEFAULT_SIZE,
    seed: int = 0,
    root: _StrPath | None = None,
    maxcount: int = 100,
    maxsize: float | None = None,
    prefix: str = "shapes",
    shuffle: bool = True,
    force: bool = False,
) -> ShardSet:
    """Notebook 09, section 2: write the generated shapes images of one split as tar shards in ``out_dir``; return them.

    A sample is ``KEY.jpg`` (the file's bytes), ``KEY.cls`` (the label) and ``KEY.json`` (source, class, index in
    ``ImageFileDataset`` order); a shard closes at ``maxcount`` samples or ``maxsize`` bytes. ``shuffle`` orders them
    by ``seed`` (a shuffle buffer cannot undo class-sorted folders). Reused unless ``force=True``."""
    from .datasets import ImageFileDataset

    if split not in _data.SPLITS:
        raise ValueError(f"split must be one of {', '.join(_data.SPLITS)}, got {split!r}")
    _check_writer(prefix, maxcount, maxsize)
    folder = _data.prepare_data(size, seed, root, progress=False)
    dataset = ImageFileDataset(folder, split)
    order = np.random.default_rng(seed).permutation(len(dataset)) if shuffle else np.arange(len(dataset))
    params = {
        "kind": "images",
        "split": split,
        "size": size,
        "seed": seed,
        "source_digest": _data.read_manifest(folder)["digest"],
        "maxcount": maxcount,
        "maxsize": maxsize,
        "prefix": prefix,
        "shuffle": shuffle,
    }
    samples = _image_samples(folder, split, order, dataset.paths, dataset.targets)
    return _write_atomically(out_dir, params, samples, f"{prefix}-{split}", maxcount, maxsize, force)


def _tensor_samples(n: int, values: int, seed: int) -> Iterator[dict]:
    for i in range(n):
        buf = io.BytesIO()  # one random stream per sample: the same bytes whatever maxcount splits them into
        np.save(buf, np.random.default_rng([seed, i]).random(values, dtype=np.float32), allow_pickle=False)
        yield {"__key__": f"{i:08d}", "npy": buf.getvalue(), "cls": str(i % 10).encode("ascii")}


def write_tensor_shards(
    out_dir: _StrPath,
    n: int,
    sample_bytes: int = 1 << 20,
    maxcount: int = 64,
    seed: int = 0,
    prefix: str = "tensors",
    force: bool = False,
) -> ShardSet:
    """Notebook 12, section 3: write ``n`` raw float32 samples as shards: ``KEY.npy`` (``sample_bytes / 4`` values in
    [0, 1), read with :func:`load_npy`) and ``KEY.cls`` (``index % 10``); deterministic, reused like image shards."""
    check_int(n, "n", 1)
    if sample_bytes < 4 or sample_bytes % 4:
        raise ValueError(f"sample_bytes must be a positive multiple of 4 (float32 values), got {sample_bytes}")
    _check_writer(prefix, maxcount, None)
    params = {
        "kind": "tensors",
        "n": n,
        "sample_bytes": sample_bytes,
        "seed": seed,
        "maxcount": maxcount,
        "maxsize": None,
        "prefix": prefix,
    }
    return _write_atomically(
        out_dir, params, _tensor_samples(n, sample_bytes // 4, seed), prefix, maxcount, None, force
    )


def shards_needed(world_size: int, num_workers: int) -> int:
    """Notebook 09, section 6: the fewest shards that give every reader one: ranks × workers
    (``num_workers=0``: the rank's main process reads, one reader per rank)."""
    return check_int(world_size, "world_size", 1) * max(1, check_int(num_workers, "num_workers", 0))


def check_enough_shards(n_shards: int, world_size: int, num_workers: int) -> None:
    """Notebook 09, section 6: raise :class:`ShardError` when some rank's worker would get no shard at all."""
    need = shards_needed(world_size, num_workers)
    if n_shards < need:
        readers = (
            f"{world_size} rank{'s' if world_size > 1 else ''} × "
            f"{max(1, num_workers)} worker{'s' if num_workers > 1 else ''}"
        )
        raise ShardError(
            f"{n_shards} shard{'s' if n_shards != 1 else ''} for {readers} = {need} readers: {need - n_shards} of them "
            f"would read nothing. At least {need} shards are needed (a multiple of {need} keeps the readers even): "
            "write smaller shards (a lower maxcount), use fewer workers, or use resampled=True with with_epoch."
        )


@contextlib.contextmanager
def simulated_reader(
    rank: int = 0, world_size: int = 1, worker: int | None = None, num_workers: int | None = None
) -> Iterator[None]:
    """Notebook 09, section 6: make webdataset's splitters in *this* process believe it is ``rank`` of ``world_size``,
    through ``RANK``/``WORLD_SIZE`` (as torchrun sets them) and ``WORKER``/``NUM_WORKERS``, which workers inherit."""
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


def reader_shares(shards: Sequence[_StrPath] | str, world_size: int, num_workers: int) -> list[list[list[str]]]:
    """Notebook 09, section 6: ``shares[rank][worker]``, the names of the shards webdataset's own ``split_by_node`` and
    ``split_by_worker`` give that reader (run here, see :func:`simulated_reader`); ``num_workers=0``: one per rank."""
    import webdataset as wds

    urls = _expand_urls(shards) if isinstance(shards, str) else [str(s) for s in shards]
    readers = max(1, num_workers)
    shares: list[list[list[str]]] = [[] for _ in range(world_size)]
    for rank, worker in itertools.product(range(world_size), range(readers)):
        with simulated_reader(rank, world_size, worker, readers):
            got = wds.split_by_worker(wds.split_by_node(iter([{"url": u} for u in urls])))
            shares[rank].append([os.path.basename(d["url"]) for d in got])
    return shares


def count_batches(loader: Iterable, limit: int | None = None) -> tuple[int, int]:
    """Notebook 09, section 5: iterate ``loader`` (at most ``limit`` batches); return ``(batches, samples)``.

    A batch's size is the length of its first field. The iterator is closed and collected before returning or
    raising: one left half-read would be copied into the next loader's forked workers, and break them."""
    gc.collect()  # collect earlier leftovers here, before this loader forks its workers
    it = iter(loader)
    batches = samples = 0
    failure: BaseException | None = None
    try:
        for batch in itertools.islice(it, limit):
            batches += 1
            first = batch[0] if isinstance(batch, (tuple, list)) else batch
            samples += len(first) if hasattr(first, "__len__") and not isinstance(first, (str, bytes)) else 1
    except Exception as exc:  # noqa: BLE001 - any reader's error, raised again below
        failure = exc.with_traceback(None)  # the traceback's frames would keep the iterator alive
    finally:
        if hasattr(it, "close"):
            it.close()
        del it
        gc.collect()
    if failure is not None:
        raise failure
    return batches, samples


def _read_small_files(paths: Sequence[_StrPath], latency: float = 0.0) -> int:
    """Notebook 09, section 10: open and read every file (one sample each), ``latency`` seconds of sleep per
    open simulating a parallel file system's metadata round trip; return the bytes read."""
    total = 0
    for p in paths:
        if latency:
            time.sleep(latency)
        total += len(Path(p).read_bytes())
    return total


def _read_shards(paths: Sequence[_StrPath], latency: float = 0.0) -> int:
    """Notebook 09, section 10: stream every member of every shard into memory, as webdataset does (one
    open per shard, with the same simulated ``latency``); return the bytes read."""
    total = 0
    for p in paths:
        if latency:
            time.sleep(latency)
        total += sum(size for _, size in list_members(p))
    return total


def epoch_seconds(paths: Sequence[_StrPath], how: str, latency_s: float = 0.0) -> float:
    """Notebook 09, sections 10 and 11: seconds of one pass in this process, every file read whole
    (``how="files"``) or every member of every shard (``how="shards"``), with ``latency_s`` of sleep per open: a
    shared file system's metadata round trip, simulated."""
    read = {"files": _read_small_files, "shards": _read_shards}.get(how)
    if read is None:
        raise ValueError(f"how must be 'files' (a file per sample) or 'shards' (tar shards), got {how!r}")
    if latency_s < 0:
        raise ValueError(f"latency must be >= 0 seconds, got {latency_s}")
    start = time.perf_counter()
    read(paths, latency_s)
    return time.perf_counter() - start


@dataclass(frozen=True)
class FilesVsShards:
    """Seconds to read the same samples as small files and as shards (with and without latency), per round."""

    samples: int
    files: int
    shards: int
    latency: float
    rounds: _claims._Rounds  # "small files", "shards", "small files + latency", "shards + latency": seconds per round

    @property
    def rates(self) -> dict[str, float]:
        """Samples per second of each way, from its median round."""
        return {name: self.samples / self.rounds.median(name) for name in self.rounds.values}

    def ratios(self, simulated: bool) -> list[float]:
        """Per round, the shards' rate over the small files' rate, with the simulated latency or without."""
        suffix = " + latency" if simulated else ""
        return self.rounds.ratio("small files" + suffix, "shards" + suffix)


def compare_small_files_and_shards(
    image_paths: Sequence[_StrPath], shard_paths: Sequence[_StrPath], latency: float = 0.001, rounds: int = 5
) -> FilesVsShards:
    """Notebook 09, section 10: seconds to read ``image_paths`` (a file per sample) and ``shard_paths`` (the same
    samples) in ``rounds`` interleaved rounds (:func:`course_lib.claims.interleave`): from the page cache (per-file
    overhead) and with ``latency`` seconds per ``open`` (simulated metadata cost). Bytes only: decoding costs the
    same either way."""
    if latency < 0:
        raise ValueError(f"latency must be >= 0 seconds, got {latency}")
    samples = sum(verify_shards(shard_paths).values())
    if samples != len(image_paths) or not samples:
        raise ValueError(
            f"the shards hold {samples} samples and {len(image_paths)} image files were given: "
            "compare the same samples (at least one)"
        )

    measured = _claims.interleave(
        {
            "small files": lambda: epoch_seconds(image_paths, "files"),
            "shards": lambda: epoch_seconds(shard_paths, "shards"),
            "small files + latency": lambda: epoch_seconds(image_paths, "files", latency),
            "shards + latency": lambda: epoch_seconds(shard_paths, "shards", latency),
        },
        rounds=rounds,
    )
    return FilesVsShards(samples, len(image_paths), len(shard_paths), latency, measured)
