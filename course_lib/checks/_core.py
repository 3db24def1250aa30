"""The machinery behind self-checking exercises.

A check is a function decorated with :func:`exercise`. It receives what the learner built and
raises :class:`Hint` with a specific message when something is wrong. The decorator turns the
outcome into one printed line and never lets an exception escape, so a wrong answer never
crashes the notebook:

* ``✅ Exercise 01.1 solved: ...``              the answer passed every test;
* ``⬜ Exercise 01.1 not attempted yet: ...``   the answer is still the stub (``...`` or a
  function that raises ``NotImplementedError``);
* ``❌ Exercise 01.1 not yet: <hint>``          something is wrong, and the hint says what.
"""

from __future__ import annotations

import enum
import functools
import re
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch


class Hint(Exception):
    """Raised by a check: the learner's answer is wrong, and the message says how."""


class NotAttempted(Exception):
    """Raised by a check when the answer is still the stub."""


class Status(enum.Enum):
    SOLVED = "✅"
    NOT_ATTEMPTED = "⬜"
    WRONG = "❌"


@dataclass(frozen=True)
class CheckResult:
    exercise: str
    status: Status
    message: str

    @property
    def passed(self) -> bool:
        return self.status is Status.SOLVED

    def __str__(self) -> str:
        label = {
            Status.SOLVED: "solved",
            Status.NOT_ATTEMPTED: "not attempted yet",
            Status.WRONG: "not yet",
        }[self.status]
        return f"{self.status.value} Exercise {self.exercise} {label}: {self.message}"


def require(condition: bool, hint: str) -> None:
    """Raise :class:`Hint` with ``hint`` unless ``condition`` holds."""
    if not condition:
        raise Hint(hint)


def whole_number(value: Any, call: str, why: str) -> int:
    """``value`` as an ``int``, or a :class:`Hint`: ``call`` should return a whole number (``why``)."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise Hint(f"{call} should return a whole number, got {value!r}.") from None
    require(number == value, f"{call} returned {value!r}: {why}")
    return number


def attempted(*answers: Any) -> None:
    """Raise :class:`NotAttempted` if any answer is still the ``...`` placeholder."""

    def is_stub(a: Any) -> bool:
        return a is Ellipsis or (isinstance(a, (tuple, list)) and any(is_stub(x) for x in a))

    if any(is_stub(a) for a in answers):
        raise NotAttempted("replace the `...` with your answer, run the cell, then run this check again.")


def drain(loader: Any) -> list[Any]:
    """Every batch of one pass over ``loader``, its worker processes shut down before this returns or raises.

    When a learner's code fails in a worker, the exception's traceback keeps the loader's iterator, and its
    workers, alive until some later garbage collection, which then stops them in the middle of another cell
    (and can stall the kernel's output)."""
    batches = iter(loader)
    try:
        return list(batches)
    finally:
        stop_workers(batches)


def stop_workers(batches: Any) -> None:
    """Stop the worker processes of a DataLoader iterator now (persistent ones too); anything else is left alone.

    ``_shutdown_workers`` is torch's own clean-up (private; checked with torch 2.14 and 2.15)."""
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def _where(exc: BaseException) -> str:
    """The learner-facing part of an exception: type and message, plus the line in their code."""
    message = str(exc)
    if "Original Traceback" in message:  # raised in a DataLoader worker: keep the worker's last line
        last = [line for line in message.strip().splitlines() if line.strip()][-1]
        return f"in a DataLoader worker: {last}"
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if "ipykernel" in f.filename or f.filename.startswith("<")]
    line = f" (in your code: `{user[-1].line}`)" if user and user[-1].line else ""
    return f"{type(exc).__name__}: {exc}{line}"


_last: dict[str, bool] = {}  # exercise code -> whether its last check in this process passed


def solved(code: str) -> bool:
    """Whether the last check of exercise ``code`` run in this kernel passed: a later cell uses the learner's answer
    once it does, and the course's own until then (so that a notebook with open exercises still runs to the end)."""
    return _last.get(code, False)


def exercise(code: str, solved_message: str) -> Callable[[Callable[..., Any]], Callable[..., None]]:
    """Decorate a check function for exercise ``code`` (e.g. ``"01.1"``).

    The decorated function prints one line and returns ``None``; ``fn.evaluate(...)`` returns
    the :class:`CheckResult` instead (for tests and graders).
    """

    def decorate(check: Callable[..., Any]) -> Callable[..., None]:
        def evaluate(*args: Any, **kwargs: Any) -> CheckResult:
            try:
                with torch.random.fork_rng(devices=[]):  # a check never disturbs the learner's random state
                    check(*args, **kwargs)
            except NotAttempted as exc:
                return CheckResult(code, Status.NOT_ATTEMPTED, str(exc))
            except NotImplementedError as exc:
                frames = traceback.extract_tb(exc.__traceback__)
                name = frames[-1].name if frames else "<module>"
                # raised in a DataLoader worker: torch re-raises it with the worker's traceback as text
                in_worker = re.findall(r", in (\w+)\n", str(exc))
                if "Original Traceback" in str(exc) and in_worker:
                    name = in_worker[-1]
                where = f" in `{name}`" if name != "<module>" else ""
                return CheckResult(
                    code,
                    Status.NOT_ATTEMPTED,
                    f"your code still raises NotImplementedError{where}: replace that line with your code.",
                )
            except Hint as exc:
                return CheckResult(code, Status.WRONG, str(exc))
            except Exception as exc:  # the learner's code failed inside the check
                return CheckResult(code, Status.WRONG, f"running your answer raised {_where(exc)}")
            return CheckResult(code, Status.SOLVED, solved_message)

        @functools.wraps(check)
        def run(*args: Any, **kwargs: Any) -> None:
            result = evaluate(*args, **kwargs)
            _last[code] = result.passed
            print(result)

        run.evaluate = evaluate  # type: ignore[attr-defined]
        run.exercise = code  # type: ignore[attr-defined]
        return run

    return decorate


def labelled_shards(folder: Any, shards: int, per_shard: int) -> list[str]:
    """``shards`` small tar shards whose every sample says where it comes from: class ``shard * 100 + i``."""
    import io

    import webdataset as wds
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (90, 60, 30)).save(buf, "JPEG")
    urls = []
    for s in range(shards):
        path = f"{folder}/check-{s:06d}.tar"
        with wds.TarWriter(path) as sink:
            for i in range(per_shard):
                sink.write({"__key__": f"s{s:02d}i{i:02d}", "jpg": buf.getvalue(), "cls": s * 100 + i})
        urls.append(path)
    return urls
