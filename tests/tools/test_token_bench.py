"""``python -m course_lib bench tokens``: notebook 15's token files through a DataLoader against a raw read."""

from __future__ import annotations

import numpy as np
import pytest

from course_lib import tokens
from course_tools import bench, token_bench

pytestmark = pytest.mark.quick


def test_packed_batches_hold_every_document_once_with_restarting_positions(tmp_path) -> None:
    docs = [np.arange(1, n + 1) for n in (5, 3, 12, 2)]
    rows = token_bench.PackedBatches(tokens.write_tokens(tmp_path / "t", docs, 50), seq_len=8, batch_size=2)
    got = [rows[i] for i in range(len(rows))]
    ids = [int(t) for ts, _, ds in got for t, d in zip(ts.flatten(), ds.flatten()) if d >= 0]
    assert ids == [int(x) for d in docs for x in d]
    tokens_, positions, documents = got[0]
    assert positions[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2] and documents[0].tolist() == [0] * 5 + [1] * 3
    assert all(t.shape[1] == 8 for t, _, _ in got) and rows.rows() == sum(len(t) for t, _, _ in got)
    assert all(int(t) == 0 for ts, _, ds in got for t, d in zip(ts.flatten(), ds.flatten()) if d < 0)


@pytest.mark.timeout(180)
def test_cli_prints_rates_ratios_and_the_goal(tmp_path, capsys) -> None:
    tokens.prepare_corpus(tmp_path)
    argv = ["tokens", "--root", str(tmp_path), "--repeat", "1", "--seq-len", "64", "--workers", "0", "--rounds", "3"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    for line in ("packer: ", "token file: ", "raw read of the windows' bytes", "windows:", "packed:", "x raw"):
        assert line in out, out
    assert "windows through 0 workers read at least 0.5x as fast as the raw read →" in out


def test_bad_numbers_are_refused(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench.main(["tokens", "--seq-len", "4"])
    assert exit_.value.code == 2 and "must be 8 or more, got 4" in capsys.readouterr().err
