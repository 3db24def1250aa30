"""The GPU checklist: ``python -m course_lib gpu`` runs every GPU path of the course with small data.

The course runs on CPUs and uses a GPU where one is present; these are the paths only a GPU takes,
each run once and measured, so that an instructor (or CI on a GPU machine) sees at once what works:

* ``pinned copy``: host-to-device GB/s from pageable vs pinned memory (``pin_memory`` + ``non_blocking``, notebook 04);
* ``loader to device``: a ``DataLoader`` with ``pin_memory=True`` feeding batches into device memory,
  as a share of the pinned copy bandwidth;
* ``copy stage``: notebook 12's ``Prefetcher`` (reused pinned buffers, copies on a side CUDA stream) moving
  pinned batches into device memory, as a share of the pinned copy bandwidth measured beside it (goal: 0.8);
* ``nccl``: a one-rank NCCL process group (what ``course_lib.train``/``capstone`` use on GPUs) and an all-reduce;
* ``jpeg decode``: nvJPEG on the GPU against Pillow on the CPU, through notebook 12's ``gpu_decode``: torchcodec's
  decoder where it is installed and works, else torchvision's ``decode_jpeg``, with the deprecation it warns of;
* ``dali``: NVIDIA DALI's GPU decode (notebook 11), where ``nvidia-dali`` is installed.

Without a CUDA GPU every item says "not run" and the command exits 0; with ``--require-gpu`` it exits
1 instead. An item that fails on a GPU prints its error and makes the exit code 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

RUN, NOT_RUN, FAILED = "ok", "not run", "FAILED"


@dataclass
class Item:
    """One checklist item: its name, status (ok / not run / FAILED) and what it measured or why not."""

    name: str
    status: str
    finding: str
    figures: dict[str, float]


def _gb_per_s(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def pinned_copy(torch: Any, mb: int) -> Item:
    n = mb * 2**20 // 4
    pageable, pinned = torch.empty(n), torch.empty(n).pin_memory()
    dev = torch.empty(n, device="cuda")
    from course_lib.gpu_feed import best_seconds  # best of 5, the GPU synchronised around each copy

    cuda = torch.device("cuda")
    t_pageable = best_seconds(lambda: dev.copy_(pageable), cuda)
    t_pinned = best_seconds(lambda: dev.copy_(pinned, non_blocking=True), cuda)
    figures = {"pageable_gbps": _gb_per_s(4 * n, t_pageable), "pinned_gbps": _gb_per_s(4 * n, t_pinned)}
    ratio = figures["pinned_gbps"] / figures["pageable_gbps"]
    return Item(
        "pinned copy",
        RUN,
        f"{mb} MiB host to device: pageable {figures['pageable_gbps']:.1f} GB/s, "
        f"pinned {figures['pinned_gbps']:.1f} GB/s ({ratio:.1f}×)",
        figures,
    )


def loader_to_device(torch: Any, mb: int, pinned_gbps: float) -> Item:
    from torch.utils.data import DataLoader, TensorDataset

    batch, per_sample = 32, 2**20 // 4  # 1 MiB float32 samples
    n = max(batch * 2, mb * 2**20 // (4 * per_sample))
    data = TensorDataset(torch.rand(n, per_sample))
    loader = DataLoader(data, batch_size=batch, num_workers=2, pin_memory=True, persistent_workers=True)
    for (x,) in loader:  # warm: start the workers and the pin-memory thread
        x.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for (x,) in loader:
        x.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    gbps = _gb_per_s(n * per_sample * 4, time.perf_counter() - start)
    share = gbps / pinned_gbps if pinned_gbps else float("nan")
    return Item(
        "loader to device",
        RUN,
        f"DataLoader(pin_memory=True, 2 workers) into device memory: {gbps:.2f} GB/s, "
        f"{share:.2f}× the pinned copy bandwidth",
        {"gbps": gbps, "share_of_pinned": share},
    )


def prefetcher_copy(torch: Any, mb: int) -> Item:
    from course_lib.gpu_feed import copy_stage as measure

    batch_mb, batches = max(1, mb // 4), 8
    figures = measure(batch_mb=batch_mb, batches=batches)
    return Item(
        "copy stage",
        RUN,
        f"Prefetcher, {batches} pinned batches of {batch_mb} MiB into device memory: "
        f"{figures['copy_gbps']:.2f} GB/s, {figures['share']:.2f}× the pinned copy bandwidth "
        f"({figures['pinned_gbps']:.1f} GB/s; goal 0.8)",
        figures,
    )


def nccl_one_rank(torch: Any) -> Item:
    import datetime

    import torch.distributed as dist

    if not dist.is_nccl_available():
        return Item("nccl", FAILED, "torch was built without NCCL", {})
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group(
        "nccl", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60), device_id=torch.device("cuda:0")
    )
    try:
        t = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        ok = bool((t == 1).all())
    finally:
        dist.destroy_process_group()
    return Item(
        "nccl", RUN if ok else FAILED, f"one-rank NCCL group, all_reduce of 4 MiB: {'correct' if ok else 'WRONG'}", {}
    )


def jpeg_decode(torch: Any) -> Item:
    from course_lib.gpu_feed import gpu_decode
    from course_lib.workers import jpeg_payloads

    found = gpu_decode(jpeg_payloads(n=64, side=256, distinct=64))
    figures = {k: float(found[k]) for k in ("gpu_images_per_s", "cpu_images_per_s")}
    ratio = figures["gpu_images_per_s"] / figures["cpu_images_per_s"]
    warned = f"; DeprecationWarning: {found['deprecation']}" if found["deprecation"] else ""
    return Item(
        "jpeg decode",
        RUN,
        f"64 JPEGs of 256×256: {found['decoder']} {figures['gpu_images_per_s']:.0f} images/s, "
        f"Pillow {figures['cpu_images_per_s']:.0f} images/s ({ratio:.1f}×){warned}",
        figures,
    )


def dali_decode(torch: Any) -> Item:
    from course_lib.alternatives import dali_available

    if not dali_available():
        return Item("dali", NOT_RUN, "nvidia-dali is not installed (pip install nvidia-dali-cuda120 or -cuda130)", {})
    return Item("dali", RUN, "nvidia-dali imports and sees the GPU; notebook 11 section 5 runs its pipeline", {})


def run_checklist(mb: int = 64) -> list[Item]:
    """Every item, in order; without a CUDA GPU, every item "not run"."""
    names = ["pinned copy", "loader to device", "copy stage", "nccl", "jpeg decode", "dali"]
    try:
        import torch
    except ImportError as exc:
        return [Item(n, NOT_RUN, f"torch is not importable ({exc})", {}) for n in names]
    if not torch.cuda.is_available():
        return [Item(n, NOT_RUN, "no CUDA GPU here", {}) for n in names]
    items: list[Item] = []
    steps: list[tuple[str, Callable[[], Item]]] = [
        ("pinned copy", lambda: pinned_copy(torch, mb)),
        ("loader to device", lambda: loader_to_device(torch, mb, items[0].figures.get("pinned_gbps", 0.0))),
        ("copy stage", lambda: prefetcher_copy(torch, mb)),
        ("nccl", lambda: nccl_one_rank(torch)),
        ("jpeg decode", lambda: jpeg_decode(torch)),
        ("dali", lambda: dali_decode(torch)),
    ]
    for name, step in steps:
        try:
            items.append(step())
        except Exception as exc:  # noqa: BLE001 - a failing item is a finding, the others still run
            items.append(Item(name, FAILED, f"{type(exc).__name__}: {exc}", {}))
    return items


def report(items: list[Item], device: str) -> str:
    width = max(len(i.name) for i in items)
    lines = [f"GPU checklist ({device}):"]
    lines += [f"  [{i.status:^7}]  {i.name:<{width}}  {i.finding}" for i in items]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64, help="MiB moved per measurement (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the report")
    parser.add_argument("--require-gpu", action="store_true", help="exit 1 when no GPU is there to check")
    args = parser.parse_args(argv)
    if args.mb < 1:
        parser.error("--mb must be at least 1")
    items = run_checklist(args.mb)
    try:
        import torch

        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA GPU"
    except ImportError:
        device = "no torch"
    print(
        json.dumps({"device": device, "items": [asdict(i) for i in items]}, indent=1)
        if args.json
        else report(items, device)
    )
    failed = any(i.status == FAILED for i in items)
    skipped = all(i.status == NOT_RUN for i in items)
    return 1 if failed or (args.require_gpu and skipped) else 0


if __name__ == "__main__":
    sys.exit(main())
