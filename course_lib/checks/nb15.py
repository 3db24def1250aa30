"""Checks for notebook 15 (tokens, not images).

15.1 writes small token files with the learner's writer into a temporary folder, reads them back with their reader,
and truncates one. 15.2 draws window starts for tiny token counts, where every start can be listed. 15.3 packs
short documents whose greedy packing is known and compares the mask with the block-diagonal causal one. 15.4 draws
from the learner's mixer, stops, and resumes a new one from the saved state. 15.5 feeds the learner's audit step
logs whose answers are known. All run in well under a second.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ._core import Hint, attempted, exercise, require


@exercise(
    "15.1", "your token files hold every document, in the smallest dtype, memory-mapped, and refuse a truncation."
)
def token_file(write: Callable[..., Any], read: Callable[..., Any]) -> None:
    """``write(base, documents, vocab_size)`` writes ``base.bin``, ``base.idx``, ``base.json``; ``read(base)`` returns
    ``(tokens, offsets)``."""
    attempted(write, read)
    documents = [[5, 1, 7], [2], [9, 9, 3, 4], []]
    with tempfile.TemporaryDirectory(prefix="check15-") as folder:
        base = Path(folder) / "small"
        write(base, [np.asarray(d) for d in documents], 10)
        for suffix in (".bin", ".idx", ".json"):
            require(base.with_suffix(suffix).exists(), f"write(base, ...) should create {base.name}{suffix}.")
        flat = [t for d in documents for t in d]
        size = base.with_suffix(".bin").stat().st_size
        require(  # before reading: a reader that checks sizes would refuse these files with its own error
            size == 2 * len(flat),
            f"{base.name}.bin holds {size} bytes for {len(flat)} ids of a 10-token vocabulary: uint16 (2 bytes an id) "
            "holds every id below 65,536; convert the ids to the dtype before writing (np.asarray(d, dtype=...)).",
        )
        got = read(base)
        require(
            isinstance(got, (tuple, list)) and len(got) == 2, f"read(base) should return (tokens, offsets), got {got!r}"
        )
        tokens, offsets = got
        require(
            isinstance(tokens, np.memmap),
            f"tokens should be an np.memmap of {base.name}.bin (opened without reading it), "
            f"got {type(tokens).__name__}: use np.memmap(path, dtype=..., mode='r').",
        )
        require(
            tokens.mode == "r",
            f"tokens is a memory map opened with mode={tokens.mode!r}, which lets a reader write into the token file "
            "(np.memmap's default mode is 'r+'): open it read-only, np.memmap(path, dtype=..., mode='r').",
        )
        require(
            [int(t) for t in tokens] == flat,
            f"the tokens read back are {[int(t) for t in tokens]}, the documents hold {flat}: "
            "write them one after the other in one flat array, and read them with the dtype the manifest names.",
        )
        require(
            [int(o) for o in offsets] == [0, 3, 4, 8, 8],
            f"offsets should be where each document starts, and the end: [0, 3, 4, 8, 8], got {[int(o) for o in offsets]}.",
        )
        manifest = json.loads(base.with_suffix(".json").read_text())
        missing = [k for k in ("dtype", "vocab_size", "tokens", "documents") if k not in manifest]
        require(not missing, f"the manifest {base.name}.json lacks {missing}: a reader needs them to check the files.")

        big = Path(folder) / "big"
        write(big, [np.asarray([69_999, 1, 65_536])], 70_000)
        tokens, _ = read(big)
        require(
            [int(t) for t in tokens] == [69_999, 1, 65_536],
            f"a 70,000-token vocabulary read back as {[int(t) for t in tokens]}, not [69999, 1, 65536]: uint16 cannot "
            "hold ids above 65,535; choose uint32 when the vocabulary is larger.",
        )
        del tokens
        data = base.with_suffix(".bin").read_bytes()
        base.with_suffix(".bin").write_bytes(data[:-2])  # a copy that stopped early
        try:
            tokens, _ = read(base)
        except Exception:  # any clear error will do
            return
        raise Hint(
            f"read(base) accepted a truncated {base.name}.bin ({len(data) - 2} bytes, {len(tokens)} ids) whose "
            f"manifest says {manifest.get('tokens')} ids: compare the file's size with the manifest and raise an error."
        )


@exercise("15.2", "your windows come from (seed, epoch), reach the last start and never read past the end.")
def window_starts(fn: Callable[..., Any]) -> None:
    """``fn(n_tokens, seq_len, count, seed, epoch)`` -> the starts of ``count`` windows of ``seq_len + 1`` tokens."""
    attempted(fn)

    def starts(*args: int) -> list[int]:
        got = fn(*args)
        try:
            values = [int(s) for s in got]
        except TypeError:
            raise Hint(f"return a sequence of start positions (an array or a list), got {got!r}") from None
        require(len(values) == args[2], f"fn{args} returned {len(values)} starts, not count={args[2]}.")
        return values

    n, seq_len = 12, 4
    drawn = starts(n, seq_len, 400, 0, 0)
    require(min(drawn) >= 0, f"a start of {min(drawn)}: starts are positions in the token array, from 0.")
    last = n - seq_len - 1
    require(
        max(drawn) <= last,
        f"with {n} tokens and seq_len={seq_len}, a window starts at {max(drawn)} and reads past the end: a window holds "
        f"seq_len + 1 = {seq_len + 1} tokens (inputs and next-token targets), so the last start is "
        f"n_tokens - seq_len - 1 = {last}.",
    )
    require(
        set(drawn) == set(range(last + 1)),
        f"400 draws from {n} tokens with seq_len={seq_len} gave the starts {sorted(set(drawn))}, never "
        f"{sorted(set(range(last + 1)) - set(drawn))}: every start from 0 to {last} (included) should be possible; "
        "mind that `high` is exclusive in rng.integers(low, high).",
    )
    np.random.seed(1)
    torch.manual_seed(1)
    before = np.random.get_state()[1].copy(), torch.get_rng_state()
    first = starts(1000, 16, 50, 3, 0)
    require(
        np.array_equal(np.random.get_state()[1], before[0]) and torch.equal(torch.get_rng_state(), before[1]),
        "window_starts changed the global random state (np.random.seed, torch.manual_seed or a draw from them): "
        "everything else that draws at random in the process then changes with it. Draw from a generator of "
        "your own, np.random.default_rng([seed, epoch]).",
    )
    np.random.seed(2)
    torch.manual_seed(2)
    require(
        starts(1000, 16, 50, 3, 0) == first,
        "the same (seed, epoch) gave other windows after the global random state changed: draw from your own "
        "generator, np.random.default_rng([seed, epoch]).",
    )
    require(
        starts(1000, 16, 50, 3, 1) != first,
        "epoch 1 drew the same windows as epoch 0: seed the generator from (seed, epoch), so that each epoch draws anew.",
    )
    require(
        starts(1000, 16, 50, 4, 0) != first, "seed 4 drew the same windows as seed 3: the seed must change the draws."
    )
    require(
        starts(1000, 16, 50, 3, 1) != starts(1000, 16, 50, 4, 0),
        "seed 3's epoch 1 drew the same windows as seed 4's epoch 0: seeding with seed + epoch makes runs with "
        "neighbouring seeds share their epochs. Give the generator both numbers: np.random.default_rng([seed, epoch]).",
    )


def _expected_pack(documents: list[list[int]], seq_len: int, eos: int) -> tuple[list, list, list]:
    rows: list[list[tuple[int, list[int]]]] = [[]]
    free = seq_len
    for d, doc in enumerate(documents):
        piece = doc + [eos]
        if len(piece) > free:
            rows.append([])
            free = seq_len
        rows[-1].append((d, piece))
        free -= len(piece)
    tokens, positions, docs = [], [], []
    for row in rows:
        t = [x for _, p in row for x in p]
        tokens.append(t + [0] * (seq_len - len(t)))
        positions.append([i for _, p in row for i in range(len(p))] + [0] * (seq_len - len(t)))
        docs.append([d for d, p in row for _ in p] + [-1] * (seq_len - len(t)))
    return tokens, positions, docs


def _as_lists(value: Any, what: str) -> list[list[int]]:
    try:
        return [[int(x) for x in row] for row in value]
    except TypeError:
        raise Hint(f"{what} should be rows of numbers (a list of lists or a 2-D tensor), got {value!r}") from None


@exercise(
    "15.3", "your packer fills sequences greedily, restarts positions per document, and the mask keeps them apart."
)
def packer(pack_fn: Callable[..., Any], mask_fn: Callable[..., Any]) -> None:
    """``pack_fn(documents, seq_len, eos)`` -> ``(tokens, positions, doc_ids)``, rows of ``seq_len``, padding id 0 and
    document -1; ``mask_fn(doc_ids)`` -> booleans ``[rows, seq_len, seq_len]``, True where a query may attend a key."""
    attempted(pack_fn, mask_fn)
    documents, seq_len, eos = [[7, 8, 9], [4, 5], [6, 6, 6, 6], [3], [2, 2]], 8, 1
    want_t, want_p, want_d = _expected_pack(documents, seq_len, eos)
    got = pack_fn([list(d) for d in documents], seq_len, eos)
    require(
        isinstance(got, (tuple, list)) and len(got) == 3,
        f"return three things, `return tokens, positions, doc_ids`; got {type(got).__name__}",
    )
    tokens, positions, doc_ids = (_as_lists(g, name) for g, name in zip(got, ("tokens", "positions", "doc_ids")))
    require(
        all(len(r) == seq_len for r in tokens + positions + doc_ids),
        f"every row should hold seq_len={seq_len} entries (pad the end), got rows of {sorted({len(r) for r in tokens})}.",
    )
    flat = [x for row, d in zip(tokens, doc_ids) for x, i in zip(row, d) if i >= 0]
    require(  # the tokens right and only doc_ids wrong (padding's -1): the next check says so
        tokens == want_t or flat == [x for d in documents for x in d + [eos]],
        f"the documents {documents} with seq_len={seq_len}, eos={eos} packed as {tokens} (doc_ids {doc_ids}): "
        "each document should appear whole, in order, followed by eos.",
    )
    if tokens == want_t and doc_ids != want_d:
        padding = {d for row, want in zip(doc_ids, want_d) for d, w in zip(row, want) if w < 0}
        if all(d == w for row, want in zip(doc_ids, want_d) for d, w in zip(row, want) if w >= 0):
            raise Hint(
                f"the tokens are packed right, but padding has doc_ids {sorted(padding)}: give padding the document "
                "number -1, which no document has (0 is the first document's)."
            )
    require(
        tokens == want_t and doc_ids == want_d,
        f"greedy packing gives {want_t} with doc_ids {want_d}, got {tokens} and {doc_ids}: put each document "
        "(with its eos) in the current row if it fits, else start a new row; pad the rest with 0, document -1.",
    )
    if positions != want_p:
        starts = [
            (r, i) for r, row in enumerate(want_d) for i in range(1, seq_len) if row[i] >= 0 and row[i] != row[i - 1]
        ]
        hint = (
            "position ids that do not restart: each document's positions should count from 0 at its first token, "
            "as they would if it were alone"
            if any(positions[r][i] != 0 for r, i in starts)
            else "each document's positions should be 0, 1, 2, ... from its first token; padding 0"
        )
        raise Hint(f"positions {positions}, expected {want_p}: {hint}.")
    mask = mask_fn(torch.tensor(want_d))
    mask = torch.as_tensor(mask)
    require(
        mask.dtype == torch.bool and tuple(mask.shape) == (len(want_d), seq_len, seq_len),
        f"the mask should be booleans of shape ({len(want_d)}, {seq_len}, {seq_len}), got {mask.dtype} "
        f"{tuple(mask.shape)}.",
    )
    d = torch.tensor(want_d)
    same = d[:, :, None] == d[:, None, :]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    want = same & causal
    if not torch.equal(mask, want):
        if (mask & ~causal).any():
            raise Hint("the mask lets a token see later tokens: keep only keys k <= q (a lower triangle).")
        if (mask & ~same & (d[:, :, None] >= 0) & (d[:, None, :] >= 0)).any():
            raise Hint(
                "the mask lets a document see the one before it in the row: allow a key only when its doc_id "
                "equals the query's."
            )
        if not mask.any(-1).all():
            raise Hint(
                "some rows of the mask are all False (padding that sees nothing): attention's softmax then gives NaN. "
                "Let padding see padding: compare doc_ids as they are, -1 included."
            )
        raise Hint("the mask should be (doc_ids[q] == doc_ids[k]) & (k <= q) for every row.")


@exercise("15.4", "your mixer is exact within one block, seeded, and resumes from a few integers.")
def mixer(cls: Any) -> None:
    """``cls(weights, seed)``: ``next(m)`` gives a source name; ``state_dict()`` and ``load_state_dict()``."""
    attempted(cls)
    require(isinstance(cls, type), f"pass the class itself (e.g. `MyMixer`), not {cls!r}.")
    weights = {"docs": 7, "code": 3}
    m = cls(dict(weights), 0)
    draws = [next(m) for _ in range(1000)]
    require(
        set(draws) <= set(weights),
        f"next(mixer) should give a source name of {sorted(weights)}, got {sorted(set(draws) - set(weights))[:3]}",
    )
    worst, at, came = 0.0, 0, 0
    count = 0
    for n, name in enumerate(draws, 1):
        count += name == "docs"
        if abs(count - 0.7 * n) > worst:
            worst, at, came = abs(count - 0.7 * n), n, count
    require(  # blocks of 7 and 3 are never more than 2.1 away from 70 %; random draws drift further
        worst <= 3,
        f"after {at} draws, 'docs' came {came} times, not {0.7 * at:g} (70 %): draws with probabilities drift. Take "
        "blocks of 10 holding exactly 7 'docs' and 3 'code', in an order shuffled from (seed, block), so that any "
        "stretch is within one block of exact.",
    )
    blocks = {tuple(draws[i : i + 10]) for i in range(0, len(draws), 10)}
    require(
        len(blocks) > 1,
        f"every block of 10 came in the same order, {list(next(iter(blocks)))}: shuffle each block anew, from "
        "np.random.default_rng([seed, block]).",
    )
    again = cls(dict(weights), 0)
    require([next(again) for _ in range(1000)] == draws, "two mixers with the same seed gave different sources.")
    other = cls(dict(weights), 1)
    require(
        [next(other) for _ in range(100)] != draws[:100],
        "seed 1 gave the same sources as seed 0: draw each block's order from (seed, block).",
    )
    m = cls(dict(weights), 0)
    for _ in range(37):
        next(m)
    state = m.state_dict()
    try:
        small = len(json.dumps(state)) < 200
    except TypeError as exc:
        raise Hint(
            f"state_dict() gave {str(state)[:80]}, which json cannot save ({exc}): a checkpoint holds plain Python "
            "numbers; convert with int(...)."
        ) from None
    require(
        small,
        f"the state should be a few integers (how many draws were taken), not the history: got {str(state)[:80]}",
    )
    resumed = cls(dict(weights), 0)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    try:
        after = [next(resumed) for _ in range(50)]
    except Exception as exc:  # e.g. an order drawn only at a block's start, never drawn by the resumed mixer
        raise Hint(
            f"a new mixer given load_state_dict({state}) raised {type(exc).__name__}: {exc} at its first draws: it "
            "must draw from its state alone. Compute each block's order from (seed, block) whenever it is needed, "
            "np.random.default_rng([seed, block]).permutation(...), rather than keeping one made earlier."
        ) from None
    if after != draws[37:87]:
        replay = " it replays from the start: load_state_dict must set the position," if after == draws[:50] else ""
        raise Hint(
            f"stopped after 37 draws and resumed from state_dict(): the next were {after[:6]}..., an unstopped "
            f"mixer gave {draws[37:43]}...;{replay} and each draw must depend on (seed, position) only."
        )


@exercise("15.5", "your audit finds a repeated window and a stream that differs from the uninterrupted one.")
def audit(fn: Callable[..., Any]) -> None:
    """``fn(steps, reference)`` -> ``(repeated, first_difference)``: windows read twice, and the first (rank, step)
    whose windows differ from the reference, or ``None``."""
    attempted(fn)

    def steps(*ranks: list[list[list[Any]]]) -> dict[int, list[dict[str, Any]]]:
        return {r: [{"step": s + 1, "windows": w} for s, w in enumerate(rank)] for r, rank in enumerate(ranks)}

    a, b, c, d = ["docs", 0], ["docs", 64], ["code", 0], ["code", 64]
    e, f = ["docs", 128], ["docs", 192]
    reference = steps([[a], [b]], [[c], [d]])
    cases = [  # (steps, repeated, first difference)
        (steps([[a], [b]], [[c], [d]]), [], None),
        (steps([[a], [a]], [[c], [d]]), [a], (0, 2)),
        (steps([[a], [b]], [[c], [e]]), [], (1, 2)),
        (steps([[a], [b]], [[a], [d]]), [a], (1, 1)),
        (steps([[a, f], [b, e]], [[c], [d]]), [], (0, 1)),
        (steps([[a], [a]], [[a], [d]]), [a], (0, 2)),  # read three times: listed once
        (steps([[a, f], [b, a]], [[c], [d]]), [a], (0, 1)),  # a window, not a whole step, read twice
    ]
    for case, want_repeated, want_first in cases:
        got = fn(case, reference)
        require(
            isinstance(got, (tuple, list)) and len(got) == 2,
            f"return two things, `return repeated, first_difference`; got {got!r}",
        )
        repeated = sorted([str(w[0]), int(w[1])] for w in got[0])
        first = None if got[1] is None else (int(got[1][0]), int(got[1][1]))
        shown = {r: [s["windows"] for s in v] for r, v in case.items()}
        require(
            repeated == sorted(want_repeated),
            f"the ranks read {shown}: the windows read more than once are {sorted(want_repeated)}, got {repeated}. "
            "Count each (source, start) over every rank's steps, and list it once.",
        )
        require(
            first == want_first,
            f"the ranks read {shown}, the uninterrupted job {{r: ...}} = "
            f"{ {r: [s['windows'] for s in v] for r, v in reference.items()} }: the first (rank, step) that differs "
            f"is {want_first}, got {first}. Compare rank by rank, step by step, in order; None when all agree.",
        )
