"""The GitHub workflow (.github/workflows/ci.yml) is valid by GitHub's own schema, as check-jsonschema vendors it,
and runs the repository's commands: the quick tier on a push, the touched notebooks on a pull request, .ci/run
nightly and before a release."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    checker = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or "check-jsonschema"
    return subprocess.run(
        [checker, "--builtin-schema", "vendor.github-workflows", str(path)], capture_output=True, text=True, timeout=60
    )


def test_the_workflow_is_valid() -> None:
    result = validate(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_validator_can_fail(tmp_path: Path) -> None:
    broken = tmp_path / "ci.yml"
    broken.write_text(WORKFLOW.read_text().replace("runs-on: ubuntu-latest", "runs_on: ubuntu-latest", 1))
    result = validate(broken)
    assert result.returncode == 1 and "runs_on" in result.stdout + result.stderr


def test_the_workflow_runs_the_repositorys_commands() -> None:
    import yaml

    workflow = yaml.safe_load(WORKFLOW.read_text())
    runs = {name: "\n".join(step.get("run", "") for step in job["steps"]) for name, job in workflow["jobs"].items()}
    assert "pytest -m quick" in runs["quick"] and "pip install -r requirements.txt" in runs["quick"]
    assert "python -m course_lib changed --base" in runs["notebooks"] and "xargs pytest" in runs["notebooks"]
    assert "bash .ci/run" in runs["full"]
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as True
    assert {"push", "pull_request", "schedule", "release"} <= set(triggers)
