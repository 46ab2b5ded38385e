"""Batch sizes that split evenly over the ranks a launch runs on, checked before Ray starts.

verl splits every step's samples over the data-parallel ranks and each rank's share into micro-batches;
a size that does not divide fails mid-run (an ``AssertionError`` in a worker after Ray, the model and the
rollout server have started). ``check_rank_division(recipe, cfg)`` (``recipe.launch.run``) applies the
same arithmetic to the composed config and raises a ``ValueError`` naming the value to change.
"""

from __future__ import annotations

from omegaconf import OmegaConf

# The log-prob passes (config section of their micro-batch) each recipe runs every step.
LOG_PROB_ROLES = {"grpo": ("rollout", "ref"), "opsd": ("ref",)}


def _get(cfg, key: str):
    return OmegaConf.select(cfg, key, default=None)


def _fix(key: str, value: int, total: int, what: str) -> str:
    divisors = [d for d in range(1, total + 1) if total % d == 0]
    return (f"{key}={value} does not divide the {total} {what}: set it to one of {divisors} "
            "(or change the batch size or the rank count: CPU_NUM_RANKS on a CPU, NGPUS / NNODES on GPUs)")


def check_rank_division(recipe: str, cfg) -> None:
    """ValueError (one line: the value, the arithmetic, the fix) unless ``cfg``'s batch sizes split over its ranks::

        ranks         = trainer.n_gpus_per_node x trainer.nnodes   (CPU: CPU_NUM_RANKS; GPU: NGPUS / NNODES)
        samples       = data.train_batch_size x actor_rollout_ref.rollout.n       (RL recipes, per step)
        per rank      = samples / ranks               each must divide by the log-prob micro-batches
        mini per rank = actor.ppo_mini_batch_size x rollout.n / ranks   must divide by ppo_micro_batch_size_per_gpu
        SFT           = data.train_batch_size / ranks  must divide by data.micro_batch_size_per_gpu

    Micro-batch sizes are checked only where verl uses them: without dynamic batching (``use_dynamic_bsz``
    false: the CPU platform; with it, token budgets replace them), and for the roles the recipe runs
    (``LOG_PROB_ROLES``: GRPO the actor's old log-probs and, with ``use_kl_loss``, the reference; OPSD the
    frozen teacher on the reference role).
    """
    ranks = int(_get(cfg, "trainer.n_gpus_per_node") or 1) * int(_get(cfg, "trainer.nnodes") or 1)
    if recipe == "sft":
        batch, micro = int(_get(cfg, "data.train_batch_size")), _get(cfg, "data.micro_batch_size_per_gpu")
        if batch % ranks:
            raise ValueError(f"data.train_batch_size={batch} does not split over {ranks} ranks: use a multiple of {ranks}")
        if not _get(cfg, "data.use_dynamic_bsz") and micro is not None and (batch // ranks) % int(micro):
            raise ValueError(_fix("data.micro_batch_size_per_gpu", int(micro), batch // ranks,
                                  f"rows each of the {ranks} ranks trains on per step (data.train_batch_size={batch})"))
        return
    if recipe not in LOG_PROB_ROLES:
        return
    actor = "actor_rollout_ref.actor"
    batch, n = int(_get(cfg, "data.train_batch_size")), int(_get(cfg, "actor_rollout_ref.rollout.n") or 1)
    samples = batch * n
    arithmetic = f"data.train_batch_size={batch} x actor_rollout_ref.rollout.n={n} over {ranks} ranks"
    if samples % ranks:
        raise ValueError(f"the {samples} samples of a step ({arithmetic}) do not split over the ranks: "
                         f"make data.train_batch_size x rollout.n a multiple of {ranks}")
    per_rank = samples // ranks
    if not _get(cfg, f"{actor}.use_dynamic_bsz"):
        mini = int(_get(cfg, f"{actor}.ppo_mini_batch_size"))
        if (mini * n) % ranks or mini * n < ranks:
            raise ValueError(f"{actor}.ppo_mini_batch_size={mini} x rollout.n={n} does not split over {ranks} ranks: "
                             f"make it a multiple of {ranks}")
        micro = _get(cfg, f"{actor}.ppo_micro_batch_size_per_gpu")
        if micro is not None and (mini * n // ranks) % int(micro):
            raise ValueError(_fix(f"{actor}.ppo_micro_batch_size_per_gpu", int(micro), mini * n // ranks,
                                  f"samples of a mini-batch per rank ({actor}.ppo_mini_batch_size={mini} x rollout.n={n} "
                                  f"over {ranks} ranks)"))
    for role in LOG_PROB_ROLES[recipe]:
        section = f"actor_rollout_ref.{role}"
        if role == "ref" and recipe == "grpo" and not _get(cfg, f"{actor}.use_kl_loss"):
            continue
        micro = _get(cfg, f"{section}.log_prob_micro_batch_size_per_gpu")
        if micro is None or _get(cfg, f"{section}.log_prob_use_dynamic_bsz"):
            continue
        if per_rank % int(micro):
            raise ValueError(_fix(f"{section}.log_prob_micro_batch_size_per_gpu", int(micro), per_rank,
                                  f"samples each rank scores per step ({arithmetic})"))
