"""The checks of notebook 11: right answers pass, stubs are 'not attempted', wrong ones get a specific hint."""

from __future__ import annotations

import ast
import tempfile
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from course_lib import alternatives as alt
from course_lib import data
from course_lib.checks import Status, nb11
from exercise_status import right_and_stubs, status
from course_tools.bench import write_mds

N = 40


@pytest.fixture(scope="module")
def mds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    items = alt.image_items(data.prepare_data(progress=False), "train", limit=N)
    return write_mds(items, tmp_path_factory.mktemp("mds") / "mds", size_limit=20_000)


@pytest.mark.quick
@pytest.mark.timeout(120)
def test_mds_loader(mds: Path) -> None:
    def right(folder, batch_size):
        return DataLoader(alt.mds_images(folder, batch_size), batch_size=batch_size, num_workers=2)

    def mismatched(folder, batch_size):
        return DataLoader(alt.mds_images(folder, 4), batch_size=batch_size, num_workers=2)

    def no_workers(folder, batch_size):
        return DataLoader(alt.mds_images(folder, batch_size), batch_size=batch_size)

    def no_loader_batch(folder, batch_size):  # the batch size given to the dataset only
        return DataLoader(alt.mds_images(folder, batch_size), num_workers=2)

    def one_worker(folder, batch_size):
        return DataLoader(alt.mds_images(folder, batch_size), batch_size=batch_size, num_workers=1)

    def drops_the_last(folder, batch_size):  # 40 samples in batches of 16: the last 8 are lost every epoch
        return DataLoader(alt.mds_images(folder, batch_size), batch_size=batch_size, num_workers=2, drop_last=True)

    def stub(folder, batch_size):
        raise NotImplementedError

    try:
        assert nb11.mds_loader.evaluate(right, mds, N).passed
        assert "num_workers=1: the task asks for 2" in nb11.mds_loader.evaluate(one_worker, mds, N).message
        assert "drop_last=True" in nb11.mds_loader.evaluate(drops_the_last, mds, N).message
        result = nb11.mds_loader.evaluate(mismatched, mds, N)
        assert result.status is Status.WRONG and "same number" in result.message
        assert "num_workers=0" in nb11.mds_loader.evaluate(no_workers, mds, N).message
        result = nb11.mds_loader.evaluate(no_loader_batch, mds, N)
        assert result.status is Status.WRONG and "pass batch_size=batch_size to the DataLoader" in result.message
        assert "DataLoader" in nb11.mds_loader.evaluate(lambda f, b: list(right(f, b)), mds, N).message
        assert nb11.mds_loader.evaluate(stub, mds, N).status is Status.NOT_ATTEMPTED
        assert nb11.mds_loader.evaluate(..., mds, N).status is Status.NOT_ATTEMPTED
    finally:
        alt.release_mds()  # the datasets the answers made: their shared memory and lock files, as notebook 11 does


GOOD_SCRIPT = """
import sys

import litdata


def square(i):  # a named function, not a lambda (the word in a comment is no lambda)
    return {"x": i, "square": i * i}


if __name__ == "__main__":
    litdata.optimize(fn=square, inputs=list(range(12)), output_dir=sys.argv[1], chunk_bytes=256_000,
                     num_workers=2, mode="overwrite", verbose=False)
"""


@pytest.mark.quick
def test_prepare_script_asks_for_two_workers() -> None:
    outcome, message = status(nb11.prepare_script, GOOD_SCRIPT.replace("num_workers=2", "num_workers=1"))
    assert outcome is Status.WRONG and "num_workers=1: the task asks for 2" in message, message


@pytest.mark.quick
def test_prepare_script_slips_seen_in_the_text() -> None:
    """What 11.2 tells from the script's text, at once, without running it; and what it must not take for a slip."""
    assert status(nb11.prepare_script, ...)[0] is Status.NOT_ATTEMPTED
    lam = GOOD_SCRIPT.replace("fn=square", "fn=lambda i: {'x': i, 'square': i * i}")
    assert "lambda" in status(nb11.prepare_script, lam)[1]
    outcome, message = status(nb11.prepare_script, GOOD_SCRIPT.replace("def square(i):", "def square(i)"))
    assert outcome is Status.WRONG and "not valid Python" in message, message
    # the two usual slips
    plain = GOOD_SCRIPT.replace('if __name__ == "__main__":\n    litdata', "litdata")
    assert plain != GOOD_SCRIPT
    outcome, message = status(nb11.prepare_script, plain)
    assert outcome is Status.WRONG and "line 11 calls optimize outside" in message, message
    definition = GOOD_SCRIPT[GOOD_SCRIPT.index("def square") : GOOD_SCRIPT.index("if __name__")]
    inside = GOOD_SCRIPT.replace(definition, "").replace(
        'if __name__ == "__main__":\n',
        'if __name__ == "__main__":\n    def square(i):\n        return {"x": i, "square": i * i}\n\n',
    )
    assert inside != GOOD_SCRIPT
    outcome, message = status(nb11.prepare_script, inside)
    assert outcome is Status.WRONG and "square is defined inside" in message and "outside the guard" in message, message
    # right scripts the text alone must not reject (each is then run; here only the text is read)
    guard = 'if __name__ == "__main__":\n    litdata'
    right = {
        "the guard the other way round": GOOD_SCRIPT.replace('__name__ == "__main__"', '"__main__" == __name__'),
        "optimize in a main function": GOOD_SCRIPT.replace(guard, "def main():\n    litdata")
        + ('\nif __name__ == "__main__":\n    main()\n'),
        "optimize imported by name": GOOD_SCRIPT.replace("import litdata", "from litdata import optimize").replace(
            "litdata.optimize(", "optimize("
        ),
        "the function bound to another name at the top": GOOD_SCRIPT.replace("fn=square", "fn=sq").replace(
            "\nif __name__", "\nsq = square\n\nif __name__"
        ),
    }
    for case, text in right.items():
        tree = ast.parse(text)
        assert nb11._optimize_calls_outside_any_if(tree) == [], case
        assert nb11._fn_names_defined_only_under_the_guard(tree) == [], case


@pytest.mark.full  # five scripts, each spawning litdata's workers: about a minute
@pytest.mark.timeout(300)
def test_prepare_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the learner's script runs with its own temporary folder: litdata leaves files in it when a script fails
    inherited, checks = tmp_path / "inherited-tmp", tmp_path / "checks"
    inherited.mkdir(), checks.mkdir()
    monkeypatch.setenv("TMPDIR", str(inherited))  # what the script would use without its own
    monkeypatch.setattr(tempfile, "tempdir", str(checks))  # where the check makes its folder
    assert status(nb11.prepare_script, GOOD_SCRIPT)[0] is Status.SOLVED
    # what the text does not show, the run does: a guard that is no guard, a class found by name under the guard
    unguarded = GOOD_SCRIPT.replace('if __name__ == "__main__":\n    litdata', "if True:\n    litdata")
    outcome, message = status(nb11.prepare_script, unguarded)
    assert outcome is Status.WRONG and "Guard the call" in message, message
    definition = GOOD_SCRIPT[GOOD_SCRIPT.index("def square") : GOOD_SCRIPT.index("if __name__")]
    instance = (
        GOOD_SCRIPT.replace(definition, "")
        .replace("fn=square", "fn=Square()")
        .replace(
            'if __name__ == "__main__":\n',
            'if __name__ == "__main__":\n    class Square:\n        def __call__(self, i):\n'
            '            return {"x": i, "square": i * i}\n\n',
        )
    )
    outcome, message = status(nb11.prepare_script, instance)
    assert outcome is Status.WRONG and "Can't get attribute" in message and "outside the guard" in message, message
    wrong_values = GOOD_SCRIPT.replace('"square": i * i', '"square": i + i')
    outcome, message = status(nb11.prepare_script, wrong_values)
    assert outcome is Status.WRONG and "12 samples" in message, message
    assert "inputs=list(range(12))" in GOOD_SCRIPT
    a_range = GOOD_SCRIPT.replace("inputs=list(range(12))", "inputs=range(12)")
    outcome, message = status(nb11.prepare_script, a_range)
    assert outcome is Status.WRONG and "give optimize a list, inputs=list(range(12))" in message, message

    assert not list(inherited.iterdir()) and not list(checks.iterdir()), "the scripts left files in a temporary folder"


@pytest.mark.quick
def test_dali_pairs() -> None:
    def right(iterator):
        for batch in iterator:
            yield batch[0]["images"], batch[0]["labels"].view(-1).long()

    def stub(iterator):
        raise NotImplementedError

    right_and_stubs(nb11.dali_pairs, right, stub)
    expected = {
        "[B, 1]": lambda it: ((b[0]["images"], b[0]["labels"].long()) for b in it),
        "int64": lambda it: ((b[0]["images"], b[0]["labels"].view(-1)) for b in it),
        "one dict per pipeline": lambda it: ((b, b[0]["labels"].view(-1).long()) for b in it),
        "tuples": lambda it: ([b[0]["images"], b[0]["labels"].view(-1).long()] for b in it),
    }

    def returns(iterator):  # return where yield belongs: one pair, for the first batch
        for batch in iterator:
            return batch[0]["images"], batch[0]["labels"].view(-1).long()

    expected["Use yield"] = returns
    # .squeeze() removes both dimensions of a last batch of one sample: cross_entropy fails on it
    expected["a batch of one sample: .squeeze()"] = lambda it: (
        (b[0]["images"], b[0]["labels"].squeeze().long()) for b in it
    )
    for words, wrong in expected.items():
        outcome, message = status(nb11.dali_pairs, wrong)
        assert outcome is Status.WRONG and words in message, (words, message)


@pytest.mark.quick
def test_rank_env() -> None:
    def right(environ):
        if "RANK" in environ:
            return {k: environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
        if "SLURM_PROCID" in environ:
            return {
                "RANK": environ["SLURM_PROCID"],
                "WORLD_SIZE": environ["SLURM_NTASKS"],
                "LOCAL_WORLD_SIZE": environ["SLURM_TASKS_PER_NODE"].split("(")[0].split(",")[0],  # "4(x2)": 4
            }
        return {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}

    def ntasks_per_node(environ):  # the course's first solution: a KeyError under a plain srun -n 8
        if "SLURM_PROCID" in environ and "RANK" not in environ:
            return {
                "RANK": environ["SLURM_PROCID"],
                "WORLD_SIZE": environ["SLURM_NTASKS"],
                "LOCAL_WORLD_SIZE": environ["SLURM_NTASKS_PER_NODE"],
            }
        return right(environ)

    def tasks_per_node_as_is(environ):
        if "SLURM_PROCID" in environ and "RANK" not in environ:
            return {**right(environ), "LOCAL_WORLD_SIZE": environ["SLURM_TASKS_PER_NODE"]}
        return right(environ)

    def slurm_first(environ):
        if "SLURM_PROCID" in environ:
            return {
                "RANK": environ["SLURM_PROCID"],
                "WORLD_SIZE": environ["SLURM_NTASKS"],
                "LOCAL_WORLD_SIZE": environ["SLURM_TASKS_PER_NODE"].split("(")[0],
            }
        return right(environ)

    def ints(environ):
        return {k: int(v) for k, v in right(environ).items()}

    def stub(environ):
        raise NotImplementedError

    right_and_stubs(nb11.rank_env, right, stub)
    assert "srun's task number" in status(nb11.rank_env, slurm_first)[1]
    assert "strings" in status(nb11.rank_env, ints)[1]
    outcome, message = status(nb11.rank_env, ntasks_per_node)
    assert outcome is Status.WRONG and "Slurm sets it only when the job asks for --ntasks-per-node" in message, message
    assert "a plain srun -n 8 over 2 nodes" in message and "SLURM_TASKS_PER_NODE is always set" in message, message
    outcome, message = status(nb11.rank_env, tasks_per_node_as_is)
    assert outcome is Status.WRONG and "LOCAL_WORLD_SIZE='4(x2)'" in message, message
    assert (
        "no variables"
        in status(
            nb11.rank_env, lambda e: right(e) if e else {"RANK": "0", "WORLD_SIZE": "0", "LOCAL_WORLD_SIZE": "0"}
        )[1]
    )


@pytest.mark.quick
def test_fit() -> None:
    import itertools

    import torch.nn.functional as F

    def stub(model, loader, steps):
        raise NotImplementedError

    def everything(model, loader, steps):  # trains on the whole loader: an endless stream never ends
        return alt.train_steps(model, list(loader), steps)

    def no_zero_grad(model, loader, steps):
        opt, seen = torch.optim.SGD(model.parameters(), lr=0.1), 0
        for images, labels in itertools.islice(loader, steps):
            F.cross_entropy(model(images), labels).backward()
            opt.step()
            seen += len(labels)
        return seen

    def whole_loader(model, loader, steps):  # counts right, never stops after steps (a learner's run in JupyterLab)
        opt, seen = torch.optim.SGD(model.parameters(), lr=0.1), 0
        for images, labels in loader:
            opt.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            opt.step()
            seen += len(labels)
        return seen

    def batches_not_images(model, loader, steps):
        alt.train_steps(model, loader, steps)
        return steps

    def no_step(model, loader, steps):
        return sum(len(labels) for _, labels in itertools.islice(loader, steps))

    def new_optimizer_every_step(model, loader, steps):  # same weights with plain SGD; momentum would restart
        seen = 0
        for images, labels in itertools.islice(loader, steps):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            opt.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            opt.step()
            seen += len(labels)
        return seen

    right_and_stubs(nb11.fit, alt.train_steps, stub)
    expected = {
        everything: "took 20 batches",
        whole_loader: "took 20 batches",
        no_zero_grad: "zero_grad",
        batches_not_images: "count len(labels)",
        no_step: "did not change",
        new_optimizer_every_step: "made 5 optimizers for 5 steps",
    }
    for wrong, words in expected.items():
        outcome, message = status(nb11.fit, wrong)
        assert outcome is Status.WRONG and words in message, (wrong.__name__, message)
