"""Checks for notebook 14 (surviving preemption).

14.1 feeds the learner's counting function step logs whose answers are known. 14.2 and 14.3 run the
learner's sampler and stream in torchdata's ``StatefulDataLoader`` with 2 worker processes, stop after a
few batches, resume in a new loader from the saved state, stop and resume a second time in the same epoch
(a state that stops advancing after the first ``load_state_dict`` passes one resume), and compare with a pass
that was never stopped, also into the next epoch. 14.4 trains a small model with the learner's save and load, and makes a save fail
half-way to see that the previous checkpoint survives.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from ..resume import stateful_loader
from ._core import Hint, attempted, exercise, require, stop_workers, whole_number


def _steps(*per_rank: list[tuple[int, list[int]]]) -> dict[int, list[dict[str, Any]]]:
    return {
        rank: [{"run": 0, "epoch": e, "step": s + 1, "indices": idx} for s, (e, idx) in enumerate(steps)]
        for rank, steps in enumerate(per_rank)
    }


@exercise("14.1", "you count what an epoch trained twice and never, from the ranks' step logs.")
def seen_twice_and_never(fn: Callable[..., Any]) -> None:
    """``fn(steps, n, epoch)`` -> ``(twice, never)``: sorted sample indices of that epoch, over all ranks."""
    attempted(fn)
    cases = [  # (steps, n, epoch, twice, never)
        (_steps([(0, [0, 1]), (0, [2, 3])], [(0, [4, 5]), (0, [6, 7])]), 8, 0, [], []),
        (_steps([(0, [0, 1]), (0, [0, 1])], [(0, [4, 5]), (0, [4, 5])]), 8, 0, [0, 1, 4, 5], [2, 3, 6, 7]),
        (_steps([(0, [3, 2]), (1, [3, 3])], [(0, [1, 0]), (1, [0, 2])]), 4, 1, [3], [1]),
        (_steps([(0, [5, 1])], [(0, [1, 4])]), 6, 0, [1], [0, 2, 3]),
        (_steps([(0, [5, 2]), (0, [5, 2])], [(0, [5, 0])]), 6, 0, [2, 5], [1, 3, 4]),
    ]
    for steps, n, epoch, twice, never in cases:
        got = fn(steps, n, epoch)
        require(
            isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(p, list) for p in got),
            f"return two sorted lists, `return twice, never`; got {got!r}.",
        )
        got_twice, got_never = ([int(i) for i in part] for part in got)
        where = f"for epoch {epoch} of {n} samples and ranks' indices " + str(
            {r: [s["indices"] for s in v if s["epoch"] == epoch] for r, v in steps.items()}
        )
        require(
            got_twice == twice,
            f"{where}, twice should be {twice}, got {got_twice}: count each index over "
            "every rank's steps of that epoch only (other epochs see everything again), and list it once.",
        )
        require(
            got_never == never,
            f"{where}, never should be {never}, got {got_never}: the indices of "
            f"range({n}) that no rank's step of that epoch holds, sorted.",
        )


def _pass(loader: Any, stop_after: int | None = None) -> tuple[list[list[int]], Any]:
    """One pass of ``loader`` as lists of ints; with ``stop_after``, the loader's state after that many batches."""
    try:
        it = iter(loader)
    except BaseException as exc:
        traceback.clear_frames(exc.__traceback__)  # the half-made iterator goes now, and stops its workers
        raise
    batches = []
    try:
        for batch in it:
            batches.append([int(i) for i in batch])
            if stop_after is not None and len(batches) == stop_after:
                return batches, loader.state_dict()
        return batches, None
    finally:
        stop_workers(it)


@exercise(
    "14.2", "your sampler resumes mid-epoch with 2 workers, on exactly the next batch, and the next epoch is whole."
)
def resumable_sampler(cls: Any) -> None:
    """``cls(n, seed)``: a ``Sampler`` with ``set_epoch``, ``state_dict`` and ``load_state_dict``."""
    attempted(cls)
    require(isinstance(cls, type), f"pass the class itself (e.g. `MyResumableShuffle`), not {cls!r}.")
    n, seed = 40, 7
    s = cls(n, seed)
    s.set_epoch(0)
    first = [int(i) for i in s]
    require(
        sorted(first) == list(range(n)), f"one pass should yield every index of 0..{n - 1} once; got {first[:8]}..."
    )
    s.set_epoch(1)
    second = [int(i) for i in s]
    require(second != first, "set_epoch(1) gave the same order as epoch 0: derive the order from (seed, epoch).")
    other = cls(n, seed)
    other.set_epoch(1)
    require(
        [int(i) for i in other] == second,
        "two samplers with the same seed and epoch gave different orders: use "
        "a torch.Generator seeded from (seed, epoch) in __iter__, not the global random state.",
    )
    whole_number(len(s), "len(sampler)", f"it should be {n}")
    require(len(s) == n, f"len(sampler) should be {n}, got {len(s)}.")

    def loader(sampler: Any) -> Any:
        return stateful_loader(list(range(n)), batch_size=4, sampler=sampler, num_workers=2)

    s = cls(n, seed)
    s.set_epoch(1)
    whole, _ = _pass(loader(s))
    s = cls(n, seed)
    s.set_epoch(1)
    before, state = _pass(loader(s), stop_after=3)
    resumed_sampler = cls(n, seed)
    resumed_sampler.set_epoch(0)  # the state must bring the epoch back
    resumed = loader(resumed_sampler)
    resumed.load_state_dict(state)
    mid, state = _pass(resumed, stop_after=2)
    if mid == whole[:2]:
        raise Hint(
            f"stopped after 3 batches and resumed in a new loader: {mid[:2]}... came next, the epoch's first batches: "
            "the resumed sampler started the epoch over. __iter__ must skip the count that load_state_dict restored; "
            "if __iter__ sets its running count to 0 as it starts, restore into another attribute (self.skip) that "
            "__iter__ skips, then clears."
        )
    require(
        before + mid == whole[:5],
        f"stopped after 3 batches and resumed in a new loader: {mid[:2]}... came next, "
        f"but the pass that never stopped had {whole[3:5]}... Save the epoch and how many indices were yielded "
        "(count before each yield: the loader saves the state right after taking a batch's last index), and in "
        "__iter__ skip that many of the epoch's order.",
    )
    again_sampler = cls(n, seed)
    again_sampler.set_epoch(0)
    again = loader(again_sampler)
    again.load_state_dict(state)  # stopped a second time in the same epoch, 2 batches after the resume
    after, _ = _pass(again)
    require(
        before + mid + after == whole,
        f"stopped a second time in the same epoch, 2 batches after the resume, and resumed again: {after[:2]}... "
        f"came next, but the pass that never stopped had {whole[5:7]}... The state must count the indices "
        "yielded since the epoch began, the skipped ones included, not since the resume: start the count at "
        "the number skipped (self.yielded = skip), then count up.",
    )
    again_sampler.set_epoch(2)
    nxt, _ = _pass(again)
    require(
        sorted(i for b in nxt for i in b) == list(range(n)),
        "the epoch after a resumed one should be whole, "
        f"but it had {sum(map(len, nxt))} indices: skip only once, then start from 0 again.",
    )


def _epochs(loader: Any, count: int = 2) -> list[list[list[int]]]:
    """``count`` passes of ``loader``, each as lists of ints; its workers are stopped at the end, persistent ones too."""
    passes, it = [], None
    try:
        for _ in range(count):
            try:
                it = iter(loader)
            except BaseException as exc:
                traceback.clear_frames(exc.__traceback__)  # the half-made iterator goes now, and stops its workers
                raise
            passes.append([[int(i) for i in batch] for batch in it])
        return passes
    finally:
        if it is not None:
            stop_workers(it)


_STREAM_SETTINGS = (  # (loader arguments, how a hint names them): fresh workers first, as the notebook runs it
    ({"num_workers": 2}, "2 workers"),
    ({"num_workers": 2, "persistent_workers": True}, "2 persistent workers (persistent_workers=True)"),
    ({"num_workers": 0}, "num_workers=0"),
)


@exercise(
    "14.3",
    "your stream resumes on exactly the next batch, with 2 workers, persistent ones and none, every epoch is whole, "
    "and it skips without loading.",
)
def resumable_stream(cls: Any) -> None:
    """``cls(n)``: an ``IterableDataset`` yielding ``self.load(i)`` for its worker's share, with a saved position.

    Two epochs and two resumes in one epoch in each of three settings: fresh workers, persistent workers and
    none. Without workers, and with persistent ones, the same object's ``__iter__`` runs again for the next epoch:
    a position that a resume restored must serve one pass only."""
    attempted(cls)
    require(isinstance(cls, type), f"pass the class itself (e.g. `MyResumableStream`), not {cls!r}.")
    n = 30
    for kwargs, setting in _STREAM_SETTINGS:
        whole, second = _epochs(stateful_loader(cls(n), batch_size=3, **kwargs))
        flat = sorted(i for b in whole for i in b)
        require(
            flat == list(range(n)),
            f"with {setting} one pass should yield 0..{n - 1} once each, got {len(flat)} "
            "samples: yield only this worker's share, range(info.id, n, info.num_workers) (all of range(n) "
            "without workers).",
        )
        if setting == _STREAM_SETTINGS[0][1]:
            require(
                callable(getattr(cls, "state_dict", None)) and callable(getattr(cls, "load_state_dict", None)),
                "give the stream state_dict() and load_state_dict(): without them the loader resumes by reading and "
                "throwing away everything before the checkpoint.",
            )
        got = sorted(i for b in second for i in b)
        require(
            got == list(range(n)),
            f"with {setting} the second epoch yielded {len(got)} samples instead of {n}: the same copy of your "
            "stream runs __iter__ again for the next epoch, and its count still holds where the first pass ended. "
            "A restored position serves one pass only: keep it apart from the count (load_state_dict sets "
            "self.start; __iter__ begins with self.done, self.start = self.start, 0).",
        )
        before, state = _pass(stateful_loader(cls(n), batch_size=3, **kwargs), stop_after=4)
        resumed = stateful_loader(cls(n), batch_size=3, **kwargs)
        resumed.load_state_dict(state)
        mid, state = _pass(resumed, stop_after=1)  # with 2 workers, one of them has not yielded since the resume
        require(
            before + mid == whole[:5],
            f"with {setting}, stopped after 4 batches and resumed: {mid}... came next, but the pass "
            f"that never stopped had {whole[4:5]}... Count a sample before you yield it (the state is taken right "
            "after a batch's last sample), and in __iter__ skip that many of this worker's share.",
        )
        again = stateful_loader(cls(n), batch_size=3, **kwargs)
        again.load_state_dict(state)  # stopped a second time in the same epoch, 1 batch after the resume
        after, nxt = _epochs(again)
        require(
            before + mid + after == whole,
            f"with {setting}, stopped after 4 batches, resumed, stopped again 1 batch later and resumed again: "
            f"{after[:2]}... came next, but the pass that never stopped had {whole[5:7]}... One resume was right, "
            "the second was not: the state saved after a resume must count the positions of the share done since "
            "the epoch began, the skipped ones included, also in a worker that has not yielded since the resume "
            "(load_state_dict sets the count too: self.done = self.start = state['done']), and state_dict() must "
            "report that live count. A state that stops advancing after load_state_dict sends the second resume "
            "back to the start (the bug of huggingface/datasets#8308).",
        )
        require(
            nxt == second,
            f"with {setting}, the epoch after a resumed one should be whole, but it had {sum(map(len, nxt))} "
            f"samples of {n}: skip only in the first pass after load_state_dict, then start the share from 0 again.",
        )

    loads: list[int] = []
    counted = type(cls.__name__, (cls,), {"load": lambda self, i: loads.append(i) or i})
    one = stateful_loader(counted(n), batch_size=3, num_workers=0)
    _, state0 = _pass(one, stop_after=4)
    loads.clear()
    again = stateful_loader(counted(n), batch_size=3, num_workers=0)
    again.load_state_dict(state0)
    rest, _ = _pass(again)
    require(loads or not rest, "your stream never called self.load(i): yield self.load(i) for each index of its share.")
    require(
        sorted(loads) == sorted(i for b in rest for i in b),
        f"the resumed pass called load() {len(loads)} times "
        f"for {sum(map(len, rest))} samples: skip positions of the share (e.g. share[self.done:]) instead of "
        "loading samples and throwing them away, which costs as much as reading them.",
    )


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class _Unsaveable:
    """Fails when pickled: ``torch.save`` raises in the middle of writing, as on a full disk."""

    def __reduce__(self) -> Any:
        raise OSError("No space left on device (the check's simulated failure, half-way through torch.save)")


class _BrokenLoader:
    """A loader whose state makes ``torch.save`` fail half-way."""

    def state_dict(self) -> dict:
        return {"position": 5, "buffer": _Unsaveable()}


def _train(model: nn.Module, opt: torch.optim.Optimizer, batches: Any, k: int) -> list[int]:
    seen = []
    for _ in range(k):
        x = next(batches)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        seen.append(int(x[0, 0]))
    return seen


def _setup(n: int = 24) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    model = _Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = [torch.tensor([float(i), 1.0]) for i in range(n)]
    loader = stateful_loader(data, batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(3))
    return model, opt, loader


def _moves_during(call: Callable[[], Any]) -> list[tuple[Path, Path]]:
    """The ``(source, destination)`` of every ``os.replace`` and ``os.rename`` (``Path.replace``, ``shutil.move``) that
    ``call()`` makes, which still happen."""
    moves: list[tuple[Path, Path]] = []
    real = {"replace": os.replace, "rename": os.rename}

    def watched(name: str) -> Callable[..., Any]:
        def move(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(src, (str, os.PathLike)) and isinstance(dst, (str, os.PathLike)):
                moves.append((Path(src), Path(dst)))
            return real[name](src, dst, *args, **kwargs)

        return move

    os.replace, os.rename = watched("replace"), watched("rename")
    try:
        call()
    finally:
        os.replace, os.rename = real["replace"], real["rename"]
    return moves


def _ran_code() -> None:
    _CODE_RAN.append(True)


_CODE_RAN: list[bool] = []


class _Payload:
    """Runs :func:`_ran_code` when unpickled: what a crafted checkpoint could do, harmlessly."""

    def __reduce__(self) -> Any:
        return _ran_code, ()


@exercise("14.4", "model, optimizer and loader come back together, and a failed save leaves the last checkpoint whole.")
def checkpoint(save: Callable[..., Any], load: Callable[..., Any]) -> None:
    """``save(path, model, optimizer, loader, step)``; ``load(path, model, optimizer, loader)`` -> ``step``."""
    attempted(save, load)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ckpt.pt"
        model, opt, loader = _setup()
        batches = iter(loader)
        _train(model, opt, batches, 3)
        moves = _moves_during(lambda: save(path, model, opt, loader, 3))
        saved_weights = [p.detach().clone() for p in model.parameters()]
        require(path.is_file(), f"save(path, ...) should write the file {path.name}; nothing is there.")
        far = [str(src.parent) for src, dst in moves if dst == path and src.resolve().parent != path.resolve().parent]
        require(
            not far,
            f"your temporary file was in {far[0] if far else ''}, not beside the checkpoint: os.replace onto "
            "another file system (the system's temporary folder often is one, and a job's scratch space) fails "
            "with EXDEV, 'Invalid cross-device link'. Make it in the checkpoint's folder, e.g. "
            "path.with_name(path.name + '.tmp').",
        )
        want = _train(model, opt, batches, 4)
        want_weights = [p.detach().clone() for p in model.parameters()]
        stop_workers(batches)

        model2, opt2, loader2 = _setup()
        _train(model2, opt2, iter(loader2), 1)  # a fresh job's objects are not where the saved ones were
        step = load(path, model2, opt2, loader2)
        require(
            all(torch.equal(a, b) for a, b in zip(saved_weights, model2.parameters())),
            "after load, the model you "
            "were given does not hold the saved weights: model.load_state_dict(state['model']) into it.",
        )
        whole_number(step, "load(...)", "the step saved with the checkpoint")
        require(step == 3, f"load should return the saved step, 3; got {step}.")
        got = _train(model2, opt2, iter(loader2), 4)
        require(
            got == want,
            f"after load, the next batches started with samples {got[:2]}, but the run that never "
            f"stopped went on with {want[:2]}: save loader.state_dict() and give it to loader.load_state_dict().",
        )
        same = all(torch.equal(a, b) for a, b in zip(want_weights, model2.parameters()))
        require(
            same,
            "the same batches after load gave different weights: save and load the optimizer's state "
            "too (SGD's momentum lives there), not only the model's.",
        )

        before = path.read_bytes()
        try:
            save(path, model, opt, _BrokenLoader(), 9)
        except OSError:
            pass
        else:
            raise Hint(
                "save() returned normally although torch.save raised OSError half-way: let the error reach the "
                "caller, so that a job never believes a checkpoint was saved when it was not."
            )
        require(
            path.is_file() and path.read_bytes() == before,
            "a save that failed half-way (torch.save raised while "
            "writing) destroyed the previous checkpoint: torch.save to a temporary file beside `path`, then "
            "os.replace(tmp, path), which swaps the file in one step.",
        )
        strays = [p.name for p in Path(tmp).iterdir() if p != path]
        require(not strays, f"the failed save left {strays} behind: remove the temporary file when saving fails.")

        crafted = Path(tmp) / "crafted" / "ckpt.pt"
        crafted.parent.mkdir()
        torch.save({"model": model.state_dict(), "payload": _Payload()}, crafted)
        _CODE_RAN.clear()
        try:
            load(crafted, model2, opt2, loader2)
        except Exception:
            pass  # refusing the file is right
        require(
            not _CODE_RAN,
            "loading a crafted checkpoint ran the code it carried: load with torch.load(path, weights_only=True), "
            "which reads tensors, numbers and dicts only; weights_only=False lets the file run any code.",
        )
