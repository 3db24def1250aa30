"""course_lib.gpu_feed: the Prefetcher's loop on a CPU (order, look-ahead, reused slots, the stream and event
protocol), the recordings and show() in its three outcomes, and on a CUDA GPU the parts themselves.

Quick but for the command run in a fresh interpreter (about 2 s of imports) and the GPU measurements."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from course_lib import gpu_feed
from course_lib.workers import jpeg_payloads
from course_lib.gpu_feed import (
    PARTS,
    RECORDINGS,
    NoGPUError,
    Prefetcher,
    copy_stage,
    gpu_decode,
    nonblocking_hazard,
    _record,
    _recorded,
    show,
)

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def batches(n: int, rows: int = 4, last_rows: int | None = None) -> list[torch.Tensor]:
    """``n`` distinct batches of ``rows`` x 3 values (the last one ``last_rows`` long, where given)."""
    out = [torch.arange(i * rows * 3, (i + 1) * rows * 3, dtype=torch.float32).reshape(rows, 3) for i in range(n)]
    if last_rows is not None:
        out[-1] = out[-1][:last_rows].clone()
    return out


# --------------------------------------------------------------------------- the Prefetcher, on a CPU


@pytest.mark.quick
@pytest.mark.parametrize("slots", [1, 2, 3])
def test_batches_come_out_in_order_intact_each_once(slots: int) -> None:
    source = batches(7)
    prefetcher = Prefetcher(source, "cpu", slots=slots)
    out = list(prefetcher)  # kept all at once: none of them is a reused buffer
    assert len(out) == 7 and all(torch.equal(a, b) for a, b in zip(out, source))
    assert prefetcher.pulled == prefetcher.yielded == 7
    host = {s.data_ptr() for s in prefetcher.host_slots}
    assert not host & {b.data_ptr() for b in out}  # a yielded batch is a copy, never a host slot
    assert all(not s.is_pinned() for s in prefetcher.host_slots)  # no pinned memory without CUDA


@pytest.mark.quick
def test_the_source_runs_one_batch_ahead_and_slots_are_reused() -> None:
    source = batches(6)
    pulled: list[int] = []

    def counting() -> Iterator[torch.Tensor]:
        for i, b in enumerate(source):
            pulled.append(i)
            yield b

    prefetcher = Prefetcher(counting(), "cpu", slots=2)
    slot_pointers = set()
    for n, batch in enumerate(prefetcher):
        assert torch.equal(batch, source[n])
        assert len(pulled) == min(n + 2, 6)  # batch n+1 was taken (and its copy started) before n was handed on
        if n + 1 < 6:  # ... and sits in its slot, (n+1) % 2
            assert torch.equal(prefetcher.host_slots[(n + 1) % 2], source[n + 1])
        slot_pointers |= {s.data_ptr() for s in prefetcher.host_slots}
    assert len(prefetcher.host_slots) == 2 and len(slot_pointers) == 2  # allocated once, reused for all six


@pytest.mark.quick
def test_a_short_last_batch_and_an_empty_source() -> None:
    source = batches(3, rows=5, last_rows=2)
    out = list(Prefetcher(source, "cpu"))
    assert [tuple(b.shape) for b in out] == [(5, 3), (5, 3), (2, 3)]
    assert all(torch.equal(a, b) for a, b in zip(out, source))
    empty = Prefetcher([], "cpu")
    assert list(empty) == [] and empty.host_slots == [] and empty.pulled == 0
    again = Prefetcher(source, "cpu")  # a list can be iterated again: same slots, same batches
    first, second = list(again), list(again)
    assert all(torch.equal(a, b) for a, b in zip(first, second)) and len(again.host_slots) == 2


class _Log:
    """A stand-in for ``torch.cuda`` that logs every stream and event call the Prefetcher makes."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        log = self.calls

        class Stream:
            def __init__(self, device: Any = None, name: str = "side") -> None:
                self.name = name

            def wait_stream(self, other: Any) -> None:
                log.append(f"{self.name} waits for {other.name}")

        class Event:
            count = 0

            def __init__(self) -> None:
                self.name = f"event {Event.count}"
                Event.count += 1

            def record(self, stream: Any = None) -> None:
                log.append(f"{self.name} recorded on {stream.name}")

            def synchronize(self) -> None:
                log.append(f"{self.name} synchronized")

        class Context:
            def __enter__(self) -> None:
                log.append("on side")

            def __exit__(self, *exc: Any) -> None:
                pass

        self.Stream, self.Event = Stream, Event
        self.current_stream = lambda device=None: Stream(device, "consumer")
        self.stream = lambda stream: Context()


@pytest.mark.quick
def test_the_stream_and_event_protocol() -> None:
    """What the CUDA path does, in order: a slot is overwritten only after its last copy's event; the consumer waits
    for the side stream before a batch is handed on, and before the next copy is queued (no waiting for n+1)."""
    prefetcher = Prefetcher(batches(3), "cpu", slots=2)
    prefetcher.cuda = log = _Log()
    for n, _ in enumerate(prefetcher):
        log.calls.append(f"batch {n} handed on")
    copy = lambda k: [f"event {k} synchronized", "on side", f"event {k} recorded on side"]
    assert log.calls == [
        *copy(0),  # batch 0 into slot 0, its copy started
        "consumer waits for side",
        *copy(1),
        "batch 0 handed on",
        "consumer waits for side",
        *copy(0),
        "batch 1 handed on",  # slot 0 again: after batch 0's copy finished
        "consumer waits for side",
        "batch 2 handed on",
    ]


@pytest.mark.quick
def test_bad_inputs_get_clear_errors() -> None:
    with pytest.raises(ValueError, match="slots"):
        Prefetcher([], "cpu", slots=0)
    with pytest.raises(ValueError, match="feeds a CUDA GPU"):
        Prefetcher([], "meta")
    with pytest.raises(ValueError, match="must name a torch device"):
        Prefetcher([], "gpu")
    with pytest.raises(TypeError, match="a batch is a torch.Tensor"):
        list(Prefetcher([[1, 2, 3]], "cpu"))
    with pytest.raises(ValueError, match="0-d"):
        list(Prefetcher([torch.tensor(1.0)], "cpu"))
    with pytest.raises(ValueError, match="only the last one may have fewer rows"):
        list(Prefetcher([torch.zeros(2, 3), torch.zeros(4, 3)], "cpu"))
    with pytest.raises(ValueError, match="first one's dtype"):
        list(Prefetcher([torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.float64)], "cpu"))


@pytest.mark.quick
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_the_gpu_parts_say_so() -> None:
    with pytest.raises(NoGPUError, match="no CUDA GPU"):
        Prefetcher([], "cuda")
    for part in (copy_stage, nonblocking_hazard, lambda: gpu_decode(jpeg_payloads(n=2, side=16))):
        with pytest.raises(NoGPUError, match="measures a CUDA GPU"):
            part()


@pytest.mark.quick
def test_the_cpu_reference_decodes_the_course_jpegs() -> None:
    payloads = jpeg_payloads(n=3, side=32, distinct=3)
    assert len(set(payloads)) == 3 and all(p[:2] == b"\xff\xd8" for p in payloads)  # JPEG's start-of-image marker
    assert tuple(gpu_feed._pillow_decode(payloads[0]).shape) == (3, 32, 32)


# --------------------------------------------------------------------------- recordings and show()

FIGURES = {  # made up, for the tests only: the shipped file holds real recordings or none
    "copy stage": {"copy_gbps": 20.0, "pinned_gbps": 25.0, "share": 0.8},
    "non_blocking": {
        "wrong_before_sync": 1.0,
        "wrong_after_sync": 0.0,
        "pageable_ms": 5.0,
        "pin_then_copy_ms": 7.5,
        "pinned_ms": 2.5,
        "pin_then_copy_vs_pageable": 1.5,
    },
    "gpu decode": {
        "decoder": "torchvision.io.decode_jpeg(device='cuda')",
        "deprecation": "deprecated since 0.29",
        "gpu_images_per_s": 6000.0,
        "cpu_images_per_s": 1000.0,
    },
}


@pytest.fixture()
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchvision  # noqa: F401 - imported before the fake CUDA version, which its import would check

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU 80GB")
    monkeypatch.setattr(torch.version, "cuda", "12.8")


@pytest.mark.quick
def test_record_writes_the_documented_format(tmp_path: Path, fake_gpu: None) -> None:
    path = tmp_path / "recordings.json"
    for part in PARTS:
        _record(part, FIGURES[part], path)
    stored = json.loads(path.read_text())
    assert set(stored) == set(PARTS)
    entry = stored["copy stage"]
    assert entry["figures"] == FIGURES["copy stage"] and entry["gpu"] == "Test GPU 80GB"
    assert len(entry["when"]) == 10 and entry["when"][4] == "-"  # YYYY-MM-DD
    assert set(entry["versions"]) == {"python", "torch", "torchvision", "cuda"}
    assert entry["versions"]["cuda"] == "12.8" and entry["versions"]["torch"] == torch.__version__
    assert _recorded("gpu decode", path) == stored["gpu decode"]
    assert [p.name for p in tmp_path.iterdir()] == ["recordings.json"]  # no temporary file left behind
    with pytest.raises(ValueError, match="part must be one of"):
        _record("pinned copy", {}, path)


@pytest.mark.quick
def test_broken_recordings_are_refused(tmp_path: Path, fake_gpu: None) -> None:
    path = tmp_path / "recordings.json"
    _record("copy stage", FIGURES["copy stage"], path)
    good = json.loads(path.read_text())
    for broken, match in [
        ({"copy stage": {k: v for k, v in good["copy stage"].items() if k != "versions"}}, "exactly figures"),
        ({"copy stage": {**good["copy stage"], "gpu": ""}}, "gpu should name"),
        ({"copy stage": {**good["copy stage"], "when": "yesterday"}}, "ISO date"),
        ({"copy stage": {**good["copy stage"], "versions": {"torch": "2.9"}}}, "versions should give"),
        ({"other part": good["copy stage"]}, "part must be one of"),
        ([], "JSON object"),
    ]:
        path.write_text(json.dumps(broken))
        with pytest.raises(ValueError, match=match):
            _recorded("copy stage", path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        _recorded("copy stage", path)
    assert _recorded("copy stage", tmp_path / "absent.json") is None


@pytest.mark.quick
def test_the_shipped_recordings_are_valid() -> None:
    """Every recording shipped with the course has its figures, GPU, date and versions (none shipped is valid too)."""
    shipped = json.loads(RECORDINGS.read_text())
    assert isinstance(shipped, dict) and set(shipped) <= set(PARTS)
    for part in shipped:
        assert _recorded(part) == shipped[part]  # _recorded() checks each entry, and raises on a broken one
        assert set(shipped[part]) == {"figures", "gpu", "when", "versions"}
        gpu_feed._DESCRIBE[part](shipped[part]["figures"])  # the figures the sentence needs are all there


@pytest.mark.quick
def test_show_with_a_gpu_runs_the_part(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    figures = show("copy stage", lambda: FIGURES["copy stage"], lambda f: f"share {f['share']}", tmp_path / "r.json")
    assert figures == FIGURES["copy stage"] and capsys.readouterr().out == "share 0.8\n"


@pytest.mark.quick
def test_show_without_a_gpu_prints_the_recording_labelled(
    monkeypatch: pytest.MonkeyPatch, fake_gpu: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "recordings.json"
    for part in PARTS:
        _record(part, FIGURES[part], path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ran = []
    figures = show("copy stage", lambda: ran.append(1) or {}, lambda f: f"share {f['share']}", path)
    out = capsys.readouterr().out
    assert not ran and figures == FIGURES["copy stage"]
    when = _recorded("copy stage", path)["when"]  # type: ignore[index]
    assert (
        out
        == f"recorded on Test GPU 80GB, {when}, torch {torch.__version__}, CUDA 12.8 (this machine has no GPU): share 0.8\n"
    )
    for part in PARTS:  # the module's own sentences
        assert show(part, dict, path=path) == FIGURES[part]
    out = capsys.readouterr().out
    assert "0.80× the pinned" in out and "100% of the non_blocking copy's values" in out and "1.50× the time" in out
    assert "(6.0×); it warns: deprecated since 0.29" in out


@pytest.mark.quick
def test_show_without_a_gpu_or_a_recording_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = tmp_path / "recordings.json"
    path.write_text("{}\n")
    assert show("gpu decode", dict, path=path) is None
    assert capsys.readouterr().out == "gpu decode: this part has not run on a GPU yet (this machine has no GPU)\n"
    with pytest.raises(ValueError, match="part must be one of"):
        show("decode", dict, path=path)
    assert gpu_feed._show_all(path) == {part: None for part in PARTS}  # notebook 12's cell, on a machine like CI's
    assert capsys.readouterr().out.splitlines() == [
        f"{part}: this part has not run on a GPU yet (this machine has no GPU)" for part in PARTS
    ]


@pytest.mark.quick
def test_main_without_a_gpu_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out.json"
    assert gpu_feed.main(["--record", str(out)]) == 1
    assert "no CUDA GPU here" in capsys.readouterr().err and not out.exists()


@pytest.mark.full
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_the_command_without_a_gpu_exits_1(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "course_lib.gpu_feed", "--record", str(tmp_path / "o.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "no CUDA GPU here" in done.stderr and not (tmp_path / "o.json").exists()


# --------------------------------------------------------------------------- on a CUDA GPU


@pytest.mark.quick
@needs_gpu
def test_on_a_gpu_the_prefetcher_delivers_intact_batches_from_pinned_slots() -> None:
    source = [torch.rand(64, 1024) for _ in range(9)] + [torch.rand(10, 1024)]
    prefetcher = Prefetcher(source, "cuda")
    out = []
    for batch in prefetcher:
        assert batch.is_cuda
        out.append(batch.clone())
        batch.mul_(0)  # the consumer may write into its batch: the next ones are not affected
    torch.cuda.synchronize()
    assert all(torch.equal(a.cpu(), b) for a, b in zip(out, source)) and len(out) == 10
    assert all(s.is_pinned() for s in prefetcher.host_slots) and len(prefetcher.host_slots) == 2


@pytest.mark.full
@needs_gpu
@pytest.mark.timeout(300)
def test_on_a_gpu_the_parts_measure(tmp_path: Path) -> None:
    copy = copy_stage(batch_mb=8, batches=8)
    assert copy["copy_gbps"] > 0 and copy["pinned_gbps"] > 0 and copy["share"] > 0
    hazard = nonblocking_hazard(mb=16)
    assert hazard["wrong_after_sync"] == 0 and hazard["wrong_before_sync"] > 0
    decode = gpu_decode(jpeg_payloads(n=16, side=128, distinct=16))
    assert decode["gpu_images_per_s"] > 0 and decode["cpu_images_per_s"] > 0
    if decode["decoder"].startswith("torchvision"):
        assert decode["deprecation"] is None or "deprecated" in decode["deprecation"]
    entry = _record("copy stage", copy, tmp_path / "r.json")
    assert entry["gpu"] == torch.cuda.get_device_name() and _recorded("copy stage", tmp_path / "r.json") == entry


# --------------------------------------------------------------------------- the DMA path and the decoder's fallback, on a fake device


@pytest.mark.quick
def test_pinned_batches_skip_the_host_copy_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """copy_pinned=False: a pinned batch goes to the device from where it is (no slot, no host copy), and the source is
    asked for the next batch only once that copy's event has been waited on."""
    monkeypatch.setattr(gpu_feed, "_is_pinned", lambda batch: True)  # CPU tensors pass for pinned ones here
    source = batches(3)
    prefetcher = Prefetcher(source, "cpu", slots=2, copy_pinned=False)
    prefetcher.cuda = log = _Log()
    out = []
    for n, batch in enumerate(prefetcher):
        log.calls.append(f"batch {n} handed on")
        out.append(batch)
    assert all(torch.equal(a, b) and a.data_ptr() != b.data_ptr() for a, b in zip(out, source))
    assert prefetcher.host_slots == [] and prefetcher.direct == prefetcher.pulled == 3  # no slot: no host copy
    direct = lambda k: ["on side", f"event {k} recorded on side"]
    first = int(log.calls[1].split()[1])  # event numbers are counted across tests
    assert log.calls == [
        *direct(first),
        "consumer waits for side",
        f"event {first} synchronized",  # batch 0's buffer is free before the source is asked for batch 1
        *direct(first + 1),
        "batch 0 handed on",
        "consumer waits for side",
        f"event {first + 1} synchronized",
        *direct(first + 2),
        "batch 1 handed on",
        "consumer waits for side",
        f"event {first + 2} synchronized",
        "batch 2 handed on",
    ]
    monkeypatch.setattr(gpu_feed, "_is_pinned", lambda batch: False)  # pageable batches still go through the slots
    unpinned = Prefetcher(source, "cpu", copy_pinned=False)
    assert all(torch.equal(a, b) for a, b in zip(unpinned, source)) and unpinned.direct == 0
    assert len(unpinned.host_slots) == 2


@pytest.fixture()
def fake_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU parts run on the CPU: no CUDA check, no synchronisation, no pinning."""
    monkeypatch.setattr(gpu_feed, "_require_cuda", lambda device, what: torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(gpu_feed, "_pinned", lambda t: t.clone())
    monkeypatch.setattr(gpu_feed, "_is_pinned", lambda batch: True)


@pytest.mark.quick
def test_copy_stage_measures_the_dma_path_and_the_host_copy_apart(fake_cuda_device: None) -> None:
    figures = copy_stage(batch_mb=1, batches=4, device="cuda")
    assert set(figures) == {"copy_gbps", "with_host_copy_gbps", "host_copy_gbps", "pinned_gbps", "share"}
    assert all(v > 0 for v in figures.values())
    assert figures["share"] == pytest.approx(figures["copy_gbps"] / figures["pinned_gbps"])
    said = gpu_feed._DESCRIBE["copy stage"](figures)
    assert "DMA alone" in said and "host copy into its pinned slots first" in said and "host copy alone" in said
    old = {k: figures[k] for k in ("copy_gbps", "pinned_gbps", "share")}  # a recording of the single figure
    assert "host copy" not in gpu_feed._DESCRIBE["copy stage"](old)


def _fake_torchcodec(monkeypatch: pytest.MonkeyPatch, decode: Any) -> list[tuple[Any, dict[str, Any]]]:
    import types

    calls: list[tuple[Any, dict[str, Any]]] = []

    def decode_jpeg(source: Any, **kwargs: Any) -> Any:
        calls.append((source, kwargs))
        return decode(source, **kwargs)

    package = types.ModuleType("torchcodec")
    package.__version__ = "0.17.0"  # type: ignore[attr-defined]
    decoders = types.ModuleType("torchcodec.decoders")
    decoders.decode_jpeg = decode_jpeg  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchcodec", package)
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", decoders)
    return calls


@pytest.mark.quick
def test_gpu_decode_passes_torchcodec_a_list_and_says_when_it_fell_back(
    monkeypatch: pytest.MonkeyPatch, fake_cuda_device: None
) -> None:
    from torchvision.io import decode_jpeg

    payloads = jpeg_payloads(n=3, side=32, distinct=3)
    calls = _fake_torchcodec(monkeypatch, lambda source, device, mode: decode_jpeg(source, device=device))
    figures = gpu_decode(payloads, device="cuda")
    assert figures["decoder"] == "torchcodec 0.17.0 nvJPEG" and figures["fallback"] is None
    source, kwargs = calls[0]
    assert isinstance(source, list) and kwargs == {"mode": "RGB", "device": torch.device("cpu")}  # one call, a list

    def broken(source: Any, **kwargs: Any) -> Any:
        raise RuntimeError("this build has no nvJPEG")

    _fake_torchcodec(monkeypatch, broken)
    figures = gpu_decode(payloads, device="cuda")  # torchvision's decoder, on the CPU here
    assert figures["decoder"].startswith("torchvision") and "no nvJPEG" in figures["fallback"]
    assert "(fell back from torchcodec: torchcodec 0.17.0's decode_jpeg failed" in gpu_feed._DESCRIBE["gpu decode"](
        figures
    )
    monkeypatch.setitem(sys.modules, "torchcodec", None)  # not installed
    figures = gpu_decode(payloads, device="cuda")
    assert "does not import" in figures["fallback"] and figures["gpu_images_per_s"] > 0
