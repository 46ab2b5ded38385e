"""Every launch checks its model, data and resume checkpoint before Ray starts (recipe.launch.checks):
one line naming the setting, the value and the fix, through plan() (launch and --dry-run alike)."""

from __future__ import annotations

import pandas as pd
import pytest

from recipe.common import cli
from recipe.common.checkpoints import check_model_source
from recipe.launch.checks import LaunchInputError
from recipe.launch.config import Settings, get_recipe
from recipe.launch.run import plan

OPSD, GRPO, SFT = get_recipe("opsd"), get_recipe("grpo"), get_recipe("sft")


def cpu_plan(recipe, inputs, argv=(), *, environ=None, **settings):
    settings.setdefault("model_path", str(inputs.model))
    settings.setdefault("train_files", str(inputs.sft if recipe is SFT else inputs.train))
    settings.setdefault("ckpt_dir", str(inputs.model.parent / f"ckpt_{recipe.name}"))
    return plan(recipe, Settings(device="cpu", **settings), list(argv), environ=environ or inputs.env)


def refused(recipe, inputs, argv=(), **settings) -> str:
    with pytest.raises(LaunchInputError) as caught:
        cpu_plan(recipe, inputs, argv, **settings)
    line = caught.value.line
    assert "\n" not in line and line.startswith("error: ")
    return line


@pytest.mark.slow
def test_a_model_path_that_does_not_exist_is_named_with_its_variable(launch_inputs):
    for recipe in (OPSD, GRPO, SFT):
        line = refused(recipe, launch_inputs, model_path="/nonexistent/model")
        assert line == (f"error: {recipe.model_key}=/nonexistent/model (MODEL_PATH): no such model directory "
                        "(set MODEL_PATH to a Hugging Face model directory or a Hub id such as Qwen/Qwen3-1.7B)")
    # from the command line: the fix names the hydra key
    line = refused(GRPO, launch_inputs, ["actor_rollout_ref.model.path=./typo"], model_path=None)
    assert "actor_rollout_ref.model.path=./typo (command line): no such model directory" in line
    assert "(pass actor_rollout_ref.model.path=<a Hugging Face model directory" in line


@pytest.mark.slow
def test_a_broken_model_directory_names_the_file(launch_inputs, tmp_path):
    broken = tmp_path / "model"
    broken.mkdir()
    (broken / "config.json").write_text((launch_inputs.model / "config.json").read_text())
    line = refused(OPSD, launch_inputs, model_path=str(broken))
    assert f"actor_rollout_ref.model.path={broken} (MODEL_PATH): no model weights (model.safetensors" in line
    assert line.endswith("(pass the model folder; merge an FSDP checkpoint first (scripts/merge_checkpoint.sh))")


@pytest.mark.slow
def test_hub_ids_offline_must_be_cached_online_the_hub_is_asked(launch_inputs, tmp_path):
    line = refused(GRPO, launch_inputs, model_path="org/not-downloaded")
    assert "is not a model directory, nor a Hub id in the local Hugging Face cache" in line
    assert "the run is offline (HF_HUB_OFFLINE=1) (download it first (hf download org/not-downloaded)" in line
    cached = cpu_plan(OPSD, launch_inputs, ["+model=qwen3_1p7b"], model_path=None)  # in the session's fake cache
    assert cached.config.actor_rollout_ref.model.path == "Qwen/Qwen3-1.7B"
    assert "disk: the size of one checkpoint save is not known" in cached.describe()
    asked = []  # online (a GPU launch: no HF_HUB_OFFLINE) a Hub id not in the cache is asked for (probe_hub)

    def no_such_repo(repo_id):
        asked.append(repo_id)
        raise cli.MissingInputError("no such model on the Hugging Face Hub (or a private one)", file=repo_id,
                                    hint="check the id (org/name)")

    with pytest.raises(cli.MissingInputError, match="no such model on the Hugging Face Hub"):
        check_model_source("org/typo", offline=False, hub_cache=launch_inputs.hub_cache, probe=no_such_repo)
    assert check_model_source("org/there", offline=False, hub_cache=tmp_path, probe=asked.append) == "hub"
    assert check_model_source("Qwen/Qwen3-8B", offline=False, hub_cache=launch_inputs.hub_cache, probe=None) == "cache"
    assert asked == ["org/typo", "org/there"]
    with pytest.raises(cli.MissingInputError, match="neither a model directory nor a Hub id"):
        check_model_source("a/b/c", offline=False, probe=asked.append)


@pytest.mark.slow
def test_data_files_exist_are_parquet_and_have_the_recipes_columns(launch_inputs, tmp_path):
    line = refused(OPSD, launch_inputs, train_files="/nonexistent/train.parquet")
    assert line == ("error: data.train_files=/nonexistent/train.parquet (TRAIN_FILES): no such data file "
                    "(set TRAIN_FILES to an existing parquet file)")
    line = refused(GRPO, launch_inputs, val_files="/nonexistent/val.parquet")
    assert "data.val_files=/nonexistent/val.parquet (VAL_FILES): no such data file" in line
    text = tmp_path / "train.parquet"
    text.write_text("prompt,answer\n")
    assert "not a parquet file (Parquet magic bytes not found" in refused(OPSD, launch_inputs, train_files=str(text))
    bare = tmp_path / "bare.parquet"
    pd.DataFrame({"prompt": [[{"role": "user", "content": "1+1"}]], "reward_model": [{"ground_truth": "2"}],
                  "data_source": ["x"]}).to_parquet(bare)
    line = refused(OPSD, launch_inputs, train_files=str(bare))  # OPSD reads extra_info, GRPO does not
    assert "no column 'extra_info' (its columns: data_source, prompt, reward_model)" in line
    assert "(pass a verl RL parquet (prompt, reward_model, data_source, extra_info" in line
    assert "one batch" in refused(GRPO, launch_inputs, train_files=str(bare))  # 1 row < data.train_batch_size
    assert cpu_plan(GRPO, launch_inputs, ["data.train_batch_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=1"],
                    train_files=str(bare)).config.data.train_files == str(bare)
    plain = tmp_path / "plain.parquet"  # a prompt that is a string, not chat messages
    pd.DataFrame({"prompt": ["1+1"], "reward_model": [{"ground_truth": "2"}], "data_source": ["x"]}).to_parquet(plain)
    with pytest.raises(ValueError, match=r"plain.parquet: row 0 \(0-based\) of the training data: column 'prompt' is "
                                         r"not a list of chat messages"):
        cpu_plan(GRPO, launch_inputs, ["data.train_batch_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=1"],
                 train_files=str(plain))
    line = refused(SFT, launch_inputs, train_files=str(launch_inputs.train))  # an RL parquet given to the SFT recipe
    assert "no column 'messages'" in line and "(pass a parquet with a `messages` column (python -m data_prep.sft))" in line
    renamed = tmp_path / "renamed.parquet"
    pd.read_parquet(launch_inputs.train).rename(columns={"prompt": "question"}).to_parquet(renamed)
    assert "no column 'prompt'" in refused(GRPO, launch_inputs, train_files=str(renamed))
    assert cpu_plan(GRPO, launch_inputs, ["data.prompt_key=question"], train_files=str(renamed))  # the column key


@pytest.mark.slow
def test_an_opsd_teacher_checkpoint_that_does_not_exist(launch_inputs):
    line = refused(OPSD, launch_inputs, ["opsd.teacher.kind=checkpoint", "opsd.teacher.path=/nonexistent/teacher"])
    assert line == ("error: opsd.teacher.path=/nonexistent/teacher (command line): no such model directory "
                    "(pass opsd.teacher.path=<a Hugging Face model directory or a Hub id such as Qwen/Qwen3-1.7B>)")
    launch = cpu_plan(OPSD, launch_inputs, ["opsd.teacher.kind=checkpoint", f"opsd.teacher.path={launch_inputs.model}",
                                            "opsd.teacher.allow_zero_loss=true"])
    assert launch.config.opsd.teacher.path == str(launch_inputs.model)


@pytest.mark.slow
def test_a_broken_resume_checkpoint_is_refused(launch_inputs, tmp_path):
    ckpt = tmp_path / "ckpt"
    (ckpt / "global_step_2" / "actor").mkdir(parents=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("2")
    line = refused(GRPO, launch_inputs, ckpt_dir=str(ckpt))
    assert line.startswith(f"error: trainer.default_local_dir={ckpt} (CKPT_DIR): ")
    assert "no FSDP model shards" in line


@pytest.mark.slow
def test_what_a_dry_run_of_a_demo_or_a_pipeline_stage_builds_first_is_not_checked(launch_inputs, tmp_path):
    later = str(tmp_path / "sft_merged")
    settings = Settings(device="cpu", model_path=later, train_files=str(launch_inputs.train), ckpt_dir=str(tmp_path / "c"))
    launch = plan(GRPO, settings, [], environ=launch_inputs.env, pending=frozenset({later}))
    assert launch.config.actor_rollout_ref.model.path == later
    with pytest.raises(LaunchInputError, match="no such model directory"):
        plan(GRPO, settings, [], environ=launch_inputs.env)


@pytest.mark.slow
def test_the_pipeline_names_its_own_variables(launch_inputs, tmp_path):
    from recipe.tools.pipeline import run_pipeline

    environ = {**launch_inputs.env, "DEVICE": "cpu", "OPSD_CACHE": str(tmp_path / "cache"), "WORK_DIR": str(tmp_path / "w"),
               "BASE_MODEL": str(launch_inputs.model), "SFT_FILES": str(launch_inputs.sft),
               "GRPO_TRAIN_FILES": str(launch_inputs.train), "OPSD_TRAIN_FILES": str(tmp_path / "missing.parquet")}
    with pytest.raises(LaunchInputError) as caught:  # the OPSD stage's file, before the SFT stage starts
        run_pipeline([], environ, dry_run=False)
    assert caught.value.message.startswith(f"data.train_files={tmp_path / 'missing.parquet'} (OPSD_TRAIN_FILES): "
                                           "no such data file (set OPSD_TRAIN_FILES to an existing parquet file)")
    assert not (tmp_path / "w").exists()  # nothing ran


def test_a_dry_run_does_not_ask_the_hub(launch_inputs, tmp_path):
    """Online (a GPU launch: no HF_HUB_OFFLINE) a Hub id that is not cached is asked for by a launch
    (recipe.common.checkpoints.probe_hub); a dry run composes without a network and says so."""
    online = {"HF_HUB_CACHE": str(tmp_path / "empty_cache")}
    launch = plan(GRPO, Settings(device="gpu", model_path="org/not-downloaded", train_files=str(launch_inputs.train),
                                 ckpt_dir=str(tmp_path / "ckpt")), [], environ=online, detect_gpus=lambda: 8,
                  dry_run=True)
    assert ("actor_rollout_ref.model.path=org/not-downloaded is not in the local Hugging Face cache: a launch asks "
            "the Hub for it (a dry run does not)") in launch.notes
    assert "disk: the size of one checkpoint save is not known" in launch.describe()
    # nor for the tokenizer of the data-order check (online, asking the Hub would wait on the network)
    assert launch.data_order_note == ("prompt lengths not checked: cannot load the tokenizer here (org/not-downloaded "
                                      "is not in the local Hugging Face cache and a dry run does not download it)")
