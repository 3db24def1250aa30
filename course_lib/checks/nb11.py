"""Checks for notebook 11 (beyond WebDataset).

11.1 runs the learner's MDS loader on real MDS shards; 11.2 runs the learner's litdata preparation script as a cluster
job would, a fresh interpreter whose workers are spawned, and reads what it wrote; 11.3 feeds their DALI adapter batches
shaped as ``DALIGenericIterator`` yields them; 11.4 asks their rank finder about the environments of torchrun, srun, and
both;
11.5 runs their training loop on a counted stream and compares its weights with 5 steps of SGD.
"""

from __future__ import annotations

import ast
import gc
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from ._core import Hint, attempted, exercise, require, solved

__all__ = ["dali_pairs", "fit", "mds_loader", "prepare_script", "rank_env", "solved"]


@exercise("11.1", "MDS deals whole batches, so the StreamingDataset and the DataLoader agree on batch_size.")
def mds_loader(fn: Callable[[Any, int], Any], folder: Any, samples: int, batch_size: int = 16) -> None:
    """``fn(folder, batch_size)`` returns a DataLoader of ``(images, labels)`` over the MDS shards in ``folder``."""
    from torch.utils.data import DataLoader

    attempted(fn)
    loader = fn(folder, batch_size)
    attempted(loader)
    require(
        isinstance(loader, DataLoader), f"mds_loader returned a {type(loader).__name__}: return a torch DataLoader."
    )
    require(loader.num_workers >= 1, "the DataLoader has num_workers=0: give it worker processes (num_workers=2).")
    require(
        loader.num_workers == 2,
        f"the DataLoader has num_workers={loader.num_workers}: the task asks for 2 worker processes, so that MDS "
        "splits its shards between two readers (num_workers=2).",
    )
    require(
        not loader.drop_last,
        "the DataLoader drops the last, partial batch (drop_last=True): an epoch of MDS samples would then lose "
        "up to batch_size - 1 of them every epoch. Leave drop_last at its default, False.",
    )
    inner = getattr(loader.dataset, "inner", loader.dataset)
    ds_batch = getattr(inner, "batch_size", None)
    require(
        ds_batch is not None,
        "the StreamingDataset has no batch_size: MDS refuses to iterate without it. "
        "Pass batch_size to alternatives.mds_images(folder, batch_size).",
    )
    if loader.batch_size == 1 and batch_size != 1:
        raise Hint(
            f"the DataLoader makes batches of 1, its default: pass batch_size=batch_size to the DataLoader "
            f"too, so that it makes batches of {batch_size}, as the StreamingDataset plans them."
        )
    require(loader.batch_size == batch_size, f"the DataLoader makes batches of {loader.batch_size}, not {batch_size}.")
    require(
        ds_batch == loader.batch_size,
        f"the StreamingDataset was told batch_size={ds_batch} but the DataLoader "
        f"makes batches of {loader.batch_size}: MDS plans which worker reads which samples in batches of the "
        "dataset's batch_size, so the loader's batches no longer follow its planned order (and resuming "
        "mid-epoch points at the wrong samples). Use the same number for both.",
    )
    gc.collect()
    labels: list[int] = []
    for images, ys in loader:
        require(
            isinstance(images, torch.Tensor) and images.dim() == 4,
            "each batch should be (images [B, 3, H, W], labels).",
        )
        labels += [int(y) for y in ys]
    require(len(labels) == samples, f"{len(labels)} samples came out of {samples} in the shards.")


@exercise(
    "11.2",
    "a function defined at the top of the script, found by name in every spawned worker, and optimize "
    'behind if __name__ == "__main__".',
)
def prepare_script(text: Any) -> None:
    """``text``: a whole Python script that writes ``{"x": i, "square": i * i}`` for ``i`` in ``range(12)`` with
    ``litdata.optimize`` and 2 workers into the folder given as its first argument."""
    attempted(text)
    require(isinstance(text, str), f"the answer is a {type(text).__name__}: give the whole script as one string.")
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise Hint(f"the script is not valid Python: {exc.msg} (line {exc.lineno}).") from None
    require(
        not any(isinstance(node, ast.Lambda) for node in ast.walk(tree)),
        "the script passes a lambda: spawned "
        "workers receive fn by name, and a lambda has none. Define a function at the top of the script.",
    )
    # the two usual slips, seen in the text at once rather than after a run of several seconds; the run below
    # still catches what this does not see (optimize called through a function of the script, say)
    unguarded = _optimize_calls_outside_any_if(tree)
    if unguarded:
        raise Hint(
            f'line {unguarded[0].lineno} calls optimize outside if __name__ == "__main__": each spawned '
            "worker imports the script again and would run optimize itself. Put the call behind the guard."
        )
    for name in _fn_names_defined_only_under_the_guard(tree):
        raise Hint(
            f'{name} is defined inside if __name__ == "__main__": a spawned worker imports the script, '
            "and what is inside the guard does not run there, so it cannot find the function by name. Define "
            "it at the top of the script, outside the guard."
        )
    for workers in _literal_num_workers(tree):  # a number the script states; one it computes is run as it is
        if workers != 2:
            raise Hint(
                f"the script asks optimize for num_workers={workers}: the task asks for 2, whose spawned processes "
                "are what the script must survive (with one, or none, the trap never shows)."
            )
    with tempfile.TemporaryDirectory(prefix="check11-") as tmp:
        script, out = Path(tmp) / "prepare.py", Path(tmp) / "out"
        script.write_text(text)
        # the script's own temporary folder too: litdata leaves files in it when a script fails, removed with tmp
        env = dict(os.environ, TMPDIR=tmp)
        try:
            job = subprocess.run(
                [sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=180, cwd=tmp, env=env
            )
        except subprocess.TimeoutExpired:
            raise Hint(
                "the script ran for 3 minutes without ending: do the spawned workers start optimize again? "
                'Put it behind if __name__ == "__main__":'
            ) from None
        last = (job.stderr.strip().splitlines() or ["(no error output)"])[-1]
        if job.returncode != 0 and "prepare_structure" in job.stderr:
            raise Hint(
                "litdata could not split the inputs between its workers (its message: "
                f"{last[:160]}): give optimize a list, inputs=list(range(12)), not a range."
            )
        if job.returncode != 0:
            if "__main__" not in text:
                raise Hint(
                    f"the script failed ({last}). Spawned workers import the script again: guard the call "
                    'to optimize with if __name__ == "__main__":'
                )
            raise Hint(f"the script failed with exit status {job.returncode}: {last}")
        require(
            (out / "index.json").is_file(),
            "the script ended but wrote no index.json into the folder given as its first argument (sys.argv[1]).",
        )
        import litdata

        try:
            got = sorted((int(s["x"]), int(s["square"])) for s in litdata.StreamingDataset(str(out)))
        except Exception as exc:  # what litdata says about a broken folder varies
            got, broken = [], f"{type(exc).__name__}: {exc}"
        else:
            broken = ""
    if not got and "__main__" not in text:
        raise Hint(
            "the script wrote no samples: its spawned workers import the script again and run optimize "
            'themselves. Guard the call with if __name__ == "__main__":'
        )
    if not got and "Can't get attribute" in job.stderr:
        raise Hint(
            "the workers could not find your function by name (\"Can't get attribute ... on <module "
            "'__mp_main__'>\"): a spawned worker imports the script, and what is inside the __main__ guard "
            "does not run there. Define the function at the top of the script, outside the guard."
        )
    require(not broken, f"the folder the script wrote is not a readable litdata data set ({broken[:200]}).")
    require(
        got == [(i, i * i) for i in range(12)],
        f"the data set holds {len(got)} samples {got[:3]}...: expected {{'x': i, 'square': i * i}} for i in range(12).",
    )


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _literal_num_workers(tree: ast.Module) -> list[Any]:
    """The ``num_workers=`` values written as constants in the script's calls to optimize."""
    return [
        keyword.value.value
        for node in ast.walk(tree)
        if _is_optimize_call(node)
        for keyword in node.keywords  # type: ignore[attr-defined]
        if keyword.arg == "num_workers" and isinstance(keyword.value, ast.Constant)
    ]


def _is_optimize_call(node: ast.AST) -> bool:
    """``optimize(...)`` or ``litdata.optimize(...)`` itself."""
    func = getattr(node, "func", None) if isinstance(node, ast.Call) else None
    return (isinstance(func, ast.Attribute) and func.attr == "optimize") or (
        isinstance(func, ast.Name) and func.id == "optimize"
    )


def _calls_optimize(node: ast.AST) -> bool:
    """Does ``node`` call something named ``optimize`` when it runs (not in a function or class it defines)?"""
    return _is_optimize_call(node) or any(
        _calls_optimize(child) for child in ast.iter_child_nodes(node) if not isinstance(child, _DEFINITIONS)
    )


def _optimize_calls_outside_any_if(tree: ast.Module) -> list[ast.stmt]:
    """The statements at the top of the script, outside any ``if``, that call ``optimize`` when the script is
    imported (a spawned worker imports it)."""
    return [n for n in tree.body if not isinstance(n, (ast.If, *_DEFINITIONS)) and _calls_optimize(n)]


def _is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` (either way round)."""
    if not (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and len(node.test.ops) == 1
        and isinstance(node.test.ops[0], ast.Eq)
    ):
        return False
    sides = [node.test.left, *node.test.comparators]
    return {ast.dump(side) for side in sides} == {
        ast.dump(ast.Name("__name__", ast.Load())),
        ast.dump(ast.Constant("__main__")),
    }


def _fn_names_defined_only_under_the_guard(tree: ast.Module) -> list[str]:
    """The names given as ``fn`` to an ``optimize`` call under the ``__main__`` guard that a ``def`` under the
    guard binds and nothing at the top of the script does."""
    top = {n.name for n in tree.body if isinstance(n, _DEFINITIONS)}
    for n in tree.body:
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            top |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif not isinstance(n, _DEFINITIONS) and not _is_main_guard(n):
            top |= {t.id for t in ast.walk(n) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
    names = []
    for guard in (n for n in tree.body if _is_main_guard(n)):
        under = {d.name for d in ast.walk(guard) if isinstance(d, _DEFINITIONS)}
        for call in (c for c in ast.walk(guard) if _is_optimize_call(c)):
            fn = next((k.value for k in call.keywords if k.arg == "fn"), call.args[0] if call.args else None)
            if isinstance(fn, ast.Name) and fn.id in under and fn.id not in top:
                names.append(fn.id)
    return names


@exercise(
    "11.3", "a framework gets (images, labels): the first pipeline's dict unpacked, labels as a flat long tensor."
)
def dali_pairs(fn: Callable[[Any], Any]) -> None:
    """``fn(iterator)`` yields ``(images, labels)`` for each batch of a ``DALIGenericIterator`` with outputs
    ``["images", "labels"]``: a list with one dict per pipeline, labels shaped ``[B, 1]`` int32."""
    attempted(fn)
    sizes = [4, 4, 4, 1]  # the last batch of an epoch may hold one sample: labels [1, 1]
    batches = [
        [{"images": torch.full((n, 8, 8, 3), float(b)), "labels": torch.arange(n, dtype=torch.int32).view(n, 1) + b}]
        for b, n in enumerate(sizes)
    ]
    got = fn(iter(batches))
    attempted(got)
    if isinstance(got, (tuple, torch.Tensor)):
        raise Hint(
            f"dali_pairs returned one {type(got).__name__} for the whole iterator: a return inside the loop "
            "ends it at the first batch. Use yield (images, labels) in the loop, one pair per batch."
        )
    got = list(got)
    require(len(got) == len(sizes), f"{len(sizes)} batches went in and {len(got)} came out: yield one pair per batch.")
    for b, pair in enumerate(got):
        require(
            isinstance(pair, tuple) and len(pair) == 2,
            f"batch {b} came out as {type(pair).__name__}: yield "
            "(images, labels) tuples, which a training loop unpacks.",
        )
        images, labels = pair
        require(
            isinstance(images, torch.Tensor) and torch.equal(images, batches[b][0]["images"]),
            f'the images of batch {b} are not the pipeline\'s: take batch[0]["images"] (one dict per pipeline).',
        )
        require(isinstance(labels, torch.Tensor), f"the labels of batch {b} are a {type(labels).__name__}: a tensor.")
        if labels.dim() != 1:
            one = " (a batch of one sample: .squeeze() removes both dimensions of [1, 1])" if labels.dim() == 0 else ""
            raise Hint(
                f"the labels of batch {b} have shape {tuple(labels.shape)}{one}: DALI gives them as [B, 1]; "
                "cross_entropy wants [B]: .squeeze(-1) or .view(-1)."
            )
        if labels.dtype != torch.long:
            raise Hint(
                f"the labels of batch {b} are {labels.dtype}: cross_entropy wants class numbers as int64 (.long())."
            )
        require(torch.equal(labels, torch.arange(sizes[b]) + b), f"the labels of batch {b} are not the pipeline's.")


RANK_CASES = [
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "3"}, (3, 8, 4), "torchrun's variables"),
    (
        {
            "SLURM_PROCID": "5",
            "SLURM_NTASKS": "8",
            "SLURM_NTASKS_PER_NODE": "4",
            "SLURM_TASKS_PER_NODE": "4(x2)",
            "SLURM_LOCALID": "1",
        },
        (5, 8, 4),
        "srun --ntasks-per-node=4 with one task per GPU and no torchrun",
    ),
    (
        {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_LOCALID": "1"},
        (5, 8, 4),
        "a plain srun -n 8 over 2 nodes (no --ntasks-per-node, so no SLURM_NTASKS_PER_NODE)",
    ),
    (
        {
            "RANK": "6",
            "WORLD_SIZE": "8",
            "LOCAL_WORLD_SIZE": "4",
            "SLURM_PROCID": "1",
            "SLURM_NTASKS": "2",
            "SLURM_NTASKS_PER_NODE": "1",
            "SLURM_TASKS_PER_NODE": "1(x2)",
        },
        (6, 8, 4),
        "torchrun started by srun, one per node",
    ),
    ({}, (0, 1, 1), "a plain python process"),
]


@exercise(
    "11.4",
    "torchrun's variables first (under srun + torchrun, SLURM_PROCID is the node's task, not the rank), "
    "then srun's, else one process.",
)
def rank_env(fn: Callable[[dict], Any]) -> None:
    """``fn(environ)`` returns ``{"RANK": str, "WORLD_SIZE": str, "LOCAL_WORLD_SIZE": str}`` for MDS to read."""
    attempted(fn)
    for environ, (rank, world, local), where in RANK_CASES:
        try:
            got = fn(dict(environ))
        except KeyError as exc:
            missing = exc.args[0] if exc.args else ""
            if missing == "SLURM_NTASKS_PER_NODE":
                raise Hint(
                    f"for {where} your code raised KeyError: 'SLURM_NTASKS_PER_NODE'. Slurm sets it only when the "
                    "job asks for --ntasks-per-node; SLURM_TASKS_PER_NODE is always set, e.g. '4(x2)' (4 tasks on "
                    "each of 2 nodes): take the number before '('."
                ) from None
            raise Hint(f"for {where} ({environ or 'no variables'}) your code raised KeyError: {missing!r}.") from None
        attempted(got)
        require(isinstance(got, dict), f"the answer is a {type(got).__name__}: return a dict of environment variables.")
        want = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(local)}
        require(
            set(got) >= set(want),
            f"for {where} the answer has {sorted(got)}: give RANK, WORLD_SIZE and LOCAL_WORLD_SIZE.",
        )
        require(
            all(isinstance(v, str) for v in got.values()), "environment variables are strings: str(...) each value."
        )
        picked = {k: got[k] for k in want}
        if picked == want:
            continue
        if environ.get("RANK") and picked.get("RANK") == environ.get("SLURM_PROCID"):
            raise Hint(
                f"for {where} you gave RANK={picked['RANK']}, srun's task number: with torchrun inside srun, "
                "SLURM_PROCID counts nodes' tasks, and torchrun's RANK is the rank. Prefer torchrun's variables."
            )
        if "(" in picked.get("LOCAL_WORLD_SIZE", "") or "," in picked.get("LOCAL_WORLD_SIZE", ""):
            raise Hint(
                f"for {where} you gave LOCAL_WORLD_SIZE={picked['LOCAL_WORLD_SIZE']!r}: SLURM_TASKS_PER_NODE "
                "reads count(xnodes), '4(x2)' for 4 tasks on each of 2 nodes; MDS wants the count, '4'."
            )
        raise Hint(f"for {where} ({environ or 'no variables'}) expected {want}, got {picked}.")


@exercise(
    "11.5",
    "a framework's loop only iterates the loader: steps batches (islice), SGD on cross-entropy, the "
    "gradients zeroed every step.",
)
def fit(fn: Callable[..., Any]) -> None:
    """``fn(model, loader, steps)`` trains ``model`` for ``steps`` batches of ``loader`` and returns the images seen."""
    import copy

    from ..alternatives import train_steps as reference

    attempted(fn)
    gen = torch.Generator().manual_seed(11)
    batches = [(torch.rand(4, 3, 8, 8, generator=gen), torch.randint(0, 10, (4,), generator=gen)) for _ in range(20)]
    pulled = [0]

    def loader():  # a stream that counts what was taken from it
        for batch in batches:
            pulled[0] += 1
            yield batch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 10))
    twin, start = copy.deepcopy(model), copy.deepcopy(model.state_dict())
    made = [0]
    original_init = torch.optim.Optimizer.__init__

    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:  # every optimizer fn makes, counted
        made[0] += 1
        original_init(self, *args, **kwargs)

    torch.optim.Optimizer.__init__ = counting_init  # type: ignore[method-assign]
    try:
        seen = fn(model, loader(), 5)
    finally:
        torch.optim.Optimizer.__init__ = original_init  # type: ignore[method-assign]
    attempted(seen)
    # first: a loop over the whole loader also returns the wrong count, and stopping is what it misses
    require(
        pulled[0] <= 6,
        f"fit took {pulled[0]} batches from the loader for 5 steps: stop after steps batches "
        "(itertools.islice(loader, steps)); an endless stream would never end.",
    )
    require(seen == 20, f"fit returned {seen!r}: 5 steps of 4 images each saw 20 images; count len(labels) per batch.")
    reference(twin, iter(batches), 5)
    require(
        any(not torch.equal(now, start[name]) for name, now in model.state_dict().items()),
        "the model's weights did not change: call opt.step() after loss.backward().",
    )
    same = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(model.state_dict().values(), twin.state_dict().values()))
    if not same:
        raise Hint(
            "the weights differ from 5 steps of SGD(lr=0.1) on F.cross_entropy(model(images), labels): check the "
            "learning rate, the loss, and opt.zero_grad() before each backward (gradients add up otherwise)."
        )
    if made[0] > 1:
        raise Hint(
            f"fit made {made[0]} optimizers for 5 steps: make it once, before the loop. Plain SGD hides it, but an "
            "optimizer keeps state between steps (momentum, Adam's averages), and a new one each step starts that "
            "state over every time."
        )
    short = fn(copy.deepcopy(twin), iter(batches[:3]), 5)
    require(
        short == 12,
        f"a loader of 3 batches, asked for 5 steps, should give 12 images, not {short!r}: a loader "
        "may end before the steps do.",
    )
