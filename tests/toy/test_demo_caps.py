"""The demos' data fits the caps of every recipe that reads it (recipe.toy.demo.check_demo_rows), measured
as verl measures it; a preset whose cap no longer fits stops the launch with the row, its length and the preset."""

import pandas as pd
import pytest

from recipe.launch.config import compose, get_recipe
from recipe.models.tiny import build_char_tokenizer, build_tiny_model
from recipe.toy.data import prompt_phrases
from recipe.toy.demo import check_demo_rows, row_lengths, write_tiny_data
from recipe.toy.student import SFT_MAX_LENGTH, StudentConfig, check_sft_rows, write_data


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    return write_tiny_data(tmp_path_factory.mktemp("tiny_data"))


@pytest.mark.slow
def test_tiny_demo_rows_fit_every_recipe_and_a_smaller_cap_is_named(tiny_files):
    tokenizer = build_char_tokenizer()
    check_demo_rows("tiny", tiny_files, tokenizer)
    sft = row_lengths("sft", compose(get_recipe("sft"), ["+demo=tiny", "+platform=cpu_sft"]), tiny_files, tokenizer)
    (_, key, cap, longest), = sft
    assert key == "data.max_length" and longest <= cap
    with pytest.raises(ValueError, match=rf"tiny demo's .*sft.parquet has a row of {longest} tokens > "
                                         rf"data.max_length={longest - 1} of the sft recipe .*demo/tiny.yaml\): "
                                         rf"raise data.max_length there to >= {longest}"):
        check_demo_rows("tiny", tiny_files, tokenizer, overrides={"sft": [f"data.max_length={longest - 1}"]})
    with pytest.raises(ValueError, match=r"opsd.teacher_max_prompt_length=100 of the opsd recipe"):
        check_demo_rows("tiny", tiny_files, tokenizer, overrides={"opsd": ["opsd.teacher_max_prompt_length=100"]})


def test_the_sft_length_is_the_one_verl_checks(tiny_files, tmp_path):
    """verl's SFT dataset accepts the longest tiny row at exactly its measured length and rejects it one below."""
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset
    from transformers import AutoTokenizer

    model = build_tiny_model(tmp_path / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(model)
    cfg = compose(get_recipe("sft"), ["+demo=tiny", "+platform=cpu_sft"])
    (_, _, _, longest), = row_lengths("sft", cfg, tiny_files, tokenizer)
    frame = pd.read_parquet(tiny_files["sft"])
    lengths = [row_lengths("sft", cfg, {"sft": _one_row(frame, i, tmp_path)}, tokenizer)[0][3] for i in range(len(frame))]
    index = lengths.index(longest)
    one = _one_row(frame, index, tmp_path)
    for max_length, fits in ((longest, True), (longest - 1, False)):
        data = cfg.data.copy()
        data.max_length = max_length
        dataset = MultiTurnSFTDataset(parquet_files=str(one), tokenizer=tokenizer, config=data)
        if fits:
            assert len(dataset[0]["input_ids"]) == longest
        else:
            with pytest.raises(ValueError, match=f"sequence_length={longest} is larger"):
                dataset[0]


def _one_row(frame, index, tmp_path):
    path = tmp_path / f"row_{index}.parquet"
    frame.iloc[[index]].to_parquet(path)
    return path


@pytest.mark.slow
def test_toy_demo_rows_fit_the_rl_recipes_and_the_student_sft(tmp_path):
    config = StudentConfig()
    files = write_data(config, tmp_path / "data")
    tokenizer = build_char_tokenizer(phrases=prompt_phrases())
    check_demo_rows("toy", {"train": files["train"], "val": files["heldout_parquet"]}, tokenizer)
    init = build_tiny_model(tmp_path / "init", phrases=prompt_phrases(), num_layers=1)
    assert check_sft_rows(files["sft"], init) <= SFT_MAX_LENGTH
    with pytest.raises(ValueError, match=r"sft.parquet has a row of \d+ tokens > the toy student's SFT cap "
                                         r"data.max_length=20 \(recipe.toy.student.SFT_MAX_LENGTH\)"):
        check_sft_rows(files["sft"], init, max_length=20)
