"""course_tools.gpu: the GPU checklist runs everywhere, says "not run" without a GPU, and fails on a GPU error."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from course_tools import gpu

pytestmark = pytest.mark.quick


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "course_lib", "gpu", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the checklist runs for real below")
def test_without_a_gpu_every_item_is_not_run() -> None:
    done = run("--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["device"] == "no CUDA GPU"
    assert [i["name"] for i in result["items"]] == [
        "pinned copy",
        "loader to device",
        "copy stage",
        "nccl",
        "jpeg decode",
        "dali",
    ]
    assert {i["status"] for i in result["items"]} == {gpu.NOT_RUN}
    assert gpu.main(["--require-gpu"]) == 1  # a GPU machine's CI asks for --require-gpu: no silent pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.timeout(300)
def test_on_a_gpu_every_item_runs() -> None:
    items = gpu.run_checklist(mb=32)
    assert not [i for i in items if i.status == gpu.FAILED], gpu.report(items, "this GPU")
    assert items[0].figures["pinned_gbps"] > 0 and items[1].figures["gbps"] > 0
    assert items[2].name == "copy stage" and items[2].figures["share"] > 0


def test_a_failing_item_is_reported_and_fails_the_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = [gpu.Item("pinned copy", gpu.RUN, "fine", {}), gpu.Item("nccl", gpu.FAILED, "RuntimeError: no NCCL", {})]
    monkeypatch.setattr(gpu, "run_checklist", lambda mb: broken)
    assert gpu.main([]) == 1
    out = capsys.readouterr().out
    assert "[FAILED ]  nccl         RuntimeError: no NCCL" in out and "[  ok   ]  pinned copy  fine" in out


def test_bad_arguments() -> None:
    with pytest.raises(SystemExit):
        gpu.main(["--mb", "0"])
