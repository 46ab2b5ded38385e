"""The paper's 300-step run, both readings: ``steps_300_fresh`` (a 300-step run, cosine over 300 updates)
and ``steps_300_continued`` (the 100-step run resumed at its step 100, no jump of the learning rate).

The learning rates come from verl's own scheduler (``verl.utils.torch_functional.
get_cosine_schedule_with_warmup``; the preset tests build it through verl's FSDP engine,
``FSDPEngine._build_lr_scheduler``, from each preset's composed optimizer config) and its resume
(``load_state_dict`` of the saved scheduler state into the scheduler the resumed run builds,
optimizer state with it), the way ``global_step_100`` is continued.
"""

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from verl.utils.torch_functional import get_cosine_schedule_with_warmup

PEAK, RATIO = 1.0e-6, 0.1  # opsd_trainer.yaml: lr, lr_warmup_steps_ratio (cosine, min_lr_ratio 0)


def _run(total, *, steps, resume=None):
    """The lr each update of steps ``start+1 .. steps`` uses (verl: the scheduler steps after each update);
    ``resume`` = (optimizer state, scheduler state, step) of a checkpoint. Returns ({step: lr}, states)."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=PEAK)
    scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=int(RATIO * total), num_training_steps=total)
    start = 0
    if resume is not None:
        optimizer_state, scheduler_state, start = resume
        optimizer.load_state_dict(optimizer_state)
        scheduler.load_state_dict(scheduler_state)
    lrs = {}
    for step in range(start + 1, steps + 1):
        lrs[step] = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
    return lrs, (optimizer.state_dict(), scheduler.state_dict(), steps)


def _cosine(step, total):  # verl's lambda at 0-indexed scheduler step `step`, written out
    warmup = int(RATIO * total)
    if step < warmup:
        return PEAK * step / warmup
    return PEAK * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def test_verl_rebuilds_the_default_schedule_over_300_steps_on_resume():
    """Why steps_300_continued sets its own schedule: resuming with only the step count raised jumps."""
    main, checkpoint = _run(100, steps=100)
    continued, _ = _run(300, steps=300, resume=checkpoint)
    # steps 1..100 of steps_300_continued ARE the main run (its global_step_100 is resumed, not retrained)
    assert main[1] == 0.0 and main[11] == pytest.approx(PEAK) and main[100] == pytest.approx(_cosine(99, 100))
    # step 101 uses the lr the optimizer state saved at step 100 (the end of the 100-step cosine: 0), then
    # the 300-step schedule at the global step, as the resumed scheduler (built for 300 steps) continues
    assert continued[101] == pytest.approx(0.0, abs=1e-20)
    assert continued[102] == pytest.approx(_cosine(101, 300)) == pytest.approx(0.8388e-6, rel=1e-3)
    assert continued[300] == pytest.approx(_cosine(299, 300))
    # the other reading, a fresh 300-step run, is not the main run at step 100: 0.85e-6 instead of 3.0e-10
    fresh, _ = _run(300, steps=100)
    assert fresh[100] == pytest.approx(_cosine(99, 300)) == pytest.approx(0.8467e-6, rel=1e-3)
    assert main[100] == pytest.approx(3.05e-10, rel=1e-2)
    assert fresh[31] == pytest.approx(PEAK) and fresh[11] == pytest.approx(PEAK / 3)


def _preset_lrs(experiment, *, steps, resume=None):
    """Like ``_run``, with the scheduler verl's FSDP engine builds from the preset's composed optimizer config
    (the trainer sets its total_training_steps from trainer.total_training_steps)."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    from recipe.launch.config import compose, get_recipe

    cfg = compose(get_recipe("opsd"), [f"+experiment={experiment}"])
    optim = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor.optim)
    optim.total_training_steps = int(cfg.trainer.total_training_steps)
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=optim.lr)
    scheduler = FSDPEngine._build_lr_scheduler(SimpleNamespace(optimizer_config=optim, rank=1), optimizer)
    start = 0
    if resume is not None:
        optimizer_state, scheduler_state, start = resume
        optimizer.load_state_dict(optimizer_state)
        scheduler.load_state_dict(scheduler_state)
    lrs = {}
    for step in range(start + 1, steps + 1):
        lrs[step] = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
    return lrs, (optimizer.state_dict(), scheduler.state_dict(), steps)


def test_steps_300_fresh_is_one_300_step_schedule():
    """Reading (a), "changes the maximum step count to 300": warmup 30, cosine over 300, nothing at step 101."""
    fresh, _ = _preset_lrs("steps_300_fresh", steps=300)
    assert fresh[100] == pytest.approx(_cosine(99, 300)) == pytest.approx(0.8467e-6, rel=1e-3)
    assert fresh[101] == pytest.approx(_cosine(100, 300)) == pytest.approx(0.8431e-6, rel=1e-3)
    assert fresh[31] == pytest.approx(PEAK) and fresh[300] == pytest.approx(_cosine(299, 300))
    assert max(abs(fresh[s + 1] - fresh[s]) for s in range(31, 300)) < 0.02 * PEAK


@pytest.mark.parametrize("continuation", ["steps_300_continued"])
def test_the_continuation_has_no_jump_at_step_101(continuation):
    """Reading (b), "step 100 is the main-text checkpoint ... continue the same run to 300 updates": the
    default run's step-100 checkpoint resumed; the lr goes on from ~0 without a jump."""
    main, checkpoint = _preset_lrs("default", steps=100)
    continued, _ = _preset_lrs(continuation, steps=300, resume=checkpoint)
    assert main[100] == pytest.approx(3.05e-10, rel=1e-2)  # the end of the 100-step cosine
    assert continued[101] == pytest.approx(0.0, abs=1e-20)  # the optimizer's saved lr
    assert continued[102] == pytest.approx(PEAK * (1 + math.cos(math.pi * 101 / 100)) / 2) == pytest.approx(2.467e-10, rel=1e-3)
    lrs = {**main, **continued}
    assert max(abs(lrs[s + 1] - lrs[s]) for s in range(90, 300)) < 0.02 * PEAK  # no jump anywhere (0.84e-6 before)
    assert continued[201] == pytest.approx(PEAK) and continued[300] == pytest.approx(2.467e-10, rel=1e-3)


@pytest.mark.slow
def test_steps_300_continued_resumes_the_default_runs_step_100(tmp_path, launch_inputs, monkeypatch):
    from recipe.experiments import sweep

    for name, value in launch_inputs.env.items():  # the sweep plans with the process environment (the Hub cache)
        monkeypatch.setenv(name, value)
    plans = sweep.plan_sweep(
        ["default", "steps_300_continued"], model="qwen3_1p7b", sweep_dir=tmp_path / "sweep", device="gpu", dry_run=True,
        overrides=[f"data.train_files={launch_inputs.train}", f"data.val_files={launch_inputs.val}"],
        evaluation=sweep.EvalSettings(),
    )
    default, extended = ({p["name"]: p for p in plans}[name] for name in ("default", "steps_300_continued"))
    cfg = OmegaConf.create(extended["config_yaml"])
    step_100 = Path(default["run_dir"]) / "checkpoints" / "global_step_100"
    assert (cfg.trainer.resume_mode, cfg.trainer.resume_from_path) == ("resume_path", str(step_100))
    assert Path(OmegaConf.create(default["config_yaml"]).trainer.default_local_dir) == step_100.parent
    assert (cfg.trainer.total_training_steps, cfg.trainer.save_freq) == (300, 50)
    assert sorted(int(s) for s in extended["eval"]["checkpoints"]) == [150, 200, 250, 300]
    # every other setting is the default run's (the continuation changes the step count and the schedule's shape)
    base = OmegaConf.create(default["config_yaml"])
    optim, base_optim = (OmegaConf.to_container(c.actor_rollout_ref.actor.optim) for c in (cfg, base))
    assert (optim.pop("lr_warmup_steps_ratio"), optim.pop("num_cycles")) == (0.0, 1.5)
    assert {k: v for k, v in base_optim.items() if k not in ("lr_warmup_steps_ratio", "num_cycles")} == optim
    for key in ("data", "opsd", "actor_rollout_ref.rollout.temperature",
                "actor_rollout_ref.rollout.top_p", "actor_rollout_ref.rollout.top_k", "actor_rollout_ref.model"):
        assert OmegaConf.select(cfg, key) == OmegaConf.select(base, key), key


def test_a_direct_launch_without_the_checkpoint_is_refused_before_ray():
    from recipe.common.checkpoints import verl_resume_dir
    from recipe.common.cli import InputError

    with pytest.raises(InputError, match="trainer.resume_from_path=None must name a global_step_N directory"):
        verl_resume_dir(resume_mode="resume_path", default_local_dir="/ckpt", resume_from_path=None)
