"""course_lib.checks.nb15: right answers pass, stubs are "not attempted", and each wrong answer gets its own hint."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from course_lib.checks import Status, nb15
from exercise_status import right_and_stubs, status

pytestmark = pytest.mark.quick


def wrong(check, *answer) -> str:
    """The hint of an answer that must be ❌."""
    outcome, message = status(check, *answer)
    assert outcome is Status.WRONG, message
    return message


def stub(*args):
    raise NotImplementedError


# ----------------------------------------------------------------- 15.1: token files


def write_token_file(base, documents, vocab_size, dtype=None):
    """The notebook's solution."""
    base = Path(base)
    dtype = dtype or (np.uint16 if vocab_size <= 65536 else np.uint32)
    flat = np.concatenate([np.asarray(d, dtype=dtype) for d in documents])
    offsets = np.cumsum([0] + [len(d) for d in documents]).astype(np.int64)
    base.with_suffix(".bin").write_bytes(flat.tobytes())
    base.with_suffix(".idx").write_bytes(offsets.tobytes())
    manifest = {
        "dtype": np.dtype(dtype).name,
        "vocab_size": vocab_size,
        "tokens": len(flat),
        "documents": len(documents),
    }
    base.with_suffix(".json").write_text(json.dumps(manifest))


def read_token_file(base, check_size=True):
    base = Path(base)
    manifest = json.loads(base.with_suffix(".json").read_text())
    dtype = np.dtype(manifest["dtype"])
    if check_size and base.with_suffix(".bin").stat().st_size != manifest["tokens"] * dtype.itemsize:
        raise ValueError("truncated")
    tokens = np.memmap(base.with_suffix(".bin"), dtype=dtype, mode="r")
    return tokens, np.fromfile(base.with_suffix(".idx"), dtype=np.int64)


def always_uint32(base, documents, vocab_size):
    write_token_file(base, documents, vocab_size, dtype=np.uint32)


def always_uint16(base, documents, vocab_size):
    write_token_file(base, documents, vocab_size, dtype=np.uint16)


def read_into_memory(base):
    tokens, offsets = read_token_file(base)
    return np.array(tokens), offsets


def no_size_check(base):
    return read_token_file(base, check_size=False)


def no_manifest_counts(base, documents, vocab_size):
    write_token_file(base, documents, vocab_size)
    base.with_suffix(".json").write_text(json.dumps({"dtype": "uint16"}))


def read_manifest_less(base):
    tokens = np.memmap(Path(base).with_suffix(".bin"), dtype=np.uint16, mode="r")
    return tokens, np.fromfile(Path(base).with_suffix(".idx"), dtype=np.int64)


def starts_only_offsets(base, documents, vocab_size):
    write_token_file(base, documents, vocab_size)
    offsets = np.cumsum([0] + [len(d) for d in documents])[:-1].astype(np.int64)
    Path(base).with_suffix(".idx").write_bytes(offsets.tobytes())


def ids_as_int64(base, documents, vocab_size):
    """Names uint16 in the manifest but writes the ids as np.asarray made them (int64)."""
    base = Path(base)
    flat = np.concatenate([np.asarray(d) for d in documents])
    base.with_suffix(".bin").write_bytes(flat.tobytes())
    base.with_suffix(".idx").write_bytes(np.cumsum([0] + [len(d) for d in documents]).astype(np.int64).tobytes())
    manifest = {"dtype": "uint16", "vocab_size": vocab_size, "tokens": len(flat), "documents": len(documents)}
    base.with_suffix(".json").write_text(json.dumps(manifest))


def default_mode(base):
    """np.memmap without mode=: opened 'r+', for writing."""
    tokens, offsets = read_token_file(base)
    return np.memmap(tokens.filename, dtype=tokens.dtype), offsets


def test_15_token_file_right_and_stubs(tmp_path) -> None:
    assert status(nb15.token_file, write_token_file, read_token_file)[0] is Status.SOLVED
    assert status(nb15.token_file, ..., read_token_file)[0] is Status.NOT_ATTEMPTED
    assert status(nb15.token_file, stub, stub)[0] is Status.NOT_ATTEMPTED


@pytest.mark.parametrize(
    "write, read, hints",
    [
        (always_uint32, read_token_file, ["holds 32 bytes for 8 ids", "uint16 (2 bytes an id)"]),
        (always_uint16, read_token_file, ["read back as [4463, 1, 0]", "uint16 cannot hold ids above 65,535"]),
        (write_token_file, read_into_memory, ["should be an np.memmap", "got ndarray"]),
        (write_token_file, no_size_check, ["accepted a truncated small.bin", "manifest says 8 ids"]),
        (no_manifest_counts, read_manifest_less, ["lacks ['vocab_size', 'tokens', 'documents']"]),
        (starts_only_offsets, read_token_file, ["[0, 3, 4, 8, 8], got [0, 3, 4, 8]"]),
        # the reader's own size check would refuse these files: the check says what is wrong with them first
        (ids_as_int64, read_token_file, ["holds 64 bytes for 8 ids", "np.asarray(d, dtype=...)"]),
        (write_token_file, default_mode, ["mode='r+'", "open it read-only"]),
    ],
)
def test_15_token_file_wrong_answers(write, read, hints) -> None:
    message = wrong(nb15.token_file, write, read)
    assert all(hint in message for hint in hints), message


# ----------------------------------------------------------------- 15.2: window starts


def window_starts(n_tokens, seq_len, count, seed, epoch):
    """The notebook's solution."""
    rng = np.random.default_rng([seed, epoch])
    return rng.integers(0, n_tokens - seq_len, size=count)


def past_the_end(n_tokens, seq_len, count, seed, epoch):
    return np.random.default_rng([seed, epoch]).integers(0, n_tokens - seq_len + 1, size=count)


def never_the_last(n_tokens, seq_len, count, seed, epoch):
    return np.random.default_rng([seed, epoch]).integers(0, n_tokens - seq_len - 1, size=count)


def global_state(n_tokens, seq_len, count, seed, epoch):
    return np.random.randint(0, n_tokens - seq_len, size=count)


def seed_only(n_tokens, seq_len, count, seed, epoch):
    return np.random.default_rng(seed).integers(0, n_tokens - seq_len, size=count)


def epoch_only(n_tokens, seq_len, count, seed, epoch):
    return np.random.default_rng(epoch).integers(0, n_tokens - seq_len, size=count)


def reseeds_the_global_state(n_tokens, seq_len, count, seed, epoch):
    np.random.seed(seed * 1000 + epoch)
    return np.random.randint(0, n_tokens - seq_len, size=count)


def seed_plus_epoch(n_tokens, seq_len, count, seed, epoch):
    return np.random.default_rng(seed + epoch).integers(0, n_tokens - seq_len, size=count)


def too_few(n_tokens, seq_len, count, seed, epoch):
    return window_starts(n_tokens, seq_len, count, seed, epoch)[:-1]


def test_15_window_starts_right_and_stubs() -> None:
    right_and_stubs(nb15.window_starts, window_starts, stub)


@pytest.mark.parametrize(
    "fn, hints",
    [
        (past_the_end, ["a window starts at 8 and reads past the end", "the last start is n_tokens - seq_len - 1 = 7"]),
        (never_the_last, ["never [7]", "`high` is exclusive"]),
        (global_state, ["changed the global random state", "default_rng([seed, epoch])"]),
        (reseeds_the_global_state, ["changed the global random state", "a generator of your own"]),
        (seed_plus_epoch, ["seed 3's epoch 1 drew the same windows as seed 4's epoch 0", "seed + epoch"]),
        (seed_only, ["epoch 1 drew the same windows as epoch 0"]),
        (epoch_only, ["seed 4 drew the same windows as seed 3"]),
        (too_few, ["returned 399 starts, not count=400"]),
        (lambda *a: 3, ["return a sequence of start positions"]),
    ],
)
def test_15_window_starts_wrong_answers(fn, hints) -> None:
    message = wrong(nb15.window_starts, fn)
    assert all(hint in message for hint in hints), message


# ----------------------------------------------------------------- 15.3: the packer and its mask


def pack_documents(documents, seq_len, eos, restart=True, pad_doc=-1):
    """The notebook's solution."""
    tokens, positions, doc_ids = [[]], [[]], [[]]
    for d, doc in enumerate(documents):
        piece = list(doc) + [eos]
        if len(tokens[-1]) + len(piece) > seq_len:
            tokens.append([]), positions.append([]), doc_ids.append([])
        start = 0 if restart else len(tokens[-1])
        tokens[-1] += piece
        positions[-1] += list(range(start, start + len(piece)))
        doc_ids[-1] += [d] * len(piece)
    for row in range(len(tokens)):
        free = seq_len - len(tokens[row])
        tokens[row] += [0] * free
        positions[row] += [0] * free
        doc_ids[row] += [pad_doc] * free
    return torch.tensor(tokens), torch.tensor(positions), torch.tensor(doc_ids)


def document_mask(doc_ids):
    length = doc_ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return (doc_ids[:, :, None] == doc_ids[:, None, :]) & causal


def running_positions(documents, seq_len, eos):
    return pack_documents(documents, seq_len, eos, restart=False)


def no_eos(documents, seq_len, eos):
    return pack_documents([d[:-1] for d in documents], seq_len, eos)


def one_per_row(documents, seq_len, eos):
    rows = [pack_documents([doc], seq_len, eos) for doc in documents]
    tokens, positions, doc_ids = (torch.cat([r[i] for r in rows]) for i in range(3))
    for i in range(len(documents)):
        doc_ids[i][doc_ids[i] == 0] = i
    return tokens, positions, doc_ids


def padding_is_document_0(documents, seq_len, eos):
    return pack_documents(documents, seq_len, eos, pad_doc=0)


def causal_only(doc_ids):
    length = doc_ids.shape[-1]
    return torch.ones(length, length, dtype=torch.bool).tril().expand(doc_ids.shape[0], length, length).clone()


def not_causal(doc_ids):
    return doc_ids[:, :, None] == doc_ids[:, None, :]


def pads_see_nothing(doc_ids):
    return document_mask(doc_ids) & (doc_ids[:, :, None] >= 0)


def test_15_packer_right_and_stubs() -> None:
    assert status(nb15.packer, pack_documents, document_mask)[0] is Status.SOLVED
    assert status(nb15.packer, pack_documents, ...)[0] is Status.NOT_ATTEMPTED
    assert status(nb15.packer, stub, document_mask)[0] is Status.NOT_ATTEMPTED


@pytest.mark.parametrize(
    "pack_fn, mask_fn, hints",
    [
        (running_positions, document_mask, ["position ids that do not restart"]),
        (no_eos, document_mask, ["each document should appear whole, in order, followed by eos"]),
        (one_per_row, document_mask, ["greedy packing gives", "if it fits, else start a new row"]),
        (padding_is_document_0, document_mask, ["the tokens are packed right", "padding has doc_ids [0]", "-1"]),
        (pack_documents, causal_only, ["lets a document see the one before it"]),
        (pack_documents, not_causal, ["lets a token see later tokens"]),
        (pack_documents, pads_see_nothing, ["all False", "Let padding see padding"]),
        (lambda *a: [[1]], document_mask, ["return three things"]),
    ],
)
def test_15_packer_wrong_answers(pack_fn, mask_fn, hints) -> None:
    message = wrong(nb15.packer, pack_fn, mask_fn)
    assert all(hint in message for hint in hints), message


# ----------------------------------------------------------------- 15.4: the mixer


class MyMixer:
    """The notebook's solution."""

    def __init__(self, weights, seed):
        self.names = sorted(weights)
        self.slots = [name for name in self.names for _ in range(weights[name])]
        self.seed, self.taken = seed, 0

    def __iter__(self):
        return self

    def __next__(self):
        block, i = divmod(self.taken, len(self.slots))
        order = np.random.default_rng([self.seed, block]).permutation(len(self.slots))
        self.taken += 1
        return self.slots[order[i]]

    def state_dict(self):
        return {"taken": self.taken}

    def load_state_dict(self, state):
        self.taken = state["taken"]


class Probabilities(MyMixer):
    def __init__(self, weights, seed):
        super().__init__(weights, seed)
        self.rng = np.random.default_rng(seed)
        self.p = [weights[n] / sum(weights.values()) for n in self.names]

    def __next__(self):
        self.taken += 1
        return self.names[self.rng.choice(len(self.names), p=self.p)]


class ReplaysFromStart(MyMixer):
    def load_state_dict(self, state):
        pass


class History(MyMixer):
    def __init__(self, weights, seed):
        super().__init__(weights, seed)
        self.history = []

    def __next__(self):
        name = super().__next__()
        self.history.append(name)
        return name

    def state_dict(self):
        return {"history": list(self.history)}


class Unseeded(MyMixer):
    def __next__(self):
        block, i = divmod(self.taken, len(self.slots))
        order = np.random.default_rng(block).permutation(len(self.slots))
        self.taken += 1
        return self.slots[order[i]]


class NotResumableRandom(MyMixer):
    """Each block's order from a generator that runs on: resumed, it draws from the start of its stream."""

    def __init__(self, weights, seed):
        super().__init__(weights, seed)
        self.rng = np.random.default_rng(seed)
        self.order = None

    def __next__(self):
        block, i = divmod(self.taken, len(self.slots))
        if i == 0 or self.order is None:
            self.order = self.rng.permutation(len(self.slots))
        self.taken += 1
        return self.slots[self.order[i]]


class DrawsPerPosition(MyMixer):
    """The source drawn with probabilities from (seed, position): resumable, seeded, but not exact."""

    def __next__(self):
        p = [w / len(self.slots) for w in collections.Counter(self.slots).values()]
        names = list(collections.Counter(self.slots))
        choice = np.random.default_rng([self.seed, self.taken]).choice(len(names), p=p)
        self.taken += 1
        return names[choice]


class SameOrderEveryBlock(MyMixer):
    def __next__(self):
        block, i = divmod(self.taken, len(self.slots))
        order = np.random.default_rng(self.seed).permutation(len(self.slots))
        self.taken += 1
        return self.slots[order[i]]


class NumpyState(MyMixer):
    def state_dict(self):
        return {"taken": np.int64(self.taken)}


class OrderDrawnAtBlockStart(MyMixer):
    """One generator from __init__; each block's order drawn when the block starts: resumed mid-block, it has none."""

    def __init__(self, weights, seed):
        super().__init__(weights, seed)
        self.rng, self.order = np.random.default_rng(seed), None

    def __next__(self):
        block, i = divmod(self.taken, len(self.slots))
        if i == 0:
            self.order = self.rng.permutation(len(self.slots))
        self.taken += 1
        return self.slots[self.order[i]]


def test_15_mixer_right_and_stubs() -> None:
    class Stub:
        def __init__(self, weights, seed):
            raise NotImplementedError

    right_and_stubs(nb15.mixer, MyMixer, Stub)


@pytest.mark.parametrize(
    "cls, hints",
    [
        (Probabilities, ["draws with probabilities drift", "blocks of 10"]),
        (ReplaysFromStart, ["it replays from the start"]),
        (History, ["a few integers", "not the history"]),
        (Unseeded, ["seed 1 gave the same sources as seed 0"]),
        (NotResumableRandom, ["an unstopped mixer gave", "(seed, position) only"]),
        (MyMixer(dict(a=1), 0), ["pass the class itself"]),
        (DrawsPerPosition, ["draws with probabilities drift", "blocks of 10"]),
        (SameOrderEveryBlock, ["every block of 10 came in the same order", "default_rng([seed, block])"]),
        (NumpyState, ["which json cannot save", "int(...)"]),
        (OrderDrawnAtBlockStart, ["load_state_dict({'taken': 37}) raised TypeError", "from its state alone"]),
    ],
)
def test_15_mixer_wrong_answers(cls, hints) -> None:
    message = wrong(nb15.mixer, cls)
    assert all(hint in message for hint in hints), message


# ----------------------------------------------------------------- 15.5: the audit


def audit(steps, reference):
    """The notebook's solution."""
    counts = collections.Counter(tuple(w) for rank in steps.values() for s in rank for w in s["windows"])
    repeated = sorted([list(w) for w, c in counts.items() if c > 1])
    for rank in sorted(reference):
        for got, want in zip(steps[rank], reference[rank]):
            if got["windows"] != want["windows"]:
                return repeated, (rank, got["step"])
    return repeated, None


def per_rank_repeats(steps, reference):
    repeated = []
    for rank in steps.values():
        counts = collections.Counter(tuple(w) for s in rank for w in s["windows"])
        repeated += [list(w) for w, c in counts.items() if c > 1]
    return sorted(repeated), audit(steps, reference)[1]


def every_occurrence(steps, reference):
    held = [tuple(w) for rank in steps.values() for s in rank for w in s["windows"]]
    return sorted(list(w) for w in held if held.count(w) > 1), audit(steps, reference)[1]


def first_window_only(steps, reference):
    for rank in sorted(reference):
        for got, want in zip(steps[rank], reference[rank]):
            if got["windows"][0] != want["windows"][0]:
                return audit(steps, reference)[0], (rank, got["step"])
    return audit(steps, reference)[0], None


def rank_0_only(steps, reference):
    repeated, _ = audit(steps, reference)
    for got, want in zip(steps[0], reference[0]):
        if got["windows"] != want["windows"]:
            return repeated, (0, got["step"])
    return repeated, None


def repeats_after_the_first(steps, reference):
    """Each window seen before, listed again: once per extra read."""
    seen, repeated = set(), []
    for rank in steps.values():
        for s in rank:
            for w in s["windows"]:
                if tuple(w) in seen:
                    repeated.append(list(w))
                seen.add(tuple(w))
    return sorted(repeated), audit(steps, reference)[1]


def repeated_steps(steps, reference):
    """Whole steps compared, not windows."""
    counts = collections.Counter(json.dumps(s["windows"]) for rank in steps.values() for s in rank)
    return sorted(w for key, c in counts.items() if c > 1 for w in json.loads(key)), audit(steps, reference)[1]


def test_15_audit_right_and_stubs() -> None:
    right_and_stubs(nb15.audit, audit, stub)


@pytest.mark.parametrize(
    "fn, hints",
    [
        (per_rank_repeats, ["windows read more than once are [['docs', 0]], got []", "over every rank's steps"]),
        (every_occurrence, ["got [['docs', 0], ['docs', 0]]", "list it once"]),
        (first_window_only, ["is (0, 1), got None"]),
        (rank_0_only, ["is (1, 2), got None", "rank by rank"]),
        (lambda s, r: {"repeated": []}, ["return two things"]),
        (repeats_after_the_first, ["got [['docs', 0], ['docs', 0]]", "list it once"]),
        (repeated_steps, ["[['docs', 64], ['docs', 0]]]", "are [['docs', 0]], got []"]),
    ],
)
def test_15_audit_wrong_answers(fn, hints) -> None:
    message = wrong(nb15.audit, fn)
    assert all(hint in message for hint in hints), message
