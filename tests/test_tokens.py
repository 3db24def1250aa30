"""course_lib.tokens: the corpus snapshot, the tokenizer, token files and their errors, windows, packing and its mask,
the mixer, the per-rank loader's state, and a real 2-rank torchrun job stopped and resumed twice in one epoch whose
stream equals the uninterrupted job's (and a job with another number of ranks, refused)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from course_lib import tokens
from course_lib.jobs import launch

TEXTS = [f"def f{i}(x):\n    return x * {i} + {i % 7}  # the {i}th function\n" for i in range(200)]


@pytest.fixture(scope="module")
def small_files(tmp_path_factory):
    """Two token files of seeded random ids: 'docs' (long documents) and 'code' (short ones)."""
    folder = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 500, size=rng.integers(50, 400)) for _ in range(40)]
    code = [rng.integers(1, 500, size=rng.integers(5, 60)) for _ in range(80)]
    return folder, {name: tokens.write_tokens(folder / name, d, 500) for name, d in (("docs", docs), ("code", code))}


# --------------------------------------------------------------------------- the corpus snapshot
@pytest.mark.quick
def test_the_corpus_is_copied_once_with_checksums_and_damage_is_named(tmp_path, monkeypatch):
    with pytest.raises(tokens.TokenDataError, match=r"prepare --step text"):
        tokens.read_corpus(tmp_path)
    folder = tokens.prepare_corpus(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert len(manifest["files"]) == sum(len(v) for v in tokens.CORPUS_FILES.values())
    assert all(len(f["sha256"]) == 64 and f["bytes"] > 0 for f in manifest["files"].values())
    documents = tokens.read_corpus(tmp_path)
    assert len(documents["docs"]) > 50 and len(documents["code"]) > 50
    assert documents["code"][0].startswith(("def ", "class "))

    assert manifest["python"] == "3.11.7"  # the shipped files, whatever Python runs this
    assert (folder / "LICENSE.txt").read_text().startswith("A. HISTORY OF THE SOFTWARE")  # Python's licence, kept

    def no_unpacking(*args, **kwargs):
        raise AssertionError("an existing snapshot must be reused, not unpacked again")

    monkeypatch.setattr(tokens.tarfile, "open", no_unpacking)
    assert tokens.prepare_corpus(tmp_path) == folder
    edited = folder / "code" / "heapq.py"
    original = edited.read_bytes()
    edited.write_bytes(original + b"#")  # another size: found without reading the files
    with pytest.raises(tokens.TokenDataError, match=r"heapq.py differs from its manifest.*--force"):
        tokens.verify_corpus(tmp_path, checksums=False)
    edited.write_bytes(original[:-1] + b"#")  # the same size, another byte: only the checksum tells
    tokens.verify_corpus(tmp_path, checksums=False)
    with pytest.raises(tokens.TokenDataError, match="differs from its manifest"):
        tokens.verify_corpus(tmp_path, checksums=True)


# --------------------------------------------------------------------------- the tokenizer
@pytest.mark.quick
def test_bpe_training_is_deterministic_and_round_trips():
    first = tokens.train_tokenizer(TEXTS, vocab_size=300)
    second = tokens.train_tokenizer(list(TEXTS), vocab_size=300)
    assert first.to_str() == second.to_str()
    assert first.token_to_id(tokens.EOS) == 0
    encoded = tokens.encode_documents(first, TEXTS[:5], batch_size=2)
    assert [first.decode(e.tolist()) for e in encoded] == TEXTS[:5]
    assert all(e.dtype == np.uint32 for e in encoded)
    with pytest.raises(ValueError, match="vocab_size"):
        tokens.train_tokenizer(TEXTS, vocab_size=100)  # smaller than the 256 bytes and EOS


# --------------------------------------------------------------------------- token files
@pytest.mark.quick
def test_a_token_file_round_trips_through_a_memory_map(tmp_path):
    docs = [np.array([5, 1, 7]), np.array([], dtype=np.int64), np.array([9, 9, 3])]
    file = tokens.write_tokens(tmp_path / "t", docs, vocab_size=10)
    assert file.dtype == np.uint16 and file.n_tokens == 6 and len(file) == 3
    assert isinstance(file.tokens, np.memmap) and file.tokens.flags.writeable is False
    assert [file.document(i).tolist() for i in range(3)] == [[5, 1, 7], [], [9, 9, 3]]
    assert file.document(-1).tolist() == [9, 9, 3]
    assert np.shares_memory(file.window(2, 3), file.tokens)
    assert (tmp_path / "t.bin").stat().st_size == 12
    file.verify()
    assert not list(tmp_path.glob(".*tmp*"))  # atomic writes leave no temporary file
    big = tokens.write_tokens(tmp_path / "big", [np.array([69_999, 65_536, 1])], vocab_size=70_000)
    assert big.dtype == np.uint32 and big.document(0).tolist() == [69_999, 65_536, 1]


@pytest.mark.quick
def test_bad_token_files_get_clear_errors(tmp_path):
    with pytest.raises(tokens.TokenDataError, match="uint8 cannot hold the ids of a 4096-token vocabulary.*uint16"):
        tokens.write_tokens(tmp_path / "a", [np.array([1])], 4096, dtype=np.uint8)
    with pytest.raises(tokens.TokenDataError, match="document 1 holds id 10, outside a 10-token vocabulary"):
        tokens.write_tokens(tmp_path / "b", [np.array([1]), np.array([10])], 10)
    assert not (tmp_path / "b.json").exists()  # no manifest: no reader takes it for whole
    with pytest.raises(tokens.TokenDataError, match="no manifest b.json.*never finished"):
        tokens.TokenFile(tmp_path / "b")
    file = tokens.write_tokens(tmp_path / "c", [np.arange(8)], 10)
    with pytest.raises(IndexError, match=r"document 1 of a token file of 1 documents"):
        file.document(1)
    with pytest.raises(IndexError, match=r"the window \[5, 9\) reads past the end of the 8 tokens.*starts at 4"):
        file.window(5, 4)
    del file
    with open(tmp_path / "c.bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(
        tokens.TokenDataError, match="c.bin holds 10 bytes, its manifest says 16: the file is truncated"
    ):
        tokens.TokenFile(tmp_path / "c")
    tokens.write_tokens(tmp_path / "d", [np.arange(8)], 10)
    raw = bytearray((tmp_path / "d.bin").read_bytes())
    raw[0] ^= 1
    (tmp_path / "d.bin").write_bytes(bytes(raw))
    with pytest.raises(tokens.TokenDataError, match="d.bin differs from its manifest"):
        tokens.TokenFile(tmp_path / "d").verify()


# --------------------------------------------------------------------------- windows
@pytest.mark.quick
def test_random_windows_stay_inside_and_follow_seed_and_epoch():
    starts = tokens.random_windows(12, 4, 500, seed=0, epoch=0)
    assert set(starts.tolist()) == set(range(8))  # every start whose 5 tokens fit, the last (7) included
    same = tokens.random_windows(1000, 16, 50, seed=3, epoch=1)
    assert np.array_equal(same, tokens.random_windows(1000, 16, 50, seed=3, epoch=1))
    assert not np.array_equal(same, tokens.random_windows(1000, 16, 50, seed=3, epoch=2))
    with pytest.raises(ValueError, match="hold no window"):
        tokens.random_windows(4, 4, 1, 0, 0)


@pytest.mark.quick
def test_an_epoch_of_windows_reads_every_token_once():
    n, seq_len = 1000, 16
    starts = tokens.epoch_windows(n, seq_len, seed=0, epoch=0)
    assert sorted(starts.tolist()) == list(range(0, n - seq_len, seq_len))
    assert max(starts) + seq_len + 1 <= n
    assert tokens.coverage(starts, seq_len, n) == len(starts) * seq_len / n
    assert not np.array_equal(starts, tokens.epoch_windows(n, seq_len, seed=0, epoch=1))
    drawn = tokens.random_windows(n, seq_len, len(starts), seed=0, epoch=0)
    assert 0.55 < tokens.coverage(drawn, seq_len, n) < 0.72  # about 1 - 1/e


# --------------------------------------------------------------------------- packing
@pytest.mark.quick
def test_pack_restarts_positions_and_labels_stay_in_their_document():
    docs = [np.array([7, 8, 9]), np.array([4, 5]), np.array([6] * 10)]
    packed = tokens.pack(docs, seq_len=8, eos=1)
    assert packed.tokens.tolist() == [[7, 8, 9, 1, 4, 5, 1, 0], [6] * 8, [6, 6, 1] + [0] * 5]  # 10 sixes and eos: cut
    assert packed.positions.tolist() == [[0, 1, 2, 3, 0, 1, 2, 0], list(range(8)), [0, 1, 2] + [0] * 5]
    assert packed.documents.tolist() == [[0, 0, 0, 0, 1, 1, 1, -1], [2] * 8, [3] * 3 + [-1] * 5]
    assert packed.labels.tolist()[0] == [8, 9, 1, -100, 5, 1, -100, -100]
    assert packed.pad_share == pytest.approx(6 / 24)
    padded = tokens.pad_each(docs, seq_len=8, eos=1)
    assert len(padded.tokens) == 4 and padded.pad_share == pytest.approx(14 / 32)
    assert padded.useful_tokens == packed.useful_tokens
    mask = tokens.block_causal_mask(packed.documents)
    assert mask[0, 4].tolist() == [False] * 4 + [True] + [False] * 3  # document 1 sees nothing of document 0
    assert mask.any(-1).all()  # no empty row, padding included


@pytest.mark.quick
def test_a_packed_batch_with_its_mask_equals_each_document_alone():
    torch.manual_seed(0)
    model = tokens.TinyLM(50, dim=16, heads=2, layers=2, max_len=32).eval()
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 50, size=n) for n in (5, 9, 3, 12, 7)]
    batch = tokens.pack(docs, seq_len=16, eos=0)
    with torch.no_grad():
        out = model(batch.tokens, batch.positions, tokens.block_causal_mask(batch.documents))
        causal = torch.ones(16, 16, dtype=torch.bool).tril().expand(len(batch.tokens), 16, 16)
        leaked = model(batch.tokens, batch.positions, causal)
        for row in range(len(batch.tokens)):
            for doc in batch.documents[row].unique().tolist():
                if doc < 0:
                    continue
                where = batch.documents[row] == doc
                n = int(where.sum())
                alone = model(batch.tokens[row, where][None], torch.arange(n)[None], torch.ones(1, n, n).tril().bool())
                assert torch.allclose(out[row, where], alone[0], atol=1e-5)
    real = batch.documents >= 0
    assert not torch.allclose(out[real], leaked[real], atol=1e-3)  # the documents after the first in a row leak
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert np.isfinite(tokens.train_step(model.train(), optimizer, batch))


# --------------------------------------------------------------------------- mixing
@pytest.mark.quick
def test_the_mixer_is_exact_per_block_disjoint_per_rank_and_resumes_from_one_integer():
    whole = tokens.Mixer({"docs": 7, "code": 3}, seed=0)
    drawn = [next(whole) for _ in range(1000)]
    for start in range(0, 1000, 10):
        assert [s for s, _ in drawn[start : start + 10]].count("docs") == 7
    count = 0
    for n, (source, _) in enumerate(drawn, 1):
        count += source == "docs"
        assert abs(count - 0.7 * n) < 10
    for name, weight in (("docs", 700), ("code", 300)):
        assert [c for s, c in drawn if s == name] == list(range(weight))  # each source in order, none skipped
    ranks = [tokens.Mixer({"docs": 7, "code": 3}, seed=0, rank=r, world_size=3) for r in range(3)]
    shares = [[next(m) for _ in range(100)] for m in ranks]
    assert sorted(x for share in shares for x in share) == sorted(drawn[:300])
    resumed = tokens.Mixer({"docs": 7, "code": 3}, seed=0)
    resumed.load_state_dict(json.loads(json.dumps({"taken": 437})))
    assert [next(resumed) for _ in range(50)] == drawn[437:487]
    assert tokens.Mixer({"docs": 7, "code": 3}, seed=1).source(0) != drawn[0][0] or any(
        tokens.Mixer({"docs": 7, "code": 3}, seed=1).source(g) != drawn[g][0] for g in range(20)
    )
    with pytest.raises(ValueError, match="the weight of .docs. must be a whole number >= 1"):
        tokens.Mixer({"docs": 0.7, "code": 0.3})


# --------------------------------------------------------------------------- the per-rank loader
@pytest.mark.quick
def test_the_loader_resumes_exactly_and_refuses_another_world_size(small_files):
    _, files = small_files
    weights = {"docs": 7, "code": 3}

    def loader(rank, world_size=2, **kw):
        return tokens.TokenLoader(
            files, weights, seq_len=16, batch_size=4, seed=0, rank=rank, world_size=world_size, **kw
        )

    whole = {r: [loader(r).next_batch() for _ in range(1)] for r in range(2)}
    streams = {}
    for r in range(2):
        one = loader(r)
        streams[r] = [one.next_batch() for _ in range(30)]
        assert whole[r][0][1] == streams[r][0][1]
    seen = [w for r in range(2) for _, where in streams[r] for w in where]
    for source, file in files.items():
        per_epoch = len(range(0, file.n_tokens - 16, 16))
        starts = [s for name, s in seen if name == source]
        first_epoch = starts[:per_epoch]
        assert len(set(first_epoch)) == len(first_epoch), f"a window of {source} twice in its first epoch"
    for r in range(2):
        first = loader(r)
        for _ in range(7):
            first.next_batch()
        second = loader(r)
        second.load_state_dict(json.loads(json.dumps(first.state_dict())))
        for _ in range(6):
            second.next_batch()
        third = loader(r)
        third.load_state_dict(second.state_dict())  # resumed a second time in the same epoch
        rest = [third.next_batch() for _ in range(17)]
        assert all(torch.equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(rest, streams[r][13:]))
    with pytest.raises(tokens.LoaderStateError, match="saved by a job of 2 ranks; this job has 3.*Resume with 2 ranks"):
        loader(0, world_size=3).load_state_dict(loader(0).state_dict())
    with pytest.raises(tokens.LoaderStateError, match="other seq_len"):
        tokens.TokenLoader(files, weights, seq_len=32, batch_size=4, rank=0, world_size=2).load_state_dict(
            loader(0).state_dict()
        )


# --------------------------------------------------------------------------- the torchrun job
@pytest.mark.full
def test_a_2_rank_job_resumed_twice_equals_the_uninterrupted_one(small_files, tmp_path):
    folder, _ = small_files

    def job(name, *options, nproc=2, check=True):
        return launch(
            "course_lib.tokens",
            *("--shards", str(folder), "--ckpt", str(tmp_path / name / "ckpt"), "--report", str(tmp_path / name)),
            *("--steps", "10", "--seq-len", "16", "--batch-size", "4"),
            *options,
            nproc=nproc,
            timeout=180,
            check=check,
            show=False,
        )

    job("whole")
    for stop in ("3", "7", "0"):
        ran = job("resumed", "--stop-at", stop)
        assert all(len(lines) for lines in ran.ranks.values())
    whole, resumed = tokens.read_steps(tmp_path / "whole"), tokens.read_steps(tmp_path / "resumed")
    assert sorted(resumed) == [0, 1]
    for rank in (0, 1):
        assert [s["step"] for s in resumed[rank]] == list(range(1, 11))  # equal steps on every rank
        assert [s["run"] for s in resumed[rank]] == [0] * 3 + [1] * 4 + [2] * 3  # stopped twice, resumed twice
        assert [(s["windows"], s["tokens"]) for s in resumed[rank]] == [
            (s["windows"], s["tokens"]) for s in whole[rank]
        ]
    windows = [tuple(w) for rank in resumed.values() for s in rank for w in s["windows"]]
    assert len(set(windows)) == len(windows), "no window twice in the epoch, over both ranks"
    refused = job("resumed", nproc=3, check=False)
    assert not refused.ok
    assert "saved by a job of 2 ranks; this job has 3" in (refused.first_error() or "")


@pytest.mark.quick
def test_a_missing_shipped_corpus_says_how_to_get_it_back(tmp_path, monkeypatch):
    monkeypatch.setattr(tokens, "CORPUS_ARCHIVE", tmp_path / "gone.tar.xz")
    with pytest.raises(tokens.TokenDataError, match=r"cannot read the shipped text .*git checkout course_lib/corpus"):
        tokens.prepare_corpus(tmp_path / "data")
    assert not (tmp_path / "data" / tokens.CORPUS_NAME).exists(), "nothing half-made is left"
