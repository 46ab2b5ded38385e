"""The rows a launch trains on (recipe.launch.data_order): verl's own dataloader order, an over-long
prompt refused by both recipes naming file and row, and the matched OPSD / GRPO presets recording
the same order (a parquet of 8 rows, one of them over the 1,024-token prompt cap)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from omegaconf import OmegaConf

from data_prep.common import make_row
from recipe.analysis.compute_cost import DataMismatch, check_same_data
from recipe.common.cli import InputError
from recipe.common.prompts import student_messages
from recipe.experiments.sweep_data import materialize_sampler_order
from recipe.launch import data_order
from recipe.launch.config import Settings, get_recipe
from recipe.launch.run import plan

OPSD, GRPO = get_recipe("opsd"), get_recipe("grpo")
LONG_ROW = 5  # the over-long prompt's row
BATCH, STEPS = 4, 2  # 8 rows = one epoch of 2 batches: every row is read


def _rows(n=8, long_row=LONG_ROW):
    records = [{"index": i, "problem": ("What is 1 + 1? " * 150) if i == long_row else f"What is {i} + {i}?",
                "solution": f"{i} + {i} = {2 * i}.", "answer": str(2 * i)} for i in range(n)]
    return [make_row(r, data_source="t", split="train", prompt=student_messages(r["problem"])) for r in records]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from recipe.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def tok(tiny):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny)


@pytest.fixture()
def parquet(tmp_path):
    path = tmp_path / "train.parquet"
    pd.DataFrame(_rows()).to_parquet(path, index=False)
    return path


def _settings(model, train, ckpt):
    return Settings(device="gpu", model_path=str(model), train_files=str(train), ngpus=1, steps=STEPS, ckpt_dir=str(ckpt))


def _plan(recipe, model, train, ckpt, *extra):
    argv = [f"+experiment={'released_grpo' if recipe is GRPO else 'opsd_vs_grpo_matched'}",
            f"data.train_batch_size={BATCH}", f"actor_rollout_ref.actor.ppo_mini_batch_size={BATCH}", *extra]
    if recipe is GRPO:
        argv.append("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")
    return plan(recipe, _settings(model, train, ckpt), argv, environ={})


def test_the_long_row_is_over_the_cap(tok, parquet):
    lengths = data_order.prompt_lengths([r["prompt"] for r in _rows()], tokenizer=tok, chat_kwargs={})
    assert [n > 1024 for n in lengths] == [i == LONG_ROW for i in range(8)]


@pytest.mark.parametrize("recipe", [GRPO, OPSD], ids=["grpo", "opsd"])
@pytest.mark.slow
def test_an_overlong_prompt_is_refused_by_both_recipes_naming_file_and_row(recipe, tiny, parquet, tmp_path):
    with pytest.raises(InputError) as err:
        _plan(recipe, tiny, parquet, tmp_path / "ckpt")
    line = str(err.value)
    assert line.startswith(f"{parquet}: row {LONG_ROW} (0-based) of the training data: its prompt renders to ")
    assert "> data.max_prompt_length=1024" in line and "data_prep.length_filter" in line and "\n" not in line


@pytest.mark.slow
def test_the_matched_presets_record_one_order(tiny, tmp_path):
    source = tmp_path / "source.parquet"
    pd.DataFrame(_rows(long_row=-1)).to_parquet(source, index=False)
    # the OPSD side reads the first rows of GRPO's sampler (seed 1), materialised in order (sweep.data_prep)
    matched = tmp_path / "matched.parquet"
    materialize_sampler_order(pd.read_parquet(source), seed=1, num_rows=BATCH * STEPS).to_parquet(matched, index=False)
    grpo = _plan(GRPO, tiny, source, tmp_path / "grpo")
    opsd = _plan(OPSD, tiny, matched, tmp_path / "opsd")
    assert grpo.config.data.seed == 1 and grpo.config.data.shuffle and opsd.config.data.shuffle is False
    assert not grpo.config.data.filter_overlong_prompts and not opsd.config.data.get("filter_overlong_prompts", False)
    assert grpo.data_order.rows == opsd.data_order.rows == BATCH * STEPS
    assert grpo.data_order.order_sha256 == opsd.data_order.order_sha256
    assert "order sha256" in grpo.describe()
    line = check_same_data(opsd=opsd.data_order.record(), grpo=grpo.data_order.record())
    assert line.startswith(f"same data: both runs trained on the same {BATCH * STEPS} rows in the same order")
    # GRPO with another seed (or any other order): the pair is refused
    other = _plan(GRPO, tiny, source, tmp_path / "grpo2", "data.seed=2")
    with pytest.raises(DataMismatch, match="another row order"):
        check_same_data(opsd=opsd.data_order.record(), grpo=other.data_order.record())


@pytest.mark.slow
def test_verls_filter_on_one_side_shifts_the_order_and_the_pair_is_refused(tiny, parquet, tmp_path):
    """What grpo_trainer.yaml did before: verl's filter on the GRPO side drops the long row, so its
    sampler permutes 7 rows instead of 8 and reads other rows than the OPSD run's materialised ones."""
    matched = tmp_path / "matched.parquet"  # the first batch of seed 2 over the 8 rows: 0, 4, 7, 2 (not the long row)
    materialize_sampler_order(pd.read_parquet(parquet), seed=2, num_rows=BATCH).to_parquet(matched, index=False)
    opsd = _plan(OPSD, tiny, matched, tmp_path / "opsd", "trainer.total_training_steps=1")
    grpo = _plan(GRPO, tiny, parquet, tmp_path / "grpo", "data.filter_overlong_prompts=true", "data.seed=2",
                 "trainer.total_training_steps=1")
    assert grpo.data_order.rows_in_dataset == 7 and "drops 1 of 8 rows" in grpo.data_order_note
    assert "[launch] data: data.filter_overlong_prompts drops 1 of 8 rows" in grpo.describe()
    with pytest.raises(DataMismatch) as err:
        check_same_data(opsd=opsd.data_order.record(), grpo=grpo.data_order.record())
    assert "data.filter_overlong_prompts False vs True" in str(err.value) and "4/4 vs 7/8" in str(err.value)
    # the same pair without the filter: the same rows in the same order
    plain = _plan(GRPO, tiny, parquet, tmp_path / "grpo2", "data.seed=2", "trainer.total_training_steps=1")
    assert check_same_data(opsd=opsd.data_order.record(), grpo=plain.data_order.record()).startswith("same data")


@pytest.mark.parametrize("filtered", [False, True])
@pytest.mark.parametrize("shuffle, seed, max_samples, steps", [
    (True, 1, -1, 5), (True, None, -1, 3), (False, None, -1, 4), (True, 7, 6, 4), (False, None, 6, 3),
])
def test_the_order_is_verls_dataloaders(tok, parquet, filtered, shuffle, seed, max_samples, steps):
    """verl's RLHFDataset + create_rl_sampler + StatefulDataLoader(drop_last) over several epochs, as
    RayPPOTrainer builds and iterates them, yield the rows plan_data_order records."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.utils import create_rl_sampler
    from verl.utils.dataset.rl_dataset import RLHFDataset

    data = OmegaConf.create({
        "train_files": str(parquet), "prompt_key": "prompt", "max_prompt_length": 1024, "shuffle": shuffle,
        "seed": seed, "filter_overlong_prompts": filtered, "filter_overlong_prompts_workers": 1,
        "apply_chat_template_kwargs": {"enable_thinking": True}, "train_max_samples": max_samples,
        "train_batch_size": 2, "gen_batch_size": None, "custom_cls": {"path": None},
    })
    if not filtered and max_samples == -1:
        data.max_prompt_length = 100_000  # no row over the cap: the order alone
    dataset = RLHFDataset(data_files=[str(parquet)], tokenizer=tok, config=data, max_samples=max_samples)
    loader = StatefulDataLoader(dataset=dataset, batch_size=2, drop_last=True, collate_fn=lambda rows: rows,
                                sampler=create_rl_sampler(data, dataset), num_workers=0)
    verl_rows = []
    while len(verl_rows) < 2 * steps:
        for batch in loader:
            verl_rows += [data_order.row_digest(row["raw_prompt"]) for row in batch]
            if len(verl_rows) == 2 * steps:
                break
    cfg = OmegaConf.create({"data": data, "trainer": {"total_training_steps": steps, "total_epochs": 1},
                            "actor_rollout_ref": {"model": {"path": "unused"}}})
    try:
        order, _ = data_order.plan_data_order(cfg, load_tokenizer=lambda model: tok)
    except InputError as err:  # no filter and the long row among the rows read: refused (verl would cut it)
        assert not filtered and f"row {LONG_ROW} (0-based)" in str(err)
        assert any(d == data_order.row_digest(_rows()[LONG_ROW]["prompt"]) for d in verl_rows)
        return
    assert order.rows == len(verl_rows) and order.order_sha256 == data_order.order_sha256(verl_rows)
    assert order.rows_in_dataset == len(dataset)


@pytest.mark.slow
def test_the_record_is_written_to_the_run_directory(tmp_path, tiny, parquet):
    source = tmp_path / "ok.parquet"
    pd.DataFrame(_rows(long_row=-1)).to_parquet(source, index=False)
    launch = _plan(GRPO, tiny, source, tmp_path / "ckpt")
    launch.ckpt_dir.mkdir(parents=True)
    path = data_order.write_record(launch.data_order, launch.data_order_note, launch.ckpt_dir)
    record = json.loads(path.read_text())
    assert path.name == "data_order.json" and record["rows"] == BATCH * STEPS and record["seed"] == 1
    assert record["order_sha256"] == launch.data_order.order_sha256 and record["train_files"] == [str(source)]
    # no order (data not readable here): the record says why, and the comparison refuses it
    why = data_order.write_record(None, "data order not recorded: cannot read ...", tmp_path)
    with pytest.raises(DataMismatch, match="its row order was not recorded"):
        check_same_data(opsd={**json.loads(why.read_text()), "path": str(why)}, grpo=record)


def test_fewer_rows_than_one_batch_names_the_file(tok, tmp_path):
    path = tmp_path / "small.parquet"
    pd.DataFrame(_rows(n=3, long_row=-1)).to_parquet(path, index=False)
    cfg = OmegaConf.create({"data": {"train_files": str(path), "max_prompt_length": 1024, "train_batch_size": 4, "seed": 1},
                            "trainer": {"total_training_steps": 1}, "actor_rollout_ref": {"model": {"path": "unused"}}})
    with pytest.raises(InputError, match=f"^{path}: the training data has 3 rows, fewer than one batch of 4"):
        data_order.plan_data_order(cfg, load_tokenizer=lambda model: tok)
