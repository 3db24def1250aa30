"""Benchmarks instructors run on a machine before a workshop: ``python -m course_lib bench loader|highrate|formats``
(and ``store``, ``tokens``: :mod:`course_tools.store_bench`, :mod:`course_tools.token_bench`).

    python -m course_lib bench loader                                   # the generated 'medium' set
    python -m course_lib bench loader --data /data/imagenet --limit 5000 --workers 0 2 4 8
    python -m course_lib bench highrate --data /scratch/$USER/raw.f32 --size-mb 2048 --workers 4
    python -m course_lib bench highrate --source shards --data /scratch/$USER/tensor-shards --size-mb 2048
    python -m course_lib bench formats --out /scratch/$USER/formats --size medium --workers 2 4

``highrate`` answers "can a DataLoader feed a raw float32 stream at GB/s?": it reads the same
bytes (a raw file of 1 MiB float32 samples, written first if missing) as a plain sequential
read into one reused sample-sized buffer (the limit), into reused and fresh batch-sized buffers,
through a plain ``DataLoader`` with 0
and N workers, and through :class:`~course_lib.highrate.RingLoader` (reused shared-memory
slots), and prints GB/s and ratios to the limit (see :mod:`course_lib.highrate`). With
``--source shards`` the same samples are ``.npy`` members of tar shards (a folder, written first
if missing): webdataset with workers against a RingLoader reading by an index of the shards. On a raw
file it then compares threads with processes (:mod:`course_lib.threads`: SPDL, torchdata.nodes and a
thread pool against DataLoader and RingLoader workers) on work that releases the GIL and work that holds it:
GB/s, CPU seconds per GB of the main process and in total, and PSS.

``formats`` writes the train split of a generated set as WebDataset shards,
MDS shards and litdata chunks under ``--out`` and reads each through the same decoding and
``DataLoader``, in samples/s (see :mod:`course_lib.alternatives`).

``loader`` measures, for each worker count, the throughput of a plain ``DataLoader`` and of
:class:`~course_lib.instrument.InstrumentedLoader` on the same decode-bound work (JPEG files
through :func:`~course_lib.transforms.decode_augment`), and how throughput scales with workers.
Plain and instrumented passes alternate within each round, across worker counts, so drift of
the machine (other jobs, CPU clocks) hits both alike. Throughputs are medians over ``--rounds``;
the overhead ratio is the median of the per-round ratios, each taken between two back-to-back
passes, which cancels slow drift better than comparing two best cases.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from course_lib import alternatives as alt
from course_lib import data
from course_lib.support import fork_context, new_folder
from course_lib.datasets import DataNotFoundError, ImageFileDataset
from course_lib.instrument import InstrumentedLoader
from course_lib.timing import medians
from course_lib.transforms import decode_augment
from course_lib.workers import cpu_count

GOAL_OVERHEAD = 0.97  # instrumented / plain throughput, for every worker count
GOAL_SCALING = 1.6  # 2 workers / 0 workers throughput (plain loader), on 2 or more cores


def _workers(n: int) -> str:
    return f"{n} worker" if n == 1 else f"{n} workers"


def throughput(make_loader: Callable[[], Iterable[Any]]) -> float:
    """Samples per second of one full pass over a fresh loader of ``(images, targets)`` batches.

    The clock runs from ``iter()`` (which starts the workers) to the last batch, as in training.
    """
    loader = make_loader()
    samples = 0
    start = time.perf_counter()
    for images, _ in loader:
        samples += len(images)
    return samples / (time.perf_counter() - start)


def load_dataset(args: argparse.Namespace) -> tuple[Dataset, str]:
    """The data set the arguments name, and a one-line description of it."""
    transform = decode_augment(128)
    if args.data is None:
        folder = data.prepare_data(args.size, args.seed, args.root, progress=sys.stderr.isatty())
        ds, name = ImageFileDataset(folder, args.split, transform), f"{folder.name}/{args.split}"
    else:
        if not os.path.isdir(args.data):
            raise DataNotFoundError(
                f"--data {args.data}: no such folder. Pass an ImageFolder-style folder "
                "(<split>/<class>/<file>, or <class>/<file> with --split none), or leave --data out to use the generated set."
            )
        split = None if args.split == "none" else args.split
        ds, name = ImageFileDataset(args.data, split, transform), f"{args.data} (split {args.split})"
    if args.limit is not None and args.limit < len(ds):
        return Subset(ds, range(args.limit)), f"{name}, first {args.limit} of {len(ds)}"
    return ds, name


def run_loader_bench(args: argparse.Namespace, log: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Measure plain vs instrumented throughput per worker count; return every figure, and the goals.

    ``log`` receives the header lines before the (long) measurement starts.
    """
    ds, name = load_dataset(args)
    workers = list(dict.fromkeys(args.workers))  # each worker count once, in the order given
    images, _ = next(iter(DataLoader(ds, batch_size=args.batch_size)))
    facts = {
        "cpus": cpu_count(),
        "torch": torch.__version__,
        "data": name,
        "samples": len(ds),
        "bytes_per_batch": images.numel() * images.element_size(),
    }
    log(f"machine: {facts['cpus']} CPUs available, torch {facts['torch']}")
    log(
        f"data:    {name}: {facts['samples']} samples, batch size {args.batch_size}, "
        f"{facts['bytes_per_batch'] / 1e6:.2f} MB per batch of images"
    )
    log(
        f"loop:    consumes batches, no training step; workers {' '.join(map(str, workers))}; "
        f"median of {args.rounds} round{'s' * (args.rounds != 1)}, plain and instrumented back to back"
    )

    def make(kind: type, workers: int) -> Callable[[], Iterable[Any]]:
        def build() -> Iterable[Any]:
            torch.manual_seed(args.seed)  # the main process's augmentations (num_workers=0)
            gen = torch.Generator().manual_seed(args.seed)  # the workers' seeds
            return kind(ds, batch_size=args.batch_size, shuffle=False, num_workers=workers, generator=gen)

        return build

    rounds: dict[int, dict[str, list[float]]] = {w: {"plain": [], "instrumented": []} for w in workers}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*suggested max number of worker", category=UserWarning)
        for r in range(args.rounds):
            for i, w in enumerate(workers):
                kinds = [("plain", DataLoader), ("instrumented", InstrumentedLoader)]
                for label, kind in kinds if (r + i) % 2 == 0 else kinds[::-1]:  # alternate who goes first
                    rounds[w][label].append(throughput(make(kind, w)))

    return {"facts": facts, **summarize(rounds)}


def summarize(rounds: dict[int, dict[str, list[float]]]) -> dict[str, Any]:
    """From ``{workers: {"plain": [samples/s per round], "instrumented": [...]}}``: medians, the median
    of the back-to-back ratios, scaling over 0 workers, and the goals met."""
    per_workers = {}
    for w, got in rounds.items():
        plain, instrumented = statistics.median(got["plain"]), statistics.median(got["instrumented"])
        paired = statistics.median(i / p for p, i in zip(got["plain"], got["instrumented"]))
        per_workers[w] = {"plain": plain, "instrumented": instrumented, "ratio": paired, "rounds": got}
    scaling = {w: r["plain"] / per_workers[0]["plain"] for w, r in per_workers.items() if w != 0 and 0 in per_workers}
    goals = {
        f"instrumented/plain >= {GOAL_OVERHEAD} for every worker count": all(
            r["ratio"] >= GOAL_OVERHEAD for r in per_workers.values()
        )
    }
    if 2 in scaling:
        goals[f"2 workers >= {GOAL_SCALING}× the throughput of 0"] = scaling[2] >= GOAL_SCALING
    return {"workers": per_workers, "scaling": scaling, "goals": goals}


def report(result: dict[str, Any]) -> list[str]:
    """The measured figures and the goals, as lines to print."""
    lines = ["", "throughput (samples/s):"]
    for w, r in result["workers"].items():
        lines.append(
            f"  {_workers(w)}: plain {r['plain']:.0f}, instrumented {r['instrumented']:.0f}, "
            f"instrumented/plain {r['ratio']:.3f}"
        )
    if result["scaling"]:
        lines.append("worker scaling (plain loader):")
        lines += [f"  {_workers(w)}: {s:.2f}× the throughput of 0" for w, s in result["scaling"].items()]
    for kind, rows in result.get("threads", {}).items():
        lines += [
            "",
            f"threads and processes, {kind} (medians): GB/s, CPU s per GB of the main process and in total "
            "(with its worker processes), PSS MB of the main process and its workers:",
        ]
        lines += [
            f"  {name:<40} {r['gbps']:6.2f} GB/s  {r['main_cpu']:.3f} main  {r['total_cpu']:.3f} total CPU s/GB  "
            f"{r['pss_mb']:.0f} MB"
            for name, r in rows.items()
        ]
    lines.append("goals:")
    lines += [f"  {'PASS' if ok else 'FAIL'}  {goal}" for goal, ok in result["goals"].items()]
    return lines


GOAL_PLAIN_GBPS = 1.0  # plain DataLoader with workers, into the training loop
GOAL_RING_SHARE = 0.5  # RingLoader / raw read into a reused buffer


def run_highrate_bench(args: argparse.Namespace, log: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Write (or reuse) the raw file or the tensor shards, then compare every reader on them."""
    from course_lib import highrate

    sample_bytes = int(args.sample_mb * 2**20) // 4 * 4
    n = max(args.batch_size, int(args.size_mb * 2**20) // sample_bytes)
    if args.source == "shards":
        from course_lib.shards import write_tensor_shards

        per_shard = max(1, -(-n // max(args.shards, args.workers)))
        shardset = write_tensor_shards(args.data, n, sample_bytes=sample_bytes, maxcount=per_shard)
        where = f"{len(shardset.paths)} tar shards of .npy members"
    else:
        raw = highrate.write_raw_tensors(args.data, n, sample_bytes=sample_bytes)
        where = "a raw file"
    log(
        f"{n} samples of {sample_bytes / 2**20:.2f} MiB = {n * sample_bytes / 2**30:.2f} GiB in {where}; batch "
        f"{args.batch_size} ({args.batch_size * sample_bytes / 2**20:.0f} MiB); {args.workers} workers; {args.rounds} rounds; "
        f"{cpu_count()} CPUs; torch {torch.__version__}"
    )
    cpu: dict[str, list[float]] = {}
    if args.source == "shards":
        results = highrate.compare_shards(shardset.paths, args.batch_size, args.workers, args.rounds, cpu=cpu)
        plain_name, ring_name = (
            f"WebDataset, {args.workers} workers",
            f"RingLoader on the index, {args.workers} workers",
        )
    else:
        results = highrate.compare(raw, batch_size=args.batch_size, workers=args.workers, rounds=args.rounds, cpu=cpu)
        # the plain DataLoader's best: whole-batch reads (per-sample reads + collate are shown beside it)
        plain_name, ring_name = (
            f"DataLoader, batch reads, {args.workers} workers",
            f"RingLoader, {args.workers} workers",
        )
    med = medians(results)
    limit = next(iter(med.values()))
    plain, ring = med[plain_name], med[ring_name]
    goals = {
        f"{plain_name} >= {GOAL_PLAIN_GBPS:.1f} GB/s ({plain:.2f})": plain >= GOAL_PLAIN_GBPS,
        f"RingLoader >= {GOAL_RING_SHARE:.0%} of the fastest raw read ({ring / limit:.0%})": ring
        >= GOAL_RING_SHARE * limit,
    }
    out = {"results": results, "medians": med, "limit": limit, "cpu": medians(cpu), "goals": goals, "threads": {}}
    if args.source == "raw":  # threads against processes, on both kinds of work (notebook 12, section 6)
        from course_lib import threads

        for kind, work in threads.WORK.items():
            log(f"threads and processes, {kind} ...")
            rows = threads.compare_threads(
                raw, work, batch_size=args.batch_size, workers=args.workers, rounds=args.rounds
            )
            out["threads"][kind] = {
                name: {
                    "gbps": statistics.median(r.gbps),
                    "main_cpu": statistics.median(r.main_cpu),
                    "total_cpu": statistics.median(r.total_cpu),
                    "pss_mb": statistics.median(r.pss_mb),
                }
                for name, r in rows.items()
            }
    return out


def highrate_report(result: dict[str, Any]) -> list[str]:
    lines = ["", "GB/s (median of rounds), share of the limit (the first line), main process CPU s per GB:"]
    for name, value in result["medians"].items():
        cpu = result["cpu"].get(name)  # none for "fastest raw read": the best of the raw reads, not a run of its own
        lines.append(
            f"  {name:<40} {value:6.2f} GB/s  {value / result['limit']:.2f}× the limit  "
            + (f"{cpu:.3f} CPU s/GB" if cpu is not None else "(the best raw read of each round)")
        )
    for kind, rows in result.get("threads", {}).items():
        lines += [
            "",
            f"threads and processes, {kind} (medians): GB/s, CPU s per GB of the main process and in total "
            "(with its worker processes), PSS MB of the main process and its workers:",
        ]
        lines += [
            f"  {name:<40} {r['gbps']:6.2f} GB/s  {r['main_cpu']:.3f} main  {r['total_cpu']:.3f} total CPU s/GB  "
            f"{r['pss_mb']:.0f} MB"
            for name, r in rows.items()
        ]
    lines.append("goals:")
    lines += [f"  {'PASS' if ok else 'FAIL'}  {goal}" for goal, ok in result["goals"].items()]
    return lines


def write_mds(items: Sequence[tuple[str, int]], out_dir: str | os.PathLike[str], size_limit: int = 1 << 20) -> Path:
    """Write ``items`` as MDS shards (``index.json`` + ``shard.NNNNN.mds``) with ``MDSWriter``.

    Columns ``jpg`` (raw bytes) and ``cls`` (int); no compression, as JPEG is compressed already.
    Written into a temporary folder and renamed, so a crash never leaves a half-written set.
    """
    streaming = alt.require_package("streaming", "mosaicml-streaming")
    with new_folder(out_dir, "index.json", alt.FormatError) as tmp:
        with streaming.MDSWriter(
            out=str(tmp), columns={"jpg": "bytes", "cls": "int"}, size_limit=size_limit, progress_bar=False
        ) as writer:
            for item in items:
                writer.write(alt.encoded_sample(item))
    return Path(out_dir)


def write_litdata(
    items: Sequence[tuple[str, int]],
    out_dir: str | os.PathLike[str],
    chunk_bytes: str | int = "1MB",
    num_workers: int = 2,
    start_method: str | None = None,
) -> Path:
    """Write ``items`` as litdata chunks with ``litdata.optimize(fn=alt.encoded_sample, ...)``.

    ``optimize`` runs ``course_lib.alternatives.encoded_sample`` in ``num_workers`` processes and, as a side effect, sets
    the **process-wide** multiprocessing start method (``fork`` in a notebook, ``spawn`` in a
    script), and so does litdata's first import; this function puts the previous one back. ``start_method`` defaults to ``fork`` where
    it exists: ``spawn`` would start every worker by importing torch again. ``keep_data_ordered``
    gives each worker a fixed slice, so sample ``i`` of the output is ``items[i]`` on every run.
    """
    previous = multiprocessing.get_start_method(allow_none=True)  # before litdata's import, which sets one too
    litdata = alt.require_package("litdata", "litdata")
    method = start_method or fork_context().get_start_method()
    with new_folder(out_dir, "index.json", alt.FormatError) as tmp:
        try:
            litdata.optimize(
                fn=alt.encoded_sample,
                inputs=list(items),
                output_dir=str(tmp),
                chunk_bytes=chunk_bytes,
                num_workers=num_workers,
                keep_data_ordered=True,
                verbose=False,
                start_method=method,
            )
        finally:
            multiprocessing.set_start_method(previous, force=True)
        if not list(tmp.glob("*.bin")):
            raise alt.FormatError(
                f"litdata.optimize wrote no chunks for {Path(out_dir).name}/: see the worker errors above"
            )
    return Path(out_dir)


def run_formats_bench(args: argparse.Namespace, log: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Write the images as WebDataset, MDS and litdata, then :func:`course_lib.alternatives.compare_formats`."""
    import tempfile

    from course_lib import shards

    folder = data.prepare_data(args.size, args.seed, args.root, progress=sys.stderr.isatty())
    items = alt.image_items(folder, "train")
    scratch = None
    if args.out is None:
        scratch = tempfile.TemporaryDirectory(prefix="formats-bench-")
    out = Path(args.out or scratch.name)
    alt.require_package("streaming", "mosaicml-streaming")  # imported before the clock starts (several seconds)
    alt.require_package("litdata", "litdata")
    try:
        written = {}
        start = time.perf_counter()
        per_shard = max(1, -(-len(items) // (2 * max(args.workers))))
        wds_set = shards.write_image_shards(
            out / "webdataset",
            size=args.size,
            seed=args.seed,
            root=args.root,
            maxcount=per_shard,
            shuffle=False,
            force=True,
        )
        written["WebDataset"] = time.perf_counter() - start
        start = time.perf_counter()
        write_mds(items, out / "mds", size_limit=per_shard * 2500)
        written["MDS"] = time.perf_counter() - start
        start = time.perf_counter()
        write_litdata(items, out / "litdata", chunk_bytes=per_shard * 2500, num_workers=2)
        written["litdata"] = time.perf_counter() - start
        disk = {
            "WebDataset": sum(p.stat().st_size for p in wds_set.paths),
            "MDS": alt.folder_bytes(out / "mds"),
            "litdata": alt.folder_bytes(out / "litdata"),
        }
        log(
            f"{len(items)} images of {folder.name}/train; batch {args.batch_size}; workers {' '.join(map(str, args.workers))}; "
            f"{args.rounds} rounds; {cpu_count()} CPUs; torch {torch.__version__}"
        )
        per_workers = {}
        for w in args.workers:
            per_workers[w] = alt.compare_formats(
                {
                    "WebDataset": lambda: alt.webdataset_images(wds_set.urls),
                    "MDS": lambda: alt.mds_images(out / "mds", args.batch_size),
                    "litdata": lambda: alt.litdata_images(out / "litdata"),
                },
                samples=len(items),
                batch_size=args.batch_size,
                num_workers=w,
                rounds=args.rounds,
                seed=args.seed,
            )
    finally:
        if scratch is not None:
            scratch.cleanup()
    return {"written_s": written, "disk": disk, "workers": per_workers, "goals": {}}


def formats_report(result: dict[str, Any]) -> list[str]:

    lines = ["", "written in (s) and size on disk (MB):"]
    lines += [
        f"  {name:<11} {sec:6.2f} s  {result['disk'][name] / 1e6:7.2f} MB" for name, sec in result["written_s"].items()
    ]
    for w, results in result["workers"].items():
        med = medians(results)
        first = next(iter(med.values()))
        lines.append(f"samples/s with {_workers(w)} (median of rounds), and relative to WebDataset:")
        lines += [f"  {name:<11} {value:8.0f} samples/s  {value / first:.2f}×" for name, value in med.items()]
    return lines


def _at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an int no smaller than ``low``."""

    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be {low} or more, got {value}")
        return value

    parse.__name__ = "int"  # argparse names the type in its messages
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib bench", description="Benchmarks of the course's helpers."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("loader", help="plain vs instrumented DataLoader throughput, and scaling with workers")
    p.add_argument("--data", help="an ImageFolder-style folder to read instead of the generated set (e.g. ImageNet)")
    p.add_argument(
        "--split",
        default="train",
        help="split folder inside --data; 'none': the class folders are directly inside (default: %(default)s)",
    )
    p.add_argument(
        "--size",
        default="medium",
        choices=sorted(data.SIZES),
        help="generated set, without --data (default: %(default)s)",
    )
    p.add_argument(
        "--root", help=f"folder of the generated sets (default: ${data.ENV_VAR}, else ~/.cache/pytorch-data-course)"
    )
    p.add_argument("--limit", type=_at_least(1), help="use only the first N samples (a big real set stays quick)")
    p.add_argument("--batch-size", type=_at_least(1), default=32, help="(default: %(default)s)")
    p.add_argument("--workers", type=_at_least(0), nargs="+", default=[0, 1, 2], help="worker counts (default: 0 1 2)")
    p.add_argument(
        "--rounds", type=_at_least(1), default=5, help="passes per setting; medians count (default: %(default)s)"
    )
    p.add_argument(
        "--seed",
        type=_at_least(0),
        default=0,
        help="seed of the generated set and of the augmentations (default: %(default)s)",
    )
    p.add_argument("--check", action="store_true", help="exit with status 1 if a goal is missed (default: always 0)")

    h = sub.add_parser(
        "highrate", help="a raw float32 stream: plain DataLoader vs reused shared-memory buffers, in GB/s"
    )
    h.add_argument(
        "--data",
        required=True,
        help="path of the raw file to read; written first if missing (put it on the file system you want to test)",
    )
    h.add_argument(
        "--size-mb",
        type=float,
        default=1024,
        help="size of the file to write (default: %(default)s MiB); "
        "keep it below free RAM so that every method reads from the page cache",
    )
    h.add_argument("--sample-mb", type=float, default=1.0, help="size of one sample (default: %(default)s MiB)")
    h.add_argument("--batch-size", type=_at_least(1), default=64, help="samples per batch (default: %(default)s)")
    h.add_argument("--workers", type=_at_least(1), default=2, help="worker processes (default: %(default)s)")
    h.add_argument(
        "--rounds", type=_at_least(1), default=3, help="passes per method; medians count (default: %(default)s)"
    )
    h.add_argument(
        "--source",
        choices=["raw", "shards"],
        default="raw",
        help="raw: one file of back-to-back samples; shards: .npy members of tar shards, --data a folder "
        "(default: %(default)s)",
    )
    h.add_argument(
        "--shards", type=_at_least(1), default=8, help="with --source shards: how many (default: %(default)s)"
    )
    h.add_argument("--check", action="store_true", help="exit with status 1 if a goal is missed (default: always 0)")

    f = sub.add_parser(
        "formats", help="the same images as WebDataset, MDS and litdata: samples/s through one DataLoader"
    )
    f.add_argument(
        "--out",
        help="folder to write the three formats into (put it on the file system you want to test; "
        "default: a temporary folder, removed afterwards)",
    )
    f.add_argument(
        "--size",
        default="small",
        choices=sorted(data.SIZES),
        help="generated set whose train split is written (default: %(default)s)",
    )
    f.add_argument(
        "--root", help=f"folder of the generated sets (default: ${data.ENV_VAR}, else ~/.cache/pytorch-data-course)"
    )
    f.add_argument("--batch-size", type=_at_least(1), default=32, help="(default: %(default)s)")
    f.add_argument("--workers", type=_at_least(0), nargs="+", default=[2], help="worker counts (default: 2)")
    f.add_argument(
        "--rounds", type=_at_least(1), default=3, help="passes per format; medians count (default: %(default)s)"
    )
    f.add_argument("--seed", type=_at_least(0), default=0, help="seed of the generated set (default: %(default)s)")
    f.set_defaults(check=False)

    from . import store_bench

    s = sub.add_parser(
        "store",
        help="shards from a real S3 server on this machine vs local disk, from a cache, and "
        "over 20 ms per request: raw GB/s",
    )
    store_bench.add_arguments(s, _at_least)

    from . import token_bench

    t = sub.add_parser(
        "tokens",
        help="notebook 15's token files: windows and packed rows through a DataLoader against a raw read, in MB/s",
    )
    token_bench.add_arguments(t, _at_least)
    return parser


def main(argv: list[str] | None = None) -> int:
    from course_lib.alternatives import FormatError
    from course_lib.highrate import RawDataError
    from course_lib.shards import ShardError

    args = build_parser().parse_args(argv)
    start = time.perf_counter()
    from course_lib.s3server import ServerError
    from .store_bench import run_store_bench, store_report
    from .token_bench import run_token_bench, token_report

    run, show = {
        "loader": (run_loader_bench, report),
        "highrate": (run_highrate_bench, highrate_report),
        "formats": (run_formats_bench, formats_report),
        "store": (run_store_bench, store_report),
        "tokens": (run_token_bench, token_report),
    }[args.command]
    try:
        result = run(args, log=lambda line: print(line, flush=True))
    except (DataNotFoundError, data.DataError, RawDataError, ShardError, FormatError, ServerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print("\n".join(show(result)))
    print(f"wall time: {time.perf_counter() - start:.0f} s")
    return 1 if args.check and not all(result["goals"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
