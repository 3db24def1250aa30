"""The checks of notebook 09 that have a file of their own (the others are in test_checks.py): right answers pass,
stubs are 'not attempted', wrong ones get a specific hint."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import webdataset as wds

from course_lib.checks import Status, nb09
from exercise_status import right_and_stubs, status

pytestmark = pytest.mark.quick


def rotating(urls, seed, epoch, key=None, split=True, shuffle="list"):
    """Exercise 09.5's answer (the notebook's solution with the defaults), and its wrong forms through the keywords."""
    order = np.random.default_rng(key if key is not None else [seed, epoch]).permutation(len(urls)).tolist()
    if shuffle == "global":
        order = list(range(len(urls)))
        random.shuffle(order)
    shuffled = [urls[i] for i in order] if shuffle != "after split" else list(urls)
    stages = [wds.SimpleShardList(shuffled)]
    stages += [wds.split_by_node] if split else []
    stages += [wds.split_by_worker]
    stages += [wds.shuffle(10, seed=seed)] if shuffle == "after split" else []
    return wds.DataPipeline(*stages, wds.tarfile_to_samples(), wds.to_tuple("__key__", "cls"))


@pytest.mark.timeout(120)
def test_rotating_dataset() -> None:
    def stub(urls, seed, epoch):
        raise NotImplementedError

    right_and_stubs(nb09.rotating_dataset, rotating, stub)
    wrong = {
        "never the rank": lambda u, s, e: rotating(u, s, e, key=[s, e, int(os.environ.get("RANK", 0))]),
        "wds.split_by_node": lambda u, s, e: rotating(u, s, e, split=False),
        "not from the seed alone": lambda u, s, e: rotating(u, s, e, key=[s]),
        "shuffle the list identically": lambda u, s, e: rotating(u, s, e, shuffle="global"),
        "the share does not. Shuffle the URL list itself": lambda u, s, e: rotating(u, s, e, shuffle="after split"),
        "(key, label)": lambda u, s, e: (sample[1] for sample in rotating(u, s, e)),
    }
    for words, fn in wrong.items():
        outcome, message = status(nb09.rotating_dataset, fn)
        assert outcome is Status.WRONG and words in message, (words, message)


def test_stage_or_stream() -> None:
    def right(copy_s, shared, local, epochs, need_mb, free_mb):
        if need_mb > free_mb:
            return "stream"
        return "stage" if copy_s + epochs * local < epochs * shared else "stream"

    def stub(copy_s, shared, local, epochs, need_mb, free_mb):
        raise NotImplementedError

    right_and_stubs(nb09.stage_or_stream, right, stub)
    wrong = {
        "do not fit in the": lambda c, s, loc, e, n, f: "stage" if c + e * loc < e * s else "stream",
        "the copy must be repaid": lambda c, s, loc, e, n, f: "stage" if loc < s and n <= f else "stream",
        "once per job, not once per epoch": lambda c, s, loc, e, n, f: "stage" if n <= f and c + loc < s else "stream",
        "the epochs from the copy take time too": lambda c, s, loc, e, n, f: (
            "stage" if n <= f and c < e * s else "stream"
        ),
        'should return "stage" or "stream"': lambda c, s, loc, e, n, f: n <= f and c + e * loc < e * s,
    }
    for words, fn in wrong.items():
        outcome, message = status(nb09.stage_or_stream, fn)
        assert outcome is Status.WRONG and words in message, (words, message)


def test_with_epoch_value_multiplied_by_the_workers_says_they_share_the_epoch() -> None:
    """A learner who multiplies on the dataset (each worker yields n, so n × workers?) is told the rank's n batches
    are shared among its workers."""

    def times_workers(n, b, w, on):
        return n if on == "loader" or w == 0 else n * w

    outcome, message = status(nb09.with_epoch_value, times_workers)
    assert outcome is Status.WRONG and "shared among its 2 workers" in message, message
