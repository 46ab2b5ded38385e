"""Batch sizes over ranks (recipe.launch.ranks): verl's split arithmetic checked before Ray, on every preset."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipe.launch.config import RECIPES, Settings, compose, get_recipe
from recipe.launch.ranks import check_rank_division
from recipe.launch.run import plan


def rl_config(*, batch=4, n=4, mini=4, micro=8, log_prob=8, ref=8, ranks=1, dynamic=False, kl=True):
    return OmegaConf.create({
        "trainer": {"n_gpus_per_node": ranks, "nnodes": 1},
        "data": {"train_batch_size": batch},
        "actor_rollout_ref": {
            "actor": {"use_dynamic_bsz": dynamic, "ppo_mini_batch_size": mini, "ppo_micro_batch_size_per_gpu": micro,
                      "use_kl_loss": kl},
            "rollout": {"n": n, "log_prob_micro_batch_size_per_gpu": log_prob, "log_prob_use_dynamic_bsz": dynamic},
            "ref": {"log_prob_micro_batch_size_per_gpu": ref, "log_prob_use_dynamic_bsz": dynamic},
        },
    })


def test_each_split_names_the_value_and_its_divisors():
    check_rank_division("grpo", rl_config(ranks=2))  # 16 samples, 8 per rank: every micro-batch divides
    with pytest.raises(ValueError, match=r"rollout.log_prob_micro_batch_size_per_gpu=16 does not divide the 8 samples "
                                         r"each rank scores.*one of \[1, 2, 4, 8\].*CPU_NUM_RANKS"):
        check_rank_division("grpo", rl_config(ranks=2, log_prob=16))
    with pytest.raises(ValueError, match=r"ref.log_prob_micro_batch_size_per_gpu=3 does not divide the 8"):
        check_rank_division("grpo", rl_config(ranks=2, ref=3))
    check_rank_division("grpo", rl_config(ranks=2, ref=3, kl=False))  # no KL loss: GRPO runs no reference pass
    with pytest.raises(ValueError, match=r"ppo_micro_batch_size_per_gpu=16 does not divide the 8 samples of a mini-batch"):
        check_rank_division("grpo", rl_config(ranks=2, micro=16))
    with pytest.raises(ValueError, match=r"the 12 samples of a step .* do not split over the ranks"):
        check_rank_division("grpo", rl_config(batch=3, mini=3, ranks=8))
    with pytest.raises(ValueError, match=r"ppo_mini_batch_size=1 x rollout.n=1 does not split over 2 ranks"):
        check_rank_division("opsd", rl_config(batch=2, n=1, mini=1, micro=1, ref=1, ranks=2))
    # OPSD's rollout log-prob pass does not run: its micro-batch is not checked
    check_rank_division("opsd", rl_config(batch=4, n=1, mini=4, micro=2, log_prob=3, ref=2, ranks=2))
    # dynamic batching (the GPU yaml): token budgets replace the micro-batches
    check_rank_division("grpo", rl_config(ranks=2, micro=16, log_prob=16, ref=16, dynamic=True))


def test_sft_rows_split_over_ranks():
    cfg = OmegaConf.create({"trainer": {"n_gpus_per_node": 3, "nnodes": 1},
                            "data": {"train_batch_size": 8, "micro_batch_size_per_gpu": 4, "use_dynamic_bsz": False}})
    with pytest.raises(ValueError, match=r"data.train_batch_size=8 does not split over 3 ranks"):
        check_rank_division("sft", cfg)
    cfg.trainer.n_gpus_per_node = 4  # 2 rows per rank, micro-batch 4
    with pytest.raises(ValueError, match=r"data.micro_batch_size_per_gpu=4 does not divide the 2 rows"):
        check_rank_division("sft", cfg)
    cfg.data.use_dynamic_bsz = True
    check_rank_division("sft", cfg)


def _presets_that_size_batches(recipe):
    """Experiment presets of ``recipe`` that set a batch size or the samples per prompt."""
    folder = get_recipe(recipe).config_dir / "experiment"
    return [name for name in get_recipe(recipe).presets("experiment")
            if any(word in (folder / f"{name}.yaml").read_text() for word in ("batch_size", " n:"))]


PRESET_RUNS = (
    # every CPU demo on 1 rank and on the 2 ranks the docs show
    [(name, [f"+demo={demo}", f"+platform={RECIPES[name].platform}", f"trainer.n_gpus_per_node={ranks}"])
     for name in RECIPES for demo in RECIPES[name].presets("demo") for ranks in (1, 2)]
    # every OPSD model preset on its own GPU count; the batch-sizing experiments on the paper's default model
    + [("opsd", [f"+model={model}"]) for model in RECIPES["opsd"].presets("model")]
    + [("opsd", ["+model=qwen3_1p7b", f"+experiment={e}"]) for e in _presets_that_size_batches("opsd")]
    # the GRPO presets on the paper's 4 and 8 GPUs
    + [("grpo", [f"+experiment={e}", f"trainer.n_gpus_per_node={g}"]) for e in RECIPES["grpo"].presets("experiment")
       for g in (4, 8)]
)


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "overrides"), PRESET_RUNS, ids=[f"{r}:{' '.join(o)}" for r, o in PRESET_RUNS])
def test_every_preset_splits_over_the_ranks_it_runs_on(recipe, overrides):
    check_rank_division(recipe, compose(get_recipe(recipe), overrides))


def test_the_launcher_stops_before_ray_naming_the_value(tmp_path):
    settings = Settings(device="cpu", model_path=str(tmp_path), train_files=str(tmp_path / "t.parquet"),
                        cache_dir=str(tmp_path), cpu_num_ranks=2)
    with pytest.raises(ValueError, match=r"rollout.log_prob_micro_batch_size_per_gpu=16 does not divide"):
        plan(get_recipe("grpo"), settings, ["+demo=tiny", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16"],
             environ={})
    assert not list(Path(tmp_path).iterdir())
