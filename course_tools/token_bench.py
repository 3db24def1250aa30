"""``python -m course_lib bench tokens``: notebook 15's token files read by a DataLoader, against a raw read.

A fixed workload, stated in the output: the text corpus's ids (``python -m course_lib prepare --step text``, a 4,096
token byte-level BPE) written ``--repeat`` times as one token file (:func:`course_lib.tokens.write_tokens`), then read
three ways, interleaved in rounds (A B C, then C B A) and judged by the course's one rule for measured claims
(:mod:`course_lib.claims`):

* the **raw read** of the same bytes: the same windows, batch by batch, gathered from the memory map by the main
  process into an array of the file's dtype, no DataLoader, no tensors: the limit a loader can approach, measured
  first at batches of 256, 1,024 and ``--batch-size`` (the gather's speed depends on it), the fastest taken;
* **windows**: an epoch of shuffled windows of ``--seq-len + 1`` ids (:func:`course_lib.tokens.epoch_windows`)
  through a DataLoader of ``--workers`` worker processes, persistent (measured in their steady state, as in
  training, not their start), one task per batch as SPDL's and PyTorch's advice for memory-mapped data goes: a
  worker gathers a whole batch of ``--batch-size`` windows from the memory map in one indexing, in the file's own
  dtype (``uint16``: the training step takes ``.long()`` of it, as it would move it to the GPU);
* **packed**: the documents packed greedily into rows of ``--seq-len`` through the same DataLoader: the plan made
  once (where each id of each row comes from, as Megatron's sample index), a batch one gather from the memory map,
  with its position ids and document ids.

Rates are in bytes of the file per second, so that the three compare; sequences per second beside them. The goal:
windows with 2 workers at least 0.5x the raw read. The file read in order, whole, from the page cache, is printed
as context (no loader of random windows comes near it). The packer's own throughput (:func:`course_lib.tokens.pack`,
in the main process, on the corpus's documents) is printed too, in tokens per second.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from course_lib import claims, tokens

GOAL_WINDOWS = 0.5  # windows through the DataLoader / the raw read, bytes per second


class WindowBatches(Dataset):
    """Item ``b``: batch ``b`` of ``starts``' windows of ``seq_len + 1`` ids, gathered from the token file's memory
    map in one indexing, as one tensor of the file's dtype (load it with ``batch_size=None``)."""

    def __init__(self, file: tokens.TokenFile, starts: np.ndarray, seq_len: int, batch_size: int) -> None:
        self.file, self.starts, self.batch_size = file, np.asarray(starts), batch_size
        self.span = np.arange(seq_len + 1)

    def __len__(self) -> int:
        return -(-len(self.starts) // self.batch_size)

    def __getitem__(self, b: int) -> torch.Tensor:
        starts = self.starts[b * self.batch_size : (b + 1) * self.batch_size]
        return torch.from_numpy(self.file.tokens[starts[:, None] + self.span])


class PackedBatches(Dataset):
    """Item ``b``: batch ``b`` of a greedy packing of a token file's documents into rows of ``seq_len``, as
    ``(tokens, positions, documents)``: tokens in the file's dtype, position ids restarting at every document,
    document numbers (``-1``: padding). The plan is made once, as Megatron's sample index is: for every row, where each
    of its ids comes from in the file; a batch is then one gather from the memory map."""

    def __init__(self, file: tokens.TokenFile, seq_len: int, batch_size: int) -> None:
        self.file, self.seq_len, self.batch_size = file, seq_len, batch_size
        rows: list[list[tuple[int, int, int]]] = [[]]  # (document, start, length) per piece
        free = seq_len
        for doc in range(len(file)):
            start, end = int(file.offsets[doc]), int(file.offsets[doc + 1])
            for piece in range(start, end, seq_len):
                n = min(seq_len, end - piece)
                if n > free:
                    rows.append([])
                    free = seq_len
                rows[-1].append((doc, piece, n))
                free -= n
        self.source = np.zeros((len(rows), seq_len), dtype=np.int64)  # where each id comes from in the file
        self.positions = np.zeros((len(rows), seq_len), dtype=np.int32)
        self.documents = np.full((len(rows), seq_len), -1, dtype=np.int32)
        for r, pieces in enumerate(rows):
            at = 0
            for doc, start, n in pieces:
                self.source[r, at : at + n] = np.arange(start, start + n)
                self.positions[r, at : at + n] = np.arange(n)
                self.documents[r, at : at + n] = doc
                at += n

    def __len__(self) -> int:
        return -(-len(self.source) // self.batch_size)

    def rows(self) -> int:
        return len(self.source)

    def __getitem__(self, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        at = slice(b * self.batch_size, (b + 1) * self.batch_size)
        ids = self.file.tokens[self.source[at]]
        ids[self.documents[at] < 0] = 0  # padding
        return torch.from_numpy(ids), torch.from_numpy(self.positions[at]), torch.from_numpy(self.documents[at])


def raw_read(path: Path, piece: int = 1 << 20) -> float:
    """Seconds to read ``path`` in order into one reused buffer."""
    buffer = bytearray(piece)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buffer):
            pass
    return time.perf_counter() - start


def gather(file: tokens.TokenFile, starts: np.ndarray, seq_len: int, batch_size: int) -> float:
    """Seconds to gather every window of ``starts`` from the memory map, a batch at a time, in the main process."""
    span = np.arange(seq_len + 1)
    start = time.perf_counter()
    for i in range(0, len(starts), batch_size):
        file.tokens[starts[i : i + batch_size, None] + span]
    return time.perf_counter() - start


def one_pass(loader: DataLoader) -> Callable[[], float]:
    """Seconds for one pass of ``loader`` (persistent workers: the steady state of training, not their start)."""

    def run() -> float:
        start = time.perf_counter()
        for _ in loader:
            pass
        return time.perf_counter() - start

    return run


def run_token_bench(args: argparse.Namespace, log: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    tokens.prepare_corpus(args.root)
    corpus = tokens.read_corpus(args.root)
    texts = corpus["docs"] + corpus["code"]
    tokenizer = tokens.train_tokenizer(texts, vocab_size=4096)
    ids = tokens.encode_documents(tokenizer, texts)
    eos = tokenizer.token_to_id(tokens.EOS)
    start = time.perf_counter()
    packed = tokens.pack(ids, args.seq_len, eos)
    pack_s = time.perf_counter() - start
    pack_rate = sum(len(d) + 1 for d in ids) / pack_s
    log(f"packer: {len(packed.tokens)} rows of {args.seq_len} from {len(ids)} documents, {pack_rate:,.0f} tokens/s")

    with tempfile.TemporaryDirectory(prefix="token-bench-", dir=args.out) as folder:
        file = tokens.write_tokens(Path(folder) / "corpus", ids * args.repeat, tokenizer.get_vocab_size())
        nbytes = file.n_tokens * file.dtype.itemsize
        log(f"token file: {file.n_tokens:,} tokens, {nbytes / 1e6:.1f} MB ({args.repeat} copies of the corpus)")
        starts = tokens.epoch_windows(file.n_tokens, args.seq_len, seed=0, epoch=0)
        windows = WindowBatches(file, starts, args.seq_len, args.batch_size)
        rows = PackedBatches(file, args.seq_len, args.batch_size)
        window_bytes = len(starts) * (args.seq_len + 1) * file.dtype.itemsize
        packed_bytes = nbytes

        def loader(dataset: Dataset, batch_size: int | None) -> DataLoader:
            return DataLoader(
                dataset, batch_size=batch_size, num_workers=args.workers, persistent_workers=args.workers > 0
            )

        sequential = nbytes / min(raw_read(file.base.with_suffix(".bin")) for _ in range(3))  # warm, then measured
        sweep = {
            b: min(gather(file, starts, args.seq_len, b) for _ in range(2))
            for b in sorted({256, 1024, args.batch_size})
        }
        raw_batch = min(sweep, key=sweep.__getitem__)
        log(
            "raw gathers, by batch size: "
            + ", ".join(f"{b}: {window_bytes / s / 1e6:.0f} MB/s" for b, s in sweep.items())
            + f"; batches of {raw_batch} taken as the raw read"
        )
        window_loader, packed_loader = loader(windows, None), loader(rows, None)
        variants = {
            "raw": lambda: gather(file, starts, args.seq_len, raw_batch),
            "windows": one_pass(window_loader),
            "packed": one_pass(packed_loader),
        }
        for name in ("windows", "packed"):
            variants[name]()  # warm: workers started once, pages mapped
        rounds = claims.interleave(variants, rounds=args.rounds)
        rates = {
            "raw": [window_bytes / s for s in rounds.values["raw"]],
            "windows": [window_bytes / s for s in rounds.values["windows"]],
            "packed": [packed_bytes / s for s in rounds.values["packed"]],
        }
        ratios = {name: [a / b for a, b in zip(rates[name], rates["raw"])] for name in ("windows", "packed")}
        del variants, window_loader, packed_loader  # their persistent workers stop here, before the file goes
        goal = claims.claim(
            f"windows through {args.workers} workers read at least {GOAL_WINDOWS}x as fast as the raw read",
            ratios["windows"],
            above=GOAL_WINDOWS,
            load=rounds,
        )
        return {
            "workers": args.workers,
            "seq_len": args.seq_len,
            "batch_size": args.batch_size,
            "mb": nbytes / 1e6,
            "sequential_mb_per_s": sequential / 1e6,
            "mb_per_s": {name: float(np.median(r)) / 1e6 for name, r in rates.items()},
            "sequences_per_s": {
                "windows": len(starts) / float(np.median(rounds.values["windows"])),
                "packed": rows.rows() / float(np.median(rounds.values["packed"])),
            },
            "ratios": {name: float(np.median(r)) for name, r in ratios.items()},
            "pack_tokens_per_s": pack_rate,
            "claim": str(goal),
            "goals": {"windows": goal.holds is not False},
        }


def token_report(result: dict[str, Any]) -> list[str]:
    mb, seq = result["mb_per_s"], result["sequences_per_s"]
    return [
        f"token file of {result['mb']:.1f} MB, sequences of {result['seq_len']} ids, batches of "
        f"{result['batch_size']}, {result['workers']} workers",
        f"the file read in order from the page cache: {result['sequential_mb_per_s']:.0f} MB/s (context)",
        f"raw read of the windows' bytes (main process, no loader): {mb['raw']:.0f} MB/s",
        f"windows:   {mb['windows']:.0f} MB/s, {seq['windows']:,.0f} sequences/s, {result['ratios']['windows']:.2f}x raw",
        f"packed:    {mb['packed']:.0f} MB/s, {seq['packed']:,.0f} sequences/s, {result['ratios']['packed']:.2f}x raw",
        f"packer (main process): {result['pack_tokens_per_s']:,.0f} tokens/s",
        result["claim"],
    ]


def add_arguments(p: argparse.ArgumentParser, at_least: Callable[[int], Callable[[str], int]]) -> None:
    p.add_argument("--root", help="data folder holding the text corpus (default: $COURSE_DATA_DIR or the cache)")
    p.add_argument("--out", help="folder for the temporary token file (default: the temporary directory)")
    p.add_argument("--repeat", type=at_least(1), default=64, help="copies of the corpus in the file (default: 64)")
    p.add_argument("--seq-len", type=at_least(8), default=1024, help="ids per sequence (default: %(default)s)")
    p.add_argument("--batch-size", type=at_least(1), default=1024, help="windows per batch (default: %(default)s)")
    p.add_argument("--workers", type=at_least(0), default=2, help="DataLoader worker processes (default: 2)")
    p.add_argument("--rounds", type=at_least(3), default=5, help="rounds; medians count (default: %(default)s)")
    p.add_argument("--check", action="store_true", help="exit with status 1 if the goal is missed (default: always 0)")
