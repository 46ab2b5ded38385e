"""Step dumps (recipe.opsd.core.step_dump): rows without padding, the teacher prompt split off, atomic write."""

import numpy as np
import pytest
import torch

from recipe.opsd.core.step_dump import (
    dump_path,
    read_step_dump,
    split_teacher_inputs,
    unpadded_rows,
    write_step_dump,
)


def test_unpadded_rows_drop_left_and_right_padding():
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 0]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0]])
    assert unpadded_rows(ids, mask) == [[5, 6], [7, 8, 9]]


def test_teacher_prompt_is_the_input_minus_the_response():
    assert split_teacher_inputs([[1, 2, 3, 9, 8], [4, 7]], [[9, 8], [7]], what="teacher") == [[1, 2, 3], [4]]
    with pytest.raises(ValueError, match="row 1: the teacher input does not end with the row's response ids"):
        split_teacher_inputs([[1, 9], [4, 6]], [[9], [7]], what="teacher")


def test_round_trip_and_rng_state(tmp_path):
    rows = {"prompt_ids": [[1, 2]], "response_ids": [[3]], "teacher_prompt_ids": [[4, 5]], "loss_mask": [[True]],
            "index": [0]}
    np.random.seed(3)
    path = write_step_dump(dump_path(tmp_path, 7), step=7, rows=rows, loss_config={"clip_tau": 0.05})
    assert path == tmp_path / "step_dumps" / "step_7.pt" and [p.name for p in path.parent.iterdir()] == ["step_7.pt"]
    dump = read_step_dump(path)
    assert dump["step"] == 7 and dump["rows"] == rows and dump["loss_config"] == {"clip_tau": 0.05}
    expected = np.random.rand()
    np.random.set_state(dump["rng"]["numpy"])
    assert np.random.rand() == expected  # the saved state replays the driver's stream
    with pytest.raises(ValueError, match="different lengths"):
        write_step_dump(tmp_path / "x.pt", step=1, rows={"prompt_ids": [[1]], "response_ids": []}, loss_config={})
    torch.save({"x": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not an OPSD step dump"):
        read_step_dump(tmp_path / "other.pt")
