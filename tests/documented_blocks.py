"""The shell and Python blocks of the course's documents, and how each is run: for tests/test_documents.py and the
Slurm stage (tests/test_slurm.py), which runs hpc/README.md's against its cluster.

Every shell and Python block of the course's documents runs, as written, in a scratch copy of the course.

The documents are README.md (learners), INSTRUCTORS.md (instructors and admins), CONTRIBUTING.md (maintainers),
hpc/README.md, slides/README.md and binder/README.md. A block is named by its document and its first line. Each one
is, by the tables below:

* run here (the default), by ``bash -e`` or ``python`` in a scratch copy of the course (what ``git ls-files``
  holds, with ``.venv`` pointing at this environment, a private ``HOME`` and ``TMPDIR``, and a ``git`` remote on
  GitHub), after :data:`STAND_INS` replaced what cannot be here (a cluster's ``/shared`` folder, a notebook number
  ``NN``, a notebook re-executed for 15 minutes);
* run by another test that reads the same block from the document (:data:`ELSEWHERE`: that test is named, and it
  must exist and read that document);
* or not run, for the reason given (:data:`NOT_RUN`): at most a quarter of the blocks.

A block that is none of these, or an entry that names no block, fails the tests; so does a block that fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", "INSTRUCTORS.md", "CONTRIBUTING.md", "hpc/README.md", "slides/README.md", "binder/README.md")
LANGUAGES = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python"}


@dataclass(frozen=True)
class Block:
    document: str
    language: str  # "bash" or "python"
    code: str

    @property
    def name(self) -> str:
        return f"{self.document}: {self.code.strip().splitlines()[0]}"


def blocks() -> list[Block]:
    found = []
    for document in DOCUMENTS:
        text = (ROOT / document).read_text()
        for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
            if m[1] in LANGUAGES and m[2].strip():
                found.append(Block(document, LANGUAGES[m[1]], m[2]))
    return found


def key(name: str) -> str:
    """A block's name up to its first comment: entries below are matched by it."""
    return name.split("  #", 1)[0].rstrip()


#: Blocks run by a test that reads them from their document: block -> that test.
_SLURM = (
    "tests/test_slurm.py::test_hpc_readme_blocks_run_on_the_test_cluster (the Slurm stage, on its one-host cluster: "
    "Slurm checks each sbatch request, sized for this machine; the stage's jobs run the same scripts)"
)
ELSEWHERE = {
    "hpc/README.md: sbatch hpc/train_1node.sbatch": _SLURM,
    "hpc/README.md: GPUS_PER_NODE=4 sbatch -A myproject -p cpu --gres=none -c 16 hpc/train_1node.sbatch": _SLURM,
    "hpc/README.md: from course_lib.distributed import read_reports": _SLURM,
    "hpc/README.md: hpc/class_sbatch hpc/train_1node.sbatch": _SLURM,
    'hpc/README.md: scontrol show reservation "$CLASS_RESERVATION"': _SLURM,
    "README.md: # 1. install everything and open the course on the first notebook": (
        "tests/test_packaging.py::test_ci_runs_the_readme_commands (.ci/run runs command 1's install and `pytest`, "
        "as written) and tests/test_jupyterlab.py (runs command 1's `jupyter lab ...`, read from README.md)"
    ),
}

#: Blocks not run, and why.
NOT_RUN = {
    "INSTRUCTORS.md: sudo git clone https://github.com/you/pytorch-data-course /opt/pytorch-data-course/course": (
        "installs the course system-wide on a hub host (root, /opt, a 7 GB pip install): tests/jupyterhub_stage.py "
        "does the same steps in a sandbox"
    ),
    "INSTRUCTORS.md: salloc --cpus-per-task=4 --time=03:00:00": (
        "an interactive allocation on a real cluster, a JupyterLab that never returns and an SSH tunnel from a laptop"
    ),
    "hpc/README.md: cd pytorch-data-course": (
        "a fresh venv with a 7 GB pip install on a login node: .ci/run does the same install"
    ),
    "CONTRIBUTING.md: pytest -m quick": (
        "the test suite itself, which a test cannot run without running itself: .ci/run runs `pytest` as written "
        "(tests/test_packaging.py checks it), and the quick tier is its part marked quick (tests/test_tiers.py)"
    ),
    "hpc/README.md: job=$(sbatch --parsable -A myproject -p gpu hpc/train_resumable.sbatch)": (
        "waits minutes for a real job's checkpoint, its notice and its requeue: "
        "tests/test_slurm.py::test_resumable_job_is_requeued_and_resumes_exactly does these steps on its cluster"
    ),
    "binder/README.md: repo2docker --no-run --image-name pytorch-data-course .": (
        "needs Docker and the network; mybinder.org builds the image"
    ),
}

#: Replacements that make a block runnable here: block -> [(old, new)], applied to its text in order.
#: ``{data}`` is the scratch copy's prepared data folder, ``{out}`` a scratch folder.
STAND_INS = {
    "INSTRUCTORS.md: python -m course_lib prepare --all --root /shared/course-data": [
        ("/shared/course-data", "{data}")
    ],
    "INSTRUCTORS.md: python -m course_lib bench loader": [
        ("bench loader                  #", "bench loader --size tiny --rounds 1 --workers 0 1  #"),
        (
            "--data /data/imagenet --limit 5000 --workers 0 2 4 8",
            "--data {data}/shapes-small-seed0 --limit 64 --rounds 1 --workers 0 1",
        ),
    ],
    "CONTRIBUTING.md: python -m course_lib authoring build": [
        ("authoring build              #", "authoring build --no-execute #"),
        ("authoring build 02           #", "authoring build 02 --no-execute #"),
    ],
    "CONTRIBUTING.md: python -m course_lib authoring renumber --insert NN --dry-run": [("NN", "14")],
    "slides/README.md: python -m course_lib slides build": [("/media/usb/decks", "{out}/decks")],
}

#: Code run before and after a block (a Python block that is a fragment of something larger): block -> (before, after).
AROUND = {
    'INSTRUCTORS.md: c.Spawner.cmd = ["/opt/pytorch-data-course/venv/bin/jupyterhub-singleuser"]': (
        "from traitlets.config import Config\nc = Config()  # what jupyterhub_config.py is given\n",
        "from jupyterhub.spawner import Spawner\n"
        "for name, value in c.Spawner.items():  # every setting is a real Spawner trait, and valid\n"
        "    Spawner.class_traits()[name].validate(Spawner(), value)\n",
    ),
}

#: How long each block may take (seconds); the default is 120.
TIMEOUTS: dict[str, float] = {}


def entry(table: dict, block: Block):
    """The block's entry in one of the tables above, or None."""
    return next((v for k, v in table.items() if key(k) == key(block.name)), None)
