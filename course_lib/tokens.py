"""Notebook 15: tokens, not images. A language model's data path, and ``torchrun -m course_lib.tokens``.

The pieces, in the order the notebook teaches them: a text corpus fixed by a snapshot in the data folder (Python's
own reference documentation and named standard-library modules, copied once with checksums by ``python -m
course_lib prepare text``); a byte-level BPE tokenizer trained on it with Hugging Face ``tokenizers``; token files
(one flat array of ids, an index of document offsets and a manifest, read through ``np.memmap``); windows drawn
from (seed, epoch) against an epoch that visits every token once; documents packed into fixed-length sequences
with position ids and a block-diagonal causal mask, and a small transformer to train on them; two sources mixed by
weight with a state of a few integers; and :class:`TokenLoader`, one loader per data-parallel rank whose state
``torch.distributed.checkpoint`` saves through the ``Stateful`` protocol.

The program: every rank reads its share of the mixed windows, logs what each step read to ``rankN.steps.jsonl``
in ``--report``, saves its loader's state with DCP after ``--stop-at`` and exits; started again with the same
``--ckpt``, it resumes from that state. A job started with another number of ranks than the one that saved is
refused with what to do.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import Dataset

from . import data, distributed
from ._programs import one_line, run_on_one_rank
from .support import check_int, new_file, new_folder, write_atomic

__all__ = [
    "CORPUS_FILES",
    "EOS",
    "LoaderStateError",
    "Mixer",
    "TinyLM",
    "TokenDataError",
    "TokenFile",
    "TokenLoader",
    "WindowDataset",
    "block_causal_mask",
    "coverage",
    "encode_documents",
    "epoch_windows",
    "pack",
    "pad_each",
    "prepare_corpus",
    "random_windows",
    "read_corpus",
    "read_steps",
    "train_step",
    "train_tokenizer",
    "write_tokens",
]

#: The snapshot's folder name in the data folder; a new selection gets a new name.
CORPUS_NAME = "text-corpus-v1"
#: What the snapshot holds, from Python 3.11.7's standard library: the reference documentation's topics (one source,
#: English prose) and named modules (the other source, code). Their text changes with Python's patch release, so
#: the course ships them (``course_lib/corpus/``, with Python's licence) and every machine reads the same text.
CORPUS_FILES = {
    "docs": ("pydoc_data/topics.py",),
    "code": (
        "bisect.py",
        "calendar.py",
        "colorsys.py",
        "fnmatch.py",
        "heapq.py",
        "json/decoder.py",
        "json/encoder.py",
        "shlex.py",
        "string.py",
        "textwrap.py",
    ),
}
#: The shipped snapshot (a tar file compressed with xz, 150 kB) and the Python release its files come from.
CORPUS_ARCHIVE = Path(__file__).with_name("corpus") / f"{CORPUS_NAME}.tar.xz"
CORPUS_PYTHON = "3.11.7"
#: The end-of-document token, the tokenizer's only special token (id 0).
EOS = "<|endoftext|>"
_MANIFEST = "manifest.json"


class TokenDataError(data.DataError):
    """Notebook 15: a corpus snapshot or a token file that is missing, damaged or cannot hold what it should; the
    message says what to do."""


class LoaderStateError(RuntimeError):
    """Notebook 15, section 7: a loader state this loader cannot resume from; the message says what to do."""


# --------------------------------------------------------------------------- 1 · the corpus snapshot
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _corpus_folder(root: str | os.PathLike[str] | None = None) -> Path:
    """Where the snapshot lives in the data folder (``$COURSE_DATA_DIR`` or the cache)."""
    return data.data_dir(root) / CORPUS_NAME


def prepare_corpus(root: str | os.PathLike[str] | None = None, force: bool = False) -> Path:
    """Notebook 15, section 1: the corpus snapshot, unpacked once from the archive the course ships
    (:data:`CORPUS_ARCHIVE`, files of Python 3.11.7's standard library) into the data folder with a manifest (each
    file's size and SHA-256); an existing complete one is reused, so every run, on any Python, reads the same text."""
    final = _corpus_folder(root)
    if (final / _MANIFEST).exists() and not force:
        return final
    wanted = {f"{source}/{name}" for source, names in CORPUS_FILES.items() for name in names}
    with new_folder(final, _MANIFEST, TokenDataError) as tmp:
        try:
            with tarfile.open(CORPUS_ARCHIVE, "r:xz") as tar:
                found = {m.name for m in tar.getmembers() if m.isfile()}
                if not wanted <= found:
                    raise TokenDataError(
                        f"{CORPUS_ARCHIVE} lacks {sorted(wanted - found)}: reinstall the course (git checkout "
                        "course_lib/corpus)"
                    )
                for name in sorted(wanted | {"LICENSE.txt"} & found):  # names of ours only: nothing lands elsewhere
                    (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                    (tmp / name).write_bytes(tar.extractfile(name).read())
        except (OSError, tarfile.TarError, EOFError) as exc:
            raise TokenDataError(
                f"cannot read the shipped text {CORPUS_ARCHIVE} ({exc}): reinstall the course (git checkout "
                "course_lib/corpus)"
            ) from None
        files = {name: {"bytes": (tmp / name).stat().st_size, "sha256": _sha256(tmp / name)} for name in sorted(wanted)}
        manifest = {"python": CORPUS_PYTHON, "files": files}
        write_atomic(tmp / _MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return final


def verify_corpus(root: str | os.PathLike[str] | None = None, checksums: bool = True) -> dict[str, Any]:
    """The snapshot's manifest after checking every file's size (and, with ``checksums``, its SHA-256)."""
    folder = _corpus_folder(root)
    if not (folder / _MANIFEST).exists():
        raise TokenDataError(
            f"no text corpus in {folder.parent}: run `python -m course_lib prepare --step text` "
            "(or `prepare --all`) once, on a machine with this course installed"
        )
    manifest = json.loads((folder / _MANIFEST).read_text())
    for name, want in manifest["files"].items():
        path = folder / name
        size = path.stat().st_size if path.is_file() else None
        if size != want["bytes"] or (checksums and _sha256(path) != want["sha256"]):
            raise TokenDataError(
                f"{CORPUS_NAME}/{name} differs from its manifest (damaged or edited): "
                "run `python -m course_lib prepare --step text --force` to copy it again"
            )
    return manifest


def _topics(path: Path) -> list[str]:
    """The reference documentation's topics (``pydoc_data/topics.py`` is one dict literal), sorted by name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "topics":
            topics = ast.literal_eval(node.value)  # a literal: nothing in the file runs
            return [topics[key] for key in sorted(topics)]
    raise TokenDataError(
        f"{path.name} holds no `topics = {{...}}`: run `python -m course_lib prepare --step text --force`"
    )


def _definitions(path: Path) -> list[str]:
    """A module's top-level functions and classes, each one document, in file order."""
    source = path.read_text(encoding="utf-8")
    nodes = ast.parse(source).body
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [ast.get_source_segment(source, n) or "" for n in nodes if isinstance(n, defs)]


def read_corpus(root: str | os.PathLike[str] | None = None) -> dict[str, list[str]]:
    """Notebook 15, section 1: the snapshot's documents by source: ``"docs"``, one per documentation topic, and
    ``"code"``, one per top-level function or class of the named modules. Sizes are checked, not checksums (the
    notebook's first cell would read every byte twice)."""
    folder = _corpus_folder(root)
    manifest = verify_corpus(root, checksums=False)
    documents: dict[str, list[str]] = {source: [] for source in CORPUS_FILES}
    for name in sorted(manifest["files"]):
        source = name.split("/", 1)[0]
        read = _topics if name.endswith("topics.py") else _definitions
        documents[source].extend(read(folder / name))
    return documents


# --------------------------------------------------------------------------- 2 · tokenizing
def train_tokenizer(texts: Sequence[str], vocab_size: int = 4096) -> Any:
    """Notebook 15, section 2: a byte-level BPE tokenizer (GPT-2's scheme: every byte is a token to start with, so
    any text encodes) trained on ``texts``, with :data:`EOS` as id 0. Training is deterministic for the same texts
    and ``tokenizers`` release (the notebook checks it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    check_int(vocab_size, "vocab_size", 257)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def encode_documents(tokenizer: Any, texts: Sequence[str], batch_size: int = 256) -> list[np.ndarray]:
    """Notebook 15, section 2: each text's token ids as a ``uint32`` array, encoded ``batch_size`` texts at a time
    (``encode_batch`` spreads a batch over the tokenizer's own threads)."""
    out: list[np.ndarray] = []
    for i in range(0, len(texts), batch_size):
        out.extend(np.asarray(e.ids, dtype=np.uint32) for e in tokenizer.encode_batch(list(texts[i : i + batch_size])))
    return out


# --------------------------------------------------------------------------- 3 · token files
def _token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned type that holds every id of a vocabulary: ``uint16`` up to 65,536 tokens."""
    check_int(vocab_size, "vocab_size", 1)
    for dtype in (np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise TokenDataError(f"a vocabulary of {vocab_size} tokens does not fit 32-bit ids")


def write_tokens(
    base: str | os.PathLike[str], documents: Sequence[np.ndarray], vocab_size: int, dtype: Any = None
) -> TokenFile:
    """Notebook 15, section 3: ``documents`` (arrays of token ids) as one token file: ``base.bin``, every id one
    after the other; ``base.idx``, the ``int64`` offset where each document starts, and the end; and
    ``base.json``, the manifest (dtype, vocabulary size, counts, each file's SHA-256), written **last**: a reader
    opens a token file through its manifest, so a writer killed half-way leaves no file a reader takes for whole.
    Every file is written to a temporary name and renamed (atomic)."""
    base = Path(base)
    dtype = np.dtype(dtype) if dtype is not None else _token_dtype(vocab_size)
    if dtype.kind != "u" or vocab_size - 1 > np.iinfo(dtype).max:
        raise TokenDataError(
            f"{dtype.name} cannot hold the ids of a {vocab_size}-token vocabulary (largest id {vocab_size - 1}): "
            f"write with dtype {_token_dtype(vocab_size).name}, or leave dtype out"
        )
    offsets = np.zeros(len(documents) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(d) for d in documents])
    digest = hashlib.sha256()
    base.parent.mkdir(parents=True, exist_ok=True)
    with new_file(base.with_suffix(".bin")) as f:
        for i, doc in enumerate(documents):
            doc = np.asarray(doc)
            if doc.size and (doc.min() < 0 or doc.max() >= vocab_size):
                raise TokenDataError(f"document {i} holds id {int(doc.max())}, outside a {vocab_size}-token vocabulary")
            chunk = doc.astype(dtype).tobytes()
            digest.update(chunk)
            f.write(chunk)
    write_atomic(base.with_suffix(".idx"), offsets.tobytes())
    manifest = {
        "dtype": dtype.name,
        "vocab_size": int(vocab_size),
        "tokens": int(offsets[-1]),
        "documents": len(documents),
        "sha256": digest.hexdigest(),
        "idx_sha256": hashlib.sha256(offsets.tobytes()).hexdigest(),
    }
    write_atomic(base.with_suffix(".json"), json.dumps(manifest, indent=1) + "\n")
    return TokenFile(base)


class TokenFile:
    """Notebook 15, section 3: a token file written by :func:`write_tokens`, opened without reading it.

    ``tokens`` is a read-only ``np.memmap`` of every id: slicing it reads only the pages the slice touches.
    ``document(i)`` and ``window(start, length)`` are views of it, not copies. Opening checks the manifest against
    the files' sizes; :meth:`verify` also checks the checksums (it reads every byte)."""

    def __init__(self, base: str | os.PathLike[str]) -> None:
        self.base = Path(base)
        meta = self.base.with_suffix(".json")
        if not meta.exists():
            raise TokenDataError(
                f"no manifest {meta.name} beside {self.base.name}.bin: the file was never finished; write it again "
                "with write_tokens"
            )
        self.manifest = json.loads(meta.read_text())
        self.dtype = np.dtype(self.manifest["dtype"])
        self.vocab_size = int(self.manifest["vocab_size"])
        n, docs = int(self.manifest["tokens"]), int(self.manifest["documents"])
        for suffix, want in ((".bin", n * self.dtype.itemsize), (".idx", (docs + 1) * 8)):
            path = self.base.with_suffix(suffix)
            size = path.stat().st_size if path.exists() else 0
            if size != want:
                raise TokenDataError(
                    f"{path.name} holds {size:,} bytes, its manifest says {want:,}: the file is truncated or "
                    "from another write; write the token file again"
                )
        # np.memmap cannot map an empty file: a token file of empty documents gets an empty array
        self.tokens = (
            np.memmap(self.base.with_suffix(".bin"), dtype=self.dtype, mode="r", shape=(n,))
            if n
            else (np.zeros(0, self.dtype))
        )
        self.offsets = np.fromfile(self.base.with_suffix(".idx"), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1])

    def document(self, i: int) -> np.ndarray:
        """Document ``i``'s ids: a view of the memory map."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"document {i} of a token file of {len(self)} documents (0..{len(self) - 1})")
        i %= len(self)
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def window(self, start: int, length: int) -> np.ndarray:
        """``length`` ids from ``start``, across documents: a view of the memory map."""
        if start < 0 or start + length > self.n_tokens:
            raise IndexError(
                f"the window [{start}, {start + length}) reads past the end of the {self.n_tokens:,} tokens: "
                f"the last window of {length} starts at {self.n_tokens - length}"
            )
        return self.tokens[start : start + length]

    def verify(self) -> None:
        """Check both files' SHA-256 against the manifest (reads every byte)."""
        for suffix, key in ((".bin", "sha256"), (".idx", "idx_sha256")):
            if _sha256(self.base.with_suffix(suffix)) != self.manifest[key]:
                raise TokenDataError(f"{self.base.name}{suffix} differs from its manifest: write it again")

    def __repr__(self) -> str:
        return (
            f"TokenFile({self.base.name}: {self.n_tokens:,} tokens in {len(self)} documents, {self.dtype.name}, "
            f"vocabulary {self.vocab_size})"
        )


# --------------------------------------------------------------------------- 4 · windows
def random_windows(n_tokens: int, seq_len: int, count: int, seed: int, epoch: int) -> np.ndarray:
    """Notebook 15, section 4: ``count`` random start positions of windows of ``seq_len + 1`` tokens (inputs and
    their next-token targets) in ``n_tokens``, drawn from (seed, epoch): nanoGPT's sampling, made reproducible."""
    if n_tokens < seq_len + 1:
        raise ValueError(f"{n_tokens} tokens hold no window of {seq_len + 1}")
    rng = np.random.default_rng([seed, epoch])
    return rng.integers(0, n_tokens - seq_len, size=count)  # the last start is n_tokens - seq_len - 1


def epoch_windows(n_tokens: int, seq_len: int, seed: int, epoch: int) -> np.ndarray:
    """Notebook 15, section 4: the starts of the non-overlapping windows (every ``seq_len`` tokens, each reading
    ``seq_len + 1``), in an order drawn from (seed, epoch): one epoch gives every token to one window's inputs."""
    starts = np.arange(0, n_tokens - seq_len, seq_len)
    return starts[np.random.default_rng([seed, epoch]).permutation(len(starts))]


def coverage(starts: np.ndarray, seq_len: int, n_tokens: int) -> float:
    """Notebook 15, section 4: the share of ``n_tokens`` that at least one window's inputs (``seq_len`` tokens from each start) hold."""
    seen = np.zeros(n_tokens + 1, dtype=np.int64)
    np.add.at(seen, np.asarray(starts), 1)
    np.add.at(seen, np.asarray(starts) + seq_len, -1)
    return float((np.cumsum(seen)[:n_tokens] > 0).mean())


class WindowDataset(Dataset):
    """Notebook 15, section 5: item ``i`` is the window of ``seq_len + 1`` ids at ``starts[i]`` of a token file,
    as an ``int64`` tensor (the only copy: the window's own bytes)."""

    def __init__(self, file: TokenFile, starts: np.ndarray, seq_len: int) -> None:
        self.file, self.starts, self.seq_len = file, np.asarray(starts), seq_len

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.from_numpy(self.file.window(int(self.starts[i]), self.seq_len + 1).astype(np.int64))

    def __getitems__(self, indices: Sequence[int]) -> list[torch.Tensor]:
        """A whole batch in one gather from the memory map (the DataLoader asks for a batch's items at once)."""
        starts = self.starts[np.asarray(indices)]
        if len(starts) and starts.max() + self.seq_len + 1 > self.file.n_tokens:
            self.file.window(int(starts.max()), self.seq_len + 1)  # raises the error that says which window
        rows = self.file.tokens[starts[:, None] + np.arange(self.seq_len + 1)].astype(np.int64)
        return list(torch.from_numpy(rows))


# --------------------------------------------------------------------------- 5 · packing
@dataclass
class Packed:
    """Notebook 15, section 5: a batch of sequences of equal length. ``documents`` holds each token's document
    number (``-1``: padding); ``positions`` each token's position in its document; ``labels`` the next token of the
    same document, or ``-100`` (ignored by the loss) at a document's last token and on padding."""

    tokens: torch.Tensor
    positions: torch.Tensor
    documents: torch.Tensor
    labels: torch.Tensor

    @property
    def pad_share(self) -> float:
        return float((self.documents < 0).float().mean())

    @property
    def useful_tokens(self) -> int:
        """Tokens the loss learns from."""
        return int((self.labels != -100).sum())


def _batch(rows: list[list[tuple[int, np.ndarray]]], seq_len: int, pad: int) -> Packed:
    shape = (len(rows), seq_len)
    tokens = torch.full(shape, pad, dtype=torch.int64)
    positions = torch.zeros(shape, dtype=torch.int64)
    documents = torch.full(shape, -1, dtype=torch.int64)
    for r, row in enumerate(rows):
        at = 0
        for doc, piece in row:
            n = len(piece)
            tokens[r, at : at + n] = torch.from_numpy(piece.astype(np.int64))
            positions[r, at : at + n] = torch.arange(n)
            documents[r, at : at + n] = doc
            at += n
    labels = torch.full(shape, -100, dtype=torch.int64)
    same = (documents[:, 1:] == documents[:, :-1]) & (documents[:, :-1] >= 0)
    labels[:, :-1] = torch.where(same, tokens[:, 1:], -100)
    return Packed(tokens, positions, documents, labels)


def _pieces(documents: Sequence[np.ndarray], seq_len: int, eos: int) -> Iterator[np.ndarray]:
    """Each document with its end-of-document token, cut into pieces of at most ``seq_len``."""
    for doc in documents:
        whole = np.append(np.asarray(doc, dtype=np.int64), eos)
        for i in range(0, len(whole), seq_len):
            yield whole[i : i + seq_len]


def pack(documents: Sequence[np.ndarray], seq_len: int, eos: int, pad: int = 0) -> Packed:
    """Notebook 15, section 5: greedy packing. Each document gets ``eos`` at its end (one longer than ``seq_len``
    is cut into pieces, each its own document from then on) and goes into the current sequence if it fits, else
    starts the next one; what is left at a sequence's end is padding. Position ids restart at 0 in every document."""
    rows: list[list[tuple[int, np.ndarray]]] = [[]]
    free = seq_len
    for doc, piece in enumerate(_pieces(documents, seq_len, eos)):
        if len(piece) > free:
            rows.append([])
            free = seq_len
        rows[-1].append((doc, piece))
        free -= len(piece)
    return _batch(rows if rows[0] else [], seq_len, pad)


def pad_each(documents: Sequence[np.ndarray], seq_len: int, eos: int, pad: int = 0) -> Packed:
    """Notebook 15, section 5: what packing replaces, one document (piece) per sequence, padded to ``seq_len``."""
    return _batch([[(doc, p)] for doc, p in enumerate(_pieces(documents, seq_len, eos))], seq_len, pad)


def block_causal_mask(documents: torch.Tensor) -> torch.Tensor:
    """Notebook 15, section 5: ``[batch, L, L]`` booleans, True where query ``q`` may attend to key ``k``: the same
    document, and ``k <= q``. Padding (document -1) attends to earlier padding only, so no row is empty."""
    length = documents.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return (documents[..., :, None] == documents[..., None, :]) & causal


class TinyLM(nn.Module):
    """Notebook 15, section 5: a small decoder-only transformer (learned position embeddings, pre-norm blocks,
    ``scaled_dot_product_attention`` with a boolean mask). ``forward(tokens, positions, mask)`` -> logits."""

    def __init__(self, vocab_size: int, dim: int = 64, heads: int = 2, layers: int = 2, max_len: int = 512) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab_size, dim)
        self.position = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "norm1": nn.LayerNorm(dim),
                    "qkv": nn.Linear(dim, 3 * dim),
                    "out": nn.Linear(dim, dim),
                    "norm2": nn.LayerNorm(dim),
                    "mlp": nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)),
                }
            )
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position(positions)
        b, length, dim = x.shape
        for block in self.blocks:
            q, k, v = block["qkv"](block["norm1"](x)).view(b, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
            x = x + block["out"](attended.transpose(1, 2).reshape(b, length, dim))
            x = x + block["mlp"](block["norm2"](x))
        return self.head(self.norm(x))


def train_step(model: TinyLM, optimizer: torch.optim.Optimizer, batch: Packed) -> float:
    """Notebook 15, section 5: one step of next-token training on a packed (or padded) batch; returns the loss."""
    logits = model(batch.tokens, batch.positions, block_causal_mask(batch.documents))
    loss = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=-100)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach())


# --------------------------------------------------------------------------- 6 · mixing
class Mixer:
    """Notebook 15, section 6: which source each sample comes from, by integer ``weights`` (``{"docs": 7, "code":
    3}``), deterministic from (seed, sample number).

    Samples are taken in blocks of ``sum(weights)``: each block holds exactly ``weights[s]`` samples of source
    ``s``, in an order drawn from (seed, block). So every window of ``k`` whole blocks is exact, and any window of
    consecutive samples is off by less than one block. ``cursor(s, g)``, how many samples of ``s`` came before
    sample ``g``, is arithmetic, not a replay, so the state of a mixer is one integer. Rank ``r`` of ``W`` takes
    samples ``r, r + W, r + 2W, ...``: the ranks' shares are disjoint and together they are the one sequence."""

    def __init__(self, weights: dict[str, int], seed: int = 0, rank: int = 0, world_size: int = 1) -> None:
        if not weights:
            raise ValueError("give at least one source and its weight, e.g. {'docs': 7, 'code': 3}")
        for name, weight in weights.items():
            check_int(weight, f"the weight of {name!r}", 1)  # whole numbers: a block holds exactly that many
        self.weights, self.seed, self.rank, self.world_size = dict(weights), seed, rank, world_size
        self.names = sorted(weights)
        self.block = sum(weights.values())
        self.taken = 0  # samples this rank took

    def _order(self, block: int) -> np.ndarray:
        slots = np.repeat(np.arange(len(self.names)), [self.weights[n] for n in self.names])
        return np.random.default_rng([self.seed, block]).permutation(slots)

    def source(self, g: int) -> str:
        """The source of global sample ``g``."""
        block, i = divmod(g, self.block)
        return self.names[int(self._order(block)[i])]

    def cursor(self, name: str, g: int) -> int:
        """How many samples of ``name`` the global sequence takes before sample ``g``."""
        block, i = divmod(g, self.block)
        s = self.names.index(name)
        return block * self.weights[name] + int((self._order(block)[:i] == s).sum())

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return self

    def __next__(self) -> tuple[str, int]:
        """This rank's next sample: ``(source, its index in that source's stream)``."""
        g = self.taken * self.world_size + self.rank
        self.taken += 1
        name = self.source(g)
        return name, self.cursor(name, g)

    def state_dict(self) -> dict[str, int]:
        return {"taken": self.taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.taken = int(state["taken"])


# --------------------------------------------------------------------------- 7 · one loader per rank
class TokenLoader:
    """Notebook 15, section 7: the batches of one data-parallel rank, from token files mixed by weight.

    Sample ``c`` of a source is its ``c % n``-th non-overlapping window in the order of that source's epoch
    ``c // n`` (:func:`epoch_windows`, seeded by the seed and the source's place), so no window comes twice within a
    source's epoch; the :class:`Mixer` decides the source, and deals samples to the ranks disjointly. Every rank
    takes ``steps`` batches of ``batch_size``. Follows the ``Stateful`` protocol of ``torch.distributed.checkpoint``:
    the state is this rank's step and what the job was (``world_size``, seed, weights, sizes), under a key of its
    own (``dp_rank_R``, as torchtitan's loader does), so that one DCP checkpoint holds every rank's."""

    def __init__(
        self,
        files: dict[str, TokenFile],
        weights: dict[str, int],
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if sorted(files) != sorted(weights):
            raise ValueError(f"weights {sorted(weights)} and files {sorted(files)} must name the same sources")
        self.files, self.seq_len, self.batch_size = files, seq_len, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.mixer = Mixer(weights, seed, rank, world_size)
        self._orders: dict[str, tuple[int, np.ndarray]] = {}  # per source: its current epoch's order
        self.step = 0

    def _start(self, name: str, c: int) -> int:
        n_tokens = self.files[name].n_tokens
        per_epoch = len(range(0, n_tokens - self.seq_len, self.seq_len))
        epoch, i = divmod(c, per_epoch)
        if self._orders.get(name, (None,))[0] != epoch:
            seed = self.seed + self.mixer.names.index(name)
            self._orders[name] = (epoch, epoch_windows(n_tokens, self.seq_len, seed, epoch))
        return int(self._orders[name][1][i])

    def next_batch(self) -> tuple[torch.Tensor, list[tuple[str, int]]]:
        """This rank's next batch ``[batch_size, seq_len + 1]`` and which window each row is: (source, start)."""
        self.mixer.load_state_dict({"taken": self.step * self.batch_size})
        rows, where = [], []
        for _ in range(self.batch_size):
            name, c = next(self.mixer)
            start = self._start(name, c)
            rows.append(self.files[name].window(start, self.seq_len + 1).astype(np.int64))
            where.append((name, start))
        self.step += 1
        return torch.from_numpy(np.stack(rows)), where

    def _job(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "seed": self.seed,
            "weights": dict(self.mixer.weights),
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
        }

    def state_dict(self) -> dict[str, Any]:
        return {f"dp_rank_{self.rank}": {"step": self.step, **self._job()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = state.get(f"dp_rank_{self.rank}")
        saved = mine or next(iter(state.values()), {})
        if saved.get("world_size", self.world_size) != self.world_size or mine is None:
            raise _changed_world(saved.get("world_size", "another number of"), self.world_size)
        job = self._job()
        changed = [k for k in job if k != "world_size" and saved.get(k) != job[k]]
        if changed:
            raise LoaderStateError(
                f"the loader state was saved with other {', '.join(changed)} ({', '.join(str(saved.get(k)) for k in changed)}"
                f"): resume with the same settings"
            )
        self.step = int(mine["step"])


def _changed_world(saved: Any, world_size: int) -> LoaderStateError:
    """The refusal of a loader state saved by a job of ``saved`` ranks, in a job of ``world_size``."""
    return LoaderStateError(
        f"the loader state was saved by a job of {saved} ranks; this job has {world_size}: each rank's share of the "
        f"stream would change. Resume with {saved} ranks (torchtitan refuses it too), or start a new run "
        "with a new --ckpt folder"
    )


def read_steps(folder: str | os.PathLike[str]) -> dict[int, list[dict[str, Any]]]:
    """Notebook 15, section 7: each rank's steps from its ``rankN.steps.jsonl``, in step order; a step a later run
    did again replaces the earlier line (what is left is what training used): notebook 14's reader."""
    from .resume import read_steps as read_rank_steps

    return read_rank_steps(folder, program="course_lib.tokens")


# --------------------------------------------------------------------------- the program: one rank's reading
def _open_files(folder: str | os.PathLike[str], names: Sequence[str]) -> dict[str, TokenFile]:
    """The token files ``folder/NAME.bin`` for each name."""
    return {name: TokenFile(Path(folder) / name) for name in names}


def _run(args: argparse.Namespace, env: distributed.DistEnv) -> str:
    import torch.distributed.checkpoint as dcp

    weights = {name: int(w) for name, w in (part.split("=") for part in args.weights.split(","))}
    loader = TokenLoader(
        _open_files(args.shards, sorted(weights)),
        weights,
        args.seq_len,
        args.batch_size,
        args.seed,
        env.rank,
        env.world_size,
    )
    ckpt, report = Path(args.ckpt), Path(args.report)
    report.mkdir(parents=True, exist_ok=True)
    log_path = report / f"rank{env.rank}.steps.jsonl"
    run = len({json.loads(x)["run"] for x in log_path.read_text().splitlines()}) if log_path.exists() else 0
    if (ckpt / "latest").exists():
        latest = json.loads((ckpt / "latest").read_text())
        if latest["world_size"] != env.world_size:  # before DCP looks for a key this rank never saved
            raise _changed_world(latest["world_size"], env.world_size)
        dcp.load({"loader": loader}, checkpoint_id=ckpt / latest["folder"])
    resumed_at = loader.step
    with open(log_path, "a") as log:
        while loader.step < args.steps:
            batch, where = loader.next_batch()
            digest = hashlib.sha256(batch.numpy().tobytes()).hexdigest()[:16]
            record = {"run": run, "step": loader.step, "windows": where, "tokens": digest}
            log.write(json.dumps(record) + "\n")
            log.flush()
            if loader.step == args.stop_at:
                folder = f"step{loader.step:07d}"
                dcp.save({"loader": loader}, checkpoint_id=ckpt / folder)  # every rank its own key, in one checkpoint
                if env.rank == 0:
                    latest = {"folder": folder, "world_size": env.world_size}
                    write_atomic(ckpt / "latest", json.dumps(latest) + "\n", durable=True)
                return f"run {run}: steps {resumed_at + 1}-{loader.step}, loader state saved, stopped"
    return f"run {run}: steps {resumed_at + 1}-{loader.step}, finished"


def _parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m course_lib.tokens", description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", required=True, help="folder holding the token files NAME.bin/.idx/.json")
    p.add_argument("--ckpt", required=True, help="checkpoint folder (resumed from when it holds one)")
    p.add_argument("--report", required=True, help="folder for each rank's rankN.steps.jsonl")
    p.add_argument("--weights", default="code=3,docs=7", help="sources and their whole-number weights")
    p.add_argument("--steps", type=int, default=12, help="steps per rank")
    p.add_argument("--stop-at", type=int, default=0, help="save the loader's state after this step and exit (0: never)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=4, help="per rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a collective may wait for the other ranks")
    args = p.parse_args(argv)
    if min(args.steps, args.seq_len, args.batch_size) < 1 or args.stop_at < 0:
        p.error("--steps, --seq-len and --batch-size must be at least 1, --stop-at not negative")
    return args


@record  # torchrun then names the rank whose error came first
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_lib.tokens``: 0, or 2 after one line for missing token files or a state it cannot resume."""
    args = _parse_args(argv)

    def run(env: distributed.DistEnv, device: torch.device) -> dict:
        print(f"rank {env.rank}: {_run(args, env)}", flush=True)
        return {}

    try:
        run_on_one_rank(run, "cpu", args.timeout)
    except (TokenDataError, LoaderStateError, distributed.DistEnvError) as exc:
        return one_line(exc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
