"""Notebook 12, section 8: the GPU leg of the high-rate question: pinned buffers, CUDA-stream prefetch, GPU decode.

Once a loader delivers GB/s on the host, the batches still have to reach device memory. :class:`Prefetcher` copies
batch n+1 on a side CUDA stream, through reused pinned host buffers, while batch n is being used (the PyTorch
data-loading tutorial's prefetcher); :func:`copy_stage` measures it against the pinned copy bandwidth of the same
GPU; :func:`nonblocking_hazard` shows what ``non_blocking=True`` does and does not promise; :func:`gpu_decode` moves
JPEG decoding itself onto the GPU (nvJPEG).

The course runs on CPUs, so this section ships figures recorded on a GPU (``gpu_recordings.json``, written by
``python -m course_lib.gpu_feed --record``): :func:`show` runs a part where a CUDA GPU is present and prints
the recording, labelled with its GPU, date and versions, where none is.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import platform
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from PIL import Image

from .support import check_int, write_atomic
from .timing import seconds_per_call
from .workers import jpeg_payloads

__all__ = ["Prefetcher", "copy_stage", "gpu_decode", "nonblocking_hazard", "show"]

RECORDINGS = Path(__file__).with_name("gpu_recordings.json")  # shipped with the course: figures from a real GPU
PARTS = ("copy stage", "non_blocking", "gpu decode")
_VERSION_KEYS = ("python", "torch", "torchvision", "cuda")


class NoGPUError(RuntimeError):
    """Notebook 12, section 8: a part that measures a CUDA GPU was asked to run where there is none."""


# --------------------------------------------------------------------------- the prefetcher


class Prefetcher:
    """Notebook 12, section 8: yield ``batches`` (CPU tensors) in ``device`` memory, batch n+1 copied while n is used.

    Each batch is copied into one of ``slots`` reused pinned host buffers, then to the device on a side CUDA stream
    with ``non_blocking=True``. On a CPU ``device`` the same loop runs with ordinary host buffers, and the streams and
    events are no-ops (see ``_NoCuda``). ``pulled`` counts the batches taken from ``batches``, ``yielded`` those handed
    on, ``host_slots`` holds the reused buffers.

    ``copy_pinned=False``: a batch that is already in pinned memory (a pinned ring's slot, ``pin_memory=True``) goes
    to the device straight from where it is, by DMA, with no host copy into a slot (``direct`` counts them). The
    prefetcher then waits for that copy to end before it asks ``batches`` for the next one, so a source may reuse
    the batch's buffer once the next batch is requested (the reused buffer's contract)."""

    def __init__(
        self, batches: Iterable[torch.Tensor], device: str | torch.device, slots: int = 2, copy_pinned: bool = True
    ) -> None:
        self.batches, self.device = batches, _check_device(device)
        self.slots = check_int(slots, "slots", minimum=1)
        self.copy_pinned = copy_pinned
        self.direct = 0  # pinned batches copied to the device from where they were, without a host copy
        self._direct_copied: Any = None  # the event of the last such copy: its source buffer is read until then
        self.cuda: Any = torch.cuda if self.device.type == "cuda" else _NoCuda
        self.host_slots: list[torch.Tensor] = []  # allocated once, from the first batch
        self.copied: list[Any] = []  # per slot, an event: its last copy to the device has finished
        self.pulled = self.yielded = 0

    def __iter__(self) -> Iterator[torch.Tensor]:
        side = self.cuda.Stream(self.device)  # the copies run here ...
        consumer = self.cuda.current_stream(self.device)  # ... the training step runs here
        source = iter(self.batches)
        ahead = self._start_copy(self._next(source), side)
        while ahead is not None:
            consumer.wait_stream(side)  # batch n has arrived (nothing later is queued on the side stream yet)
            batch = ahead
            if self.device.type == "cuda":
                batch.record_stream(consumer)  # its memory is not reused before the consumer is done with it
            ahead = self._start_copy(self._next(source), side)  # batch n+1 starts its copy ...
            self.yielded += 1
            yield batch  # ... while batch n is used

    def _next(self, source: Iterator[torch.Tensor]) -> torch.Tensor | None:
        """The next batch of ``source``, once the last batch copied straight from the source's memory has arrived."""
        if self._direct_copied is not None:
            self._direct_copied.synchronize()  # the source may now overwrite that batch's buffer
            self._direct_copied = None
        return next(source, None)

    def _start_copy(self, batch: torch.Tensor | None, side: Any) -> torch.Tensor | None:
        """Copy ``batch`` into its pinned slot, then start its copy to the device on ``side``; None at the end.
        With ``copy_pinned=False``, a pinned batch starts its copy to the device from where it is."""
        if batch is None:
            return None
        if not self.copy_pinned and _is_pinned(_check_batch(batch)):
            with self.cuda.stream(side):
                on_device = batch.to(self.device, non_blocking=True, copy=True)  # DMA only, no host copy
                self._direct_copied = self.cuda.Event()
                self._direct_copied.record(side)
            self.pulled += 1
            self.direct += 1
            return on_device
        if not self.host_slots:
            self._allocate(batch)
        k = self.pulled % self.slots
        host = _slot_for(batch, self.host_slots[k])  # the slot, or its first rows for a shorter last batch
        self.copied[k].synchronize()  # the slot's previous copy has finished: safe to overwrite it
        host.copy_(batch)
        with self.cuda.stream(side):
            on_device = host.to(self.device, non_blocking=True, copy=True)  # copy=True: a new tensor on a CPU too
            self.copied[k].record(side)
        self.pulled += 1
        return on_device

    def _allocate(self, first: torch.Tensor) -> None:
        _check_batch(first)
        pinned = self.device.type == "cuda"  # page-locked memory: the GPU's DMA engine reads it directly
        self.host_slots = [torch.empty(first.shape, dtype=first.dtype, pin_memory=pinned) for _ in range(self.slots)]
        self.copied = [self.cuda.Event() for _ in range(self.slots)]


def _is_pinned(batch: torch.Tensor) -> bool:
    """Whether ``batch`` is in pinned (page-locked) host memory: the GPU's DMA engine can read it as it is."""
    return batch.is_pinned()


def _pinned(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` copied into pinned host memory."""
    return tensor.pin_memory()


class _NoCuda:
    """The CPU stand-in for the ``torch.cuda`` calls :class:`Prefetcher` makes: on a CPU a copy has finished when
    ``copy_`` or ``to`` returns, so there is nothing to wait for, and streams and events do nothing."""

    class Stream:
        def __init__(self, device: Any = None) -> None:
            pass

        def wait_stream(self, other: Any) -> None:
            pass

    class Event:
        def record(self, stream: Any = None) -> None:
            pass

        def synchronize(self) -> None:
            pass

    @staticmethod
    def current_stream(device: Any = None) -> "_NoCuda.Stream":
        return _NoCuda.Stream()

    @staticmethod
    def stream(stream: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def _check_device(device: str | torch.device) -> torch.device:
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device must name a torch device such as 'cuda' or 'cpu', got {device!r} ({exc})") from None
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"the Prefetcher feeds a CUDA GPU, or a CPU as its stand-in; got device {str(device)!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise NoGPUError(
            f"device {str(device)!r} asked for, but torch sees no CUDA GPU here "
            "(torch.cuda.is_available() is False): use device='cpu' to run the same loop on the CPU"
        )
    return device


def _check_batch(batch: Any) -> torch.Tensor:
    if not isinstance(batch, torch.Tensor):
        raise TypeError(f"the Prefetcher moves tensors: a batch is a torch.Tensor, got {type(batch).__name__}")
    if batch.device.type != "cpu":
        raise ValueError(f"the Prefetcher moves host batches to the device; this batch is already on {batch.device}")
    if batch.dim() == 0:
        raise ValueError("a batch needs a first (batch) dimension; got a 0-d tensor")
    return batch


def _slot_for(batch: Any, slot: torch.Tensor) -> torch.Tensor:
    """The part of ``slot`` that ``batch`` fills: all of it, or its first rows for a shorter last batch."""
    _check_batch(batch)
    if batch.dtype != slot.dtype or batch.shape[1:] != slot.shape[1:] or batch.shape[0] > slot.shape[0]:
        raise ValueError(
            f"the host slots were sized from the first batch, {tuple(slot.shape)} {slot.dtype}; this "
            f"batch is {tuple(batch.shape)} {batch.dtype}: every batch needs the first one's dtype and "
            "shape (only the last one may have fewer rows)"
        )
    return slot[: batch.shape[0]]


# --------------------------------------------------------------------------- the measurements (CUDA only)


def copy_stage(batch_mb: int = 32, batches: int = 16, device: str | torch.device = "cuda") -> dict[str, float]:
    """Notebook 12, section 8: the copy stage alone, in GB/s, as a share of the pinned copy bandwidth; and its host copy apart.

    ``batches`` batches of ``batch_mb`` MiB, already in pinned host memory, go through a :class:`Prefetcher` into
    device memory, with a trivial consumer, two ways: ``copy_gbps``, the DMA path alone (``copy_pinned=False``: each
    pinned batch is copied to the device from where it is), and ``with_host_copy_gbps``, each batch first copied on the
    host into the prefetcher's pinned slot (``copy_pinned=True``). ``host_copy_gbps`` is that host copy alone
    (pinned to pinned, no GPU). Beside them, in the same run, one large pinned tensor copied to the device gives the
    bandwidth the link offers, ``pinned_gbps``; ``share`` = ``copy_gbps`` / ``pinned_gbps``."""
    device_ = _require_cuda(device, "copy_stage")
    numel = check_int(batch_mb, "batch_mb", minimum=1) * 2**20 // 4
    n = check_int(batches, "batches", minimum=2)
    pinned_batches = [_pinned(torch.rand(numel)) for _ in range(min(n, 4))]  # a few, used in turn
    source = [pinned_batches[i % len(pinned_batches)] for i in range(n)]

    def consume(copy_pinned: bool) -> Callable[[], None]:
        prefetcher = Prefetcher(source, device_, copy_pinned=copy_pinned)

        def run() -> None:
            for batch in prefetcher:
                batch.mul_(2.0)  # a trivial step: the copies are what is measured

        run()  # warm: the CUDA context, the pinned slots, the caching allocator
        return run

    dma_s = best_seconds(consume(copy_pinned=False), device_, repeat=3)
    with_host_s = best_seconds(consume(copy_pinned=True), device_, repeat=3)
    slot = _pinned(torch.empty(numel))
    host_s = best_seconds(lambda: [slot.copy_(b) for b in source], None, repeat=3)

    big = _pinned(torch.rand(4 * numel))
    on_device = torch.empty_like(big, device=device_)
    pinned_s = best_seconds(lambda: on_device.copy_(big, non_blocking=True), device_)
    moved = n * numel * 4
    copy_gbps = moved / dma_s / 1e9
    pinned_gbps = big.numel() * 4 / pinned_s / 1e9
    return {
        "copy_gbps": copy_gbps,
        "with_host_copy_gbps": moved / with_host_s / 1e9,
        "host_copy_gbps": moved / host_s / 1e9,
        "pinned_gbps": pinned_gbps,
        "share": copy_gbps / pinned_gbps,
    }


def nonblocking_hazard(device: str | torch.device = "cuda", mb: int = 64) -> dict[str, float]:
    """Notebook 12, section 8: what ``non_blocking=True`` promises, and what pinning costs.

    A device-to-host copy with ``non_blocking=True`` returns before the data is there: read before
    ``torch.cuda.synchronize()``, the pinned destination still holds zeros (``wrong_before_sync``, the share of
    values not yet copied); after it, all values are right. And ``t.pin_memory().to(device)`` pins by copying, so
    for a pageable ``t`` it can be slower than a plain ``t.to(device)`` (pytorch/tutorials' ``pinmem_nonblock``)."""
    device_ = _require_cuda(device, "nonblocking_hazard")
    numel = check_int(mb, "mb", minimum=1) * 2**20 // 4
    on_gpu = torch.full((numel,), 7.0, device=device_)
    on_host = torch.zeros(numel, pin_memory=True)
    torch.cuda.synchronize(device_)
    _keep_busy(device_)  # work queued before the copy, as a training step would be
    on_host.copy_(on_gpu, non_blocking=True)  # returns at once: the copy waits its turn on the stream
    wrong_before = torch.count_nonzero(on_host != 7.0).item() / numel  # read too early
    torch.cuda.synchronize(device_)
    wrong_after = torch.count_nonzero(on_host != 7.0).item() / numel

    pageable = torch.rand(numel)
    plain_s = best_seconds(lambda: pageable.to(device_), device_)
    pin_then_copy_s = best_seconds(lambda: pageable.pin_memory().to(device_, non_blocking=True), device_)
    pinned = pageable.pin_memory()
    pinned_s = best_seconds(lambda: pinned.to(device_, non_blocking=True), device_)
    return {
        "wrong_before_sync": wrong_before,
        "wrong_after_sync": wrong_after,
        "pageable_ms": plain_s * 1e3,
        "pin_then_copy_ms": pin_then_copy_s * 1e3,
        "pinned_ms": pinned_s * 1e3,
        "pin_then_copy_vs_pageable": pin_then_copy_s / plain_s,
    }


def gpu_decode(jpeg_payloads: list[bytes], device: str | torch.device = "cuda") -> dict[str, Any]:
    """Notebook 12, section 8: decode JPEG bytes on the GPU (nvJPEG) and on the CPU (Pillow), in images/s.

    The GPU decoder is torchcodec's ``decode_jpeg(..., device="cuda")`` where torchcodec (0.16 or later) imports and
    works, else torchvision's ``decode_jpeg(..., device="cuda")``, whose image decoding torchvision 0.29 deprecates:
    ``deprecation`` is the warning it gave (None for torchcodec), and ``fallback`` says why torchcodec's was not used
    (None when it was)."""
    device_ = _require_cuda(device, "gpu_decode")
    if not jpeg_payloads or not all(isinstance(p, (bytes, bytearray)) for p in jpeg_payloads):
        raise ValueError(
            "jpeg_payloads must be a non-empty list of JPEG files' bytes (see course_lib.workers.jpeg_payloads)"
        )
    encoded = [torch.frombuffer(bytearray(p), dtype=torch.uint8) for p in jpeg_payloads]
    decoder, decode, deprecation, fallback = _nvjpeg_decoder(encoded[:4], device_)  # its first call loads nvJPEG
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # said once, above
        on_gpu = decode(encoded, device=device_)
        gpu_s = best_seconds(lambda: decode(encoded, device=device_), device_, repeat=3)
    on_cpu = [_pillow_decode(p) for p in jpeg_payloads]
    cpu_s = best_seconds(lambda: [_pillow_decode(p) for p in jpeg_payloads], None, repeat=3)
    if [tuple(i.shape) for i in on_gpu] != [tuple(i.shape) for i in on_cpu]:
        raise RuntimeError(
            f"{decoder} and Pillow disagree on the images' shapes: {tuple(on_gpu[0].shape)} vs "
            f"{tuple(on_cpu[0].shape)} for the first"
        )
    n = len(jpeg_payloads)
    return {
        "decoder": decoder,
        "deprecation": deprecation,
        "fallback": fallback,
        "gpu_images_per_s": n / gpu_s,
        "cpu_images_per_s": n / cpu_s,
    }


def _require_cuda(device: str | torch.device, what: str) -> torch.device:
    device_ = torch.device(device)
    if device_.type != "cuda" or not torch.cuda.is_available():
        raise NoGPUError(
            f"{what}() measures a CUDA GPU (device {str(device_)!r} asked for, torch.cuda.is_available() "
            f"is {torch.cuda.is_available()}); show() prints the figures recorded on one instead"
        )
    return device_


def best_seconds(fn: Callable[[], Any], device: torch.device | None, repeat: int = 5) -> float:
    """Best-of-``repeat`` seconds of ``fn()`` (:func:`course_lib.timing.seconds_per_call`, one call a round), each call
    waiting for the GPU (where ``device`` is one) to finish what it queued."""
    if device is None:
        return seconds_per_call(fn, repeat=repeat, min_seconds=0)
    torch.cuda.synchronize(device)  # nothing queued before counts
    return seconds_per_call(lambda: (fn(), torch.cuda.synchronize(device)), repeat=repeat, min_seconds=0)


def _keep_busy(device: torch.device, cycles: int = 100_000_000) -> None:
    """Queue tens of milliseconds of work on ``device``'s current stream, so that what is queued next waits."""
    sleep = getattr(torch.cuda, "_sleep", None)  # a spinning kernel; private, but in torch since 0.4
    if sleep is not None:
        sleep(cycles)
        return
    a = torch.rand(4096, 4096, device=device)
    for _ in range(20):
        a = a @ a


def _pillow_decode(payload: bytes) -> torch.Tensor:
    with Image.open(io.BytesIO(payload)) as img:
        return torch.from_numpy(np.array(img.convert("RGB"))).permute(2, 0, 1)


def _nvjpeg_decoder(
    sample: list[torch.Tensor], device: torch.device
) -> tuple[str, Callable[..., Any], str | None, str | None]:
    """(name, decode, deprecation warning, fallback): torchcodec's nvJPEG decoder where it imports and decodes ``sample``,
    else torchvision's, with ``fallback`` saying why (None when torchcodec's is used). ``decode(list of uint8 CPU
    tensors, device=...)`` returns a list of RGB CHW uint8 tensors on ``device``.

    Both take a list and decode it in one nvJPEG call: torchcodec's ``decode_jpeg(source | list of sources, *,
    mode="RGB", output_dtype=torch.uint8, device="cpu")`` (``torchcodec.decoders``, 0.16 and later; a list in, a
    list out), torchvision's ``decode_jpeg(input: Tensor | list[Tensor], mode=ImageReadMode.UNCHANGED, device="cpu",
    apply_exif_orientation=False)``."""
    try:
        import torchcodec
        from torchcodec.decoders import decode_jpeg as codec_decode_jpeg
    except ImportError as exc:
        fallback = f"torchcodec's decode_jpeg does not import ({exc}: not installed, or older than 0.16)"
    except (OSError, RuntimeError) as exc:
        fallback = f"torchcodec is installed but its native libraries do not load ({type(exc).__name__}: {exc})"
    else:

        def codec_decode(encoded: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
            return codec_decode_jpeg(encoded, mode="RGB", device=device)

        try:
            codec_decode(sample, device)
            torch.cuda.synchronize(device)
            return f"torchcodec {torchcodec.__version__} nvJPEG", codec_decode, None, None
        except Exception as exc:  # noqa: BLE001 - a torchcodec without nvJPEG support: torchvision's decoder instead
            fallback = f"torchcodec {torchcodec.__version__}'s decode_jpeg failed ({type(exc).__name__}: {exc})"
    from torchvision.io import ImageReadMode, decode_jpeg

    def vision_decode(encoded: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        return decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vision_decode(sample, device)
        torch.cuda.synchronize(device)
    said = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    return "torchvision.io.decode_jpeg(device='cuda')", vision_decode, (said[0] if said else None), fallback


# --------------------------------------------------------------------------- recordings made on a GPU


def _recorded(part: str, path: str | Path = RECORDINGS) -> dict[str, Any] | None:
    """Notebook 12, section 8: the recording of ``part`` (one of ``PARTS``), or None where it has not run on a GPU:
    ``{"figures": ..., "gpu": ..., "when": "YYYY-MM-DD", "versions": {"python", "torch", "torchvision", "cuda"}}``."""
    _check_part(part)
    return _read_recordings(path).get(part)


def _record(part: str, figures: dict[str, Any], path: str | Path = RECORDINGS) -> dict[str, Any]:
    """Notebook 12, section 8: store ``figures`` as the recording of ``part``, with this GPU's name, today's date and
    the versions; the file is rewritten atomically (a reader sees the old recordings or the new)."""
    _check_part(part)
    if not isinstance(figures, dict):
        raise TypeError(f"figures must be a dict of what was measured, got {type(figures).__name__}")
    import torchvision

    entry = {
        "figures": figures,
        "gpu": torch.cuda.get_device_name(),
        "when": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "cuda": torch.version.cuda or (f"HIP {torch.version.hip}" if torch.version.hip else "none"),
        },
    }
    recordings = _read_recordings(path)
    recordings[part] = _check_entry(part, entry, path)
    write_atomic(path, json.dumps(recordings, indent=1, sort_keys=True) + "\n")
    return entry


def show(
    part: str,
    run: Callable[[], dict[str, Any]],
    describe: Callable[[dict[str, Any]], str] | None = None,
    path: str | Path = RECORDINGS,
) -> dict[str, Any] | None:
    """Notebook 12, section 8: with a CUDA GPU, ``run()`` and print ``describe(figures)``; without one, print the
    recording of ``part``, labelled with the GPU, date and versions it was made with (or say there is none).
    ``describe`` defaults to this module's sentence for ``part``. Returns the figures, or None."""
    _check_part(part)
    describe = describe or _DESCRIBE[part]
    if torch.cuda.is_available():
        figures = run()
        print(describe(figures))
        return figures
    entry = _recorded(part, path)
    if entry is None:
        print(f"{part}: this part has not run on a GPU yet (this machine has no GPU)")
        return None
    versions = entry["versions"]
    print(
        f"recorded on {entry['gpu']}, {entry['when']}, torch {versions['torch']}, CUDA {versions['cuda']} "
        f"(this machine has no GPU): {describe(entry['figures'])}"
    )
    return entry["figures"]


def _show_all(path: str | Path = RECORDINGS) -> dict[str, dict[str, Any] | None]:
    """Notebook 12, section 8: :func:`show` each part, in order: the copy stage, ``non_blocking``, GPU decoding;
    run here where there is a CUDA GPU, else as recorded. Returns the figures by part (None where there are none)."""
    return {part: show(part, run, path=path) for part, run in _RUNS.items()}


def _describe_copy_stage(f: dict[str, Any]) -> str:
    out = (
        f"the Prefetcher's copy stage, DMA alone from pinned batches, moved {f['copy_gbps']:.1f} GB/s into device "
        f"memory, {f['share']:.2f}× the pinned host-to-device bandwidth measured beside it ({f['pinned_gbps']:.1f} GB/s)"
    )
    if "with_host_copy_gbps" in f:  # recordings made before the two paths were measured apart have only the first
        out += (
            f"; with a host copy into its pinned slots first, {f['with_host_copy_gbps']:.1f} GB/s; "
            f"that host copy alone, {f['host_copy_gbps']:.1f} GB/s"
        )
    return out


def _describe_non_blocking(f: dict[str, Any]) -> str:
    return (
        f"read before torch.cuda.synchronize(), {f['wrong_before_sync']:.0%} of the non_blocking copy's values "
        f"were not there yet; after it, {f['wrong_after_sync']:.0%}. t.pin_memory().to(device) took "
        f"{f['pin_then_copy_vs_pageable']:.2f}× the time of a plain t.to(device) from pageable memory"
    )


def _describe_gpu_decode(f: dict[str, Any]) -> str:
    ratio = f["gpu_images_per_s"] / f["cpu_images_per_s"]
    fell_back = f" (fell back from torchcodec: {f['fallback']})" if f.get("fallback") else ""
    said = f"; it warns: {f['deprecation']}" if f.get("deprecation") else ""
    return (
        f"{f['decoder']}{fell_back}: {f['gpu_images_per_s']:.0f} images/s, Pillow on one CPU core "
        f"{f['cpu_images_per_s']:.0f} images/s ({ratio:.1f}×){said}"
    )


_DESCRIBE: dict[str, Callable[[dict[str, Any]], str]] = {
    "copy stage": _describe_copy_stage,
    "non_blocking": _describe_non_blocking,
    "gpu decode": _describe_gpu_decode,
}
_RUNS: dict[str, Callable[[], dict[str, Any]]] = {  # each part with its defaults, as _show_all() and main() run it
    "copy stage": copy_stage,
    "non_blocking": nonblocking_hazard,
    "gpu decode": lambda: gpu_decode(jpeg_payloads(n=64, side=256, distinct=64)),
}


def _check_part(part: str) -> None:
    if part not in PARTS:
        raise ValueError(f"part must be one of {', '.join(map(repr, PARTS))}; got {part!r}")


def _read_recordings(path: str | Path) -> dict[str, Any]:
    """The recordings in ``path``, each checked; {} where the file does not exist."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return {}
    try:
        recordings = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}): restore it (git checkout) or record it again") from None
    if not isinstance(recordings, dict):
        raise ValueError(f"{path} should hold a JSON object of recordings by part, got {type(recordings).__name__}")
    for part, entry in recordings.items():
        _check_part(part)
        _check_entry(part, entry, path)
    return recordings


def _check_entry(part: str, entry: Any, path: str | Path) -> dict[str, Any]:
    """``entry`` if it is a whole recording (figures, gpu, an ISO date, the four versions); else a ValueError."""
    where = f"{path}, recording {part!r}"
    if not isinstance(entry, dict) or set(entry) != {"figures", "gpu", "when", "versions"}:
        found = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise ValueError(f"{where}: a recording has exactly figures, gpu, when and versions; found {found}")
    if not isinstance(entry["figures"], dict) or not entry["figures"]:
        raise ValueError(f"{where}: figures should be a non-empty object of what was measured")
    if not isinstance(entry["gpu"], str) or not entry["gpu"].strip():
        raise ValueError(f"{where}: gpu should name the GPU it ran on, got {entry['gpu']!r}")
    try:
        datetime.date.fromisoformat(entry["when"])
    except (TypeError, ValueError):
        raise ValueError(f"{where}: when should be an ISO date (YYYY-MM-DD), got {entry['when']!r}") from None
    versions = entry["versions"]
    if (
        not isinstance(versions, dict)
        or set(versions) != set(_VERSION_KEYS)
        or not all(isinstance(versions[k], str) and versions[k] for k in _VERSION_KEYS)
    ):
        raise ValueError(
            f"{where}: versions should give {', '.join(_VERSION_KEYS)}, each a version string; got {versions!r}"
        )
    return entry


# --------------------------------------------------------------------------- recording on a GPU machine


def main(argv: list[str] | None = None) -> int:
    """Run the three parts on this machine's GPU and print them; with ``--record``, store them as recordings."""
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.gpu_feed",
        description="Notebook 12, section 8's GPU parts, run and recorded on a CUDA GPU.",
    )
    parser.add_argument(
        "--record",
        metavar="OUT.json",
        nargs="?",
        const=str(RECORDINGS),
        default=None,
        help=f"write the figures as recordings to OUT.json (default: {RECORDINGS})",
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "python -m course_lib.gpu_feed: no CUDA GPU here (torch.cuda.is_available() is False); run it "
            "on a machine with one: nothing was measured or recorded",
            file=sys.stderr,
        )
        return 1
    failed = False
    print(f"on {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}:")
    for part, run in _RUNS.items():
        try:
            figures = run()
        except Exception as exc:  # noqa: BLE001 - a failing part is reported, the others still run
            print(f"  {part}: FAILED, {type(exc).__name__}: {exc}", file=sys.stderr)
            failed = True
            continue
        print(f"  {part}: {_DESCRIBE[part](figures)}")
        if args.record:
            _record(part, figures, args.record)
    if args.record:
        print(f"recordings written to {args.record}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
