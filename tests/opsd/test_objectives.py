"""recipe.opsd.core.objectives.terms in float64: by hand on 2-3 token examples, against verl 0.9.1's policy loss and
GRPO advantage, against the reverse-KL gradient, and exact across micro-batches."""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from recipe.opsd.core.losses import log_probs, token_divergence
from recipe.opsd.core.objectives import objective_names
from recipe.opsd.core.objectives.terms import (
    group_advantages,
    mix_task_advantages,
    policy_gradient_terms,
    sampled_token_advantages,
    sft_nll_terms,
    weighted_sum,
)

D = torch.float64
LN2 = math.log(2.0)


def _logits(*rows):
    """Logits whose softmax at temperature 1 is exactly the given probability rows."""
    return torch.tensor(rows, dtype=D).log()


def _token_log_probs(logits_TV, tokens_T, temperature=1.0):
    return log_probs(logits_TV, temperature=temperature, dtype=D).gather(-1, tokens_T[:, None]).squeeze(-1)


# --------------------------------------------------------------------------- (a) sampled-token advantage
def test_advantages_by_hand():
    # two positions, V = 3; pS = (1/2, 1/4, 1/4), pT = (1/4, 1/2, 1/4) at both; sampled y = (1, 0)
    student = _logits([0.5, 0.25, 0.25], [0.5, 0.25, 0.25])
    teacher = _logits([0.25, 0.5, 0.25], [0.25, 0.5, 0.25])
    y = torch.tensor([1, 0])
    lt, ls = _token_log_probs(teacher, y)[None], _token_log_probs(student, y)[None]
    mask = torch.ones(1, 2, dtype=torch.bool)
    adv = sampled_token_advantages(teacher_log_probs_BT=lt, old_log_probs_BT=ls, mask_BT=mask)
    torch.testing.assert_close(adv, torch.tensor([[LN2, -LN2]], dtype=D), rtol=0, atol=1e-15)
    # discount 0.5: A_1 = ln2 + 0.5 (-ln2), A_2 = -ln2 (tinker's kl_discount_factor)
    adv = sampled_token_advantages(teacher_log_probs_BT=lt, old_log_probs_BT=ls, mask_BT=mask, discount=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.5 * LN2, -LN2]], dtype=D), rtol=0, atol=1e-15)
    # masked position: 0, and nothing depends on what it holds
    lt_nan = lt.clone()
    lt_nan[0, 1] = float("nan")
    adv = sampled_token_advantages(teacher_log_probs_BT=lt_nan, old_log_probs_BT=ls, mask_BT=torch.tensor([[True, False]]))
    torch.testing.assert_close(adv, torch.tensor([[LN2, 0.0]], dtype=D))


def test_advantages_at_the_sampling_temperature_by_hand():
    # student at tau_S = 2: pS ∝ sqrt(1/2, 1/4, 1/4) = (0.7071, 0.5, 0.5); teacher at 1
    student = _logits([0.5, 0.25, 0.25])
    teacher = _logits([0.25, 0.5, 0.25])
    y = torch.tensor([1])
    ls = _token_log_probs(student, y, temperature=2.0)[None]
    lt = _token_log_probs(teacher, y)[None]
    adv = sampled_token_advantages(teacher_log_probs_BT=lt, old_log_probs_BT=ls, mask_BT=torch.ones(1, 1))
    z = math.sqrt(0.5) + 0.5 + 0.5
    torch.testing.assert_close(adv, torch.tensor([[math.log(0.5) - math.log(0.5 / z)]], dtype=D))


def test_advantages_carry_no_gradient():
    ls = torch.tensor([[-1.0, -2.0]], dtype=D, requires_grad=True)
    adv = sampled_token_advantages(teacher_log_probs_BT=torch.zeros(1, 2, dtype=D), old_log_probs_BT=ls,
                                   mask_BT=torch.ones(1, 2))
    assert not adv.requires_grad


# --------------------------------------------------------------------------- the surrogate
# (A, log r, expected l, expected dl/dlog pS) for eps = 0.2, dual clip c = 3
SURROGATE_CASES = [
    (LN2, 0.0, -LN2, -LN2),  # r = 1: -A, gradient -A r
    (LN2, math.log(1.5), -1.2 * LN2, 0.0),  # A > 0, r above 1 + eps: clipped, no gradient
    (LN2, math.log(0.5), -0.5 * LN2, -0.5 * LN2),  # A > 0, r below 1 - eps: the unclipped term is larger
    (-1.0, math.log(0.5), 0.8, 0.0),  # A < 0, r below 1 - eps: clipped at 0.8
    (-1.0, math.log(2.0), 2.0, 2.0),  # A < 0, r = 2: unclipped, under the dual clip 3
    (-1.0, math.log(5.0), 3.0, 0.0),  # A < 0, r = 5: the dual clip -c A = 3
]


@pytest.mark.parametrize(("adv", "log_ratio", "loss", "grad"), SURROGATE_CASES)
def test_surrogate_by_hand(adv, log_ratio, loss, grad):
    old = torch.tensor([[-1.3]], dtype=D)
    new = (old + log_ratio).clone().requires_grad_(True)
    terms = policy_gradient_terms(log_probs_BT=new, old_log_probs_BT=old, advantages_BT=torch.tensor([[adv]], dtype=D))
    terms.sum().backward()
    assert terms.item() == pytest.approx(loss, abs=1e-14)
    assert new.grad.item() == pytest.approx(grad, abs=1e-14)


def test_unclipped_surrogate_is_minus_ratio_times_advantage():
    # tinker's importance_sampling loss -r A, for every ratio
    old = torch.tensor([[-1.0, -2.0, -0.5]], dtype=D)
    new = old + torch.tensor([[0.0, math.log(3.0), math.log(0.1)]], dtype=D)
    adv = torch.tensor([[0.5, -1.0, 2.0]], dtype=D)
    terms = policy_gradient_terms(log_probs_BT=new, old_log_probs_BT=old, advantages_BT=adv,
                                  clip_ratio_low=None, clip_ratio_high=None)
    torch.testing.assert_close(terms, torch.tensor([[-0.5, 3.0, -0.2]], dtype=D))


def _verl_config(low, high):
    # the attributes compute_policy_loss_vanilla reads (an ActorConfig / DistillationLossConfig stand-in)
    return SimpleNamespace(clip_ratio=low, clip_ratio_low=low, clip_ratio_high=high, global_batch_info={},
                           get=lambda key, default=None: default)


@pytest.mark.parametrize(("low", "high"), [(0.2, 0.2), (0.2, 0.28), (0.1, 0.5)])
def test_surrogate_matches_verl_vanilla_policy_loss(low, high):
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(5, 8, generator=gen, dtype=D) * 3
    log_ratio = torch.randn(5, 8, generator=gen, dtype=D) * 0.6
    log_ratio[1, 0] = math.log(4.0)  # a ratio beyond the dual clip c = 3 ...
    adv = torch.randn(5, 8, generator=gen, dtype=D)
    adv[1, 0] = -0.7  # ... with a negative advantage
    new = (old + log_ratio).requires_grad_(True)
    mask = torch.rand(5, 8, generator=gen) > 0.3
    mask[0] = False  # a fully masked response
    mask[1, 0] = True
    verl_new = new.detach().clone().requires_grad_(True)
    verl_loss, _ = compute_policy_loss_vanilla(old_log_prob=old, log_prob=verl_new, advantages=adv,
                                               response_mask=mask.to(D), loss_agg_mode="token-mean",
                                               config=_verl_config(low, high))
    verl_loss.backward()
    terms = policy_gradient_terms(log_probs_BT=new, old_log_probs_BT=old, advantages_BT=adv,
                                  clip_ratio_low=low, clip_ratio_high=high)
    ours = weighted_sum(terms, weights=mask.to(D) / mask.sum())
    ours.backward()
    torch.testing.assert_close(ours, verl_loss, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(new.grad, verl_new.grad, rtol=1e-13, atol=1e-15)
    # the ratios spanned every region of the clip
    ratio = (new - old).exp()[mask]
    assert (ratio < 1 - low).any() and (ratio > 1 + high).any() and (ratio > 3).any()


def test_expected_gradient_is_the_reverse_kl_gradient():
    # at r = 1, E_{y ~ pS}[grad of l] = E[-A grad log pS(y)] = grad KL(pS || pT) (one position, V = 3, exact sum over y)
    student = torch.tensor([[0.3, -0.2, 1.1]], dtype=D, requires_grad=True)
    teacher = torch.tensor([[1.0, 0.4, -0.7]], dtype=D)
    tau_s, tau_t = 1.1, 0.9
    expected = torch.zeros_like(student)
    p_s = log_probs(student.detach(), temperature=tau_s, dtype=D).exp()[0]
    for y in range(3):
        tokens = torch.tensor([y])
        ls = _token_log_probs(student, tokens, temperature=tau_s)[None]
        lt = _token_log_probs(teacher, tokens, temperature=tau_t)[None]
        adv = sampled_token_advantages(teacher_log_probs_BT=lt, old_log_probs_BT=ls.detach(), mask_BT=torch.ones(1, 1))
        terms = policy_gradient_terms(log_probs_BT=ls, old_log_probs_BT=ls.detach(), advantages_BT=adv)
        (grad,) = torch.autograd.grad(terms.sum(), student)
        expected += p_s[y] * grad
    reverse_kl = token_divergence(student, teacher, beta=1.0, student_temperature=tau_s, teacher_temperature=tau_t)
    (want,) = torch.autograd.grad(reverse_kl.sum(), student)
    torch.testing.assert_close(expected, want, rtol=1e-12, atol=1e-14)


# --------------------------------------------------------------------------- (b) task reward
def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], dtype=D)
    groups = ["a", "a", "a", "b", "c", "c"]
    adv = group_advantages(rewards_B=rewards, group_ids_B=groups)
    # group a: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3); b alone: mean 0, std 1;
    # c constant: 0 / (0 + eps)
    s = math.sqrt(1 / 3) + 1e-6
    want = torch.tensor([(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s, 1 / (1 + 1e-6), 0.0, 0.0], dtype=D)
    torch.testing.assert_close(adv, want, rtol=1e-14, atol=1e-15)
    centred = group_advantages(rewards_B=rewards, group_ids_B=groups, normalize_by_std=False)
    torch.testing.assert_close(centred, torch.tensor([2 / 3, -1 / 3, -1 / 3, 1.0, 0.0, 0.0], dtype=D))


@pytest.mark.parametrize("normalize_by_std", [True, False])
def test_group_advantages_match_verl_grpo(normalize_by_std):
    import numpy as np
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    gen = torch.Generator().manual_seed(3)
    rewards = (torch.rand(12, generator=gen, dtype=D) > 0.5).to(D) + 0.25 * torch.rand(12, generator=gen, dtype=D)
    uids = np.array(["p0"] * 4 + ["p1"] * 4 + ["p2"] * 3 + ["p3"], dtype=object)
    mask = torch.ones(12, 5, dtype=D)
    token_rewards = torch.zeros(12, 5, dtype=D)
    token_rewards[:, -1] = rewards
    want, _ = compute_grpo_outcome_advantage(token_rewards, mask, uids, norm_adv_by_std_in_grpo=normalize_by_std)
    got = group_advantages(rewards_B=rewards, group_ids_B=list(uids), normalize_by_std=normalize_by_std)
    torch.testing.assert_close(got[:11, None].expand(11, 5), want[:11], rtol=1e-13, atol=1e-15)
    # verl divides a lone response by float32(1 + 1e-6) (its std constant is a float32 tensor); we use float64
    torch.testing.assert_close(got[11:, None].expand(1, 5), want[11:], rtol=1e-7, atol=0)


def test_mix_task_advantages_by_hand():
    distill = torch.tensor([[LN2, -LN2, 0.5], [1.0, 2.0, 3.0]], dtype=D)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    mixed = mix_task_advantages(distill_advantages_BT=distill, task_advantages_B=torch.tensor([1.0, -2.0], dtype=D),
                                mask_BT=mask, task_weight=0.5)
    torch.testing.assert_close(mixed, torch.tensor([[LN2 + 0.5, -LN2 + 0.5, 0.0], [0.0, 0.0, 0.0]], dtype=D))


# --------------------------------------------------------------------------- (c) SFT term
def test_sft_nll_by_hand_and_against_cross_entropy():
    # solution (s1, s2) = (0, 2) under pS = (1/2, 1/4, 1/4) then (1/8, 1/8, 3/4): NLL ln 2 and ln(4/3)
    logits = _logits([0.5, 0.25, 0.25], [0.125, 0.125, 0.75])
    solution = torch.tensor([0, 2])
    nll = sft_nll_terms(solution_log_probs_N=_token_log_probs(logits, solution))
    torch.testing.assert_close(nll, torch.tensor([LN2, math.log(4 / 3)], dtype=D))
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(9, 11, generator=gen, dtype=D, requires_grad=True)
    tokens = torch.randint(0, 11, (9,), generator=gen)
    ours = weighted_sum(sft_nll_terms(solution_log_probs_N=_token_log_probs(logits, tokens)),
                        weights=torch.full((9,), 1 / 9, dtype=D))
    torch.testing.assert_close(ours, F.cross_entropy(logits, tokens), rtol=1e-14, atol=1e-15)


# --------------------------------------------------------------------------- normalisation and combination
def test_micro_batches_sum_to_the_mini_batch_token_mean():
    gen = torch.Generator().manual_seed(4)
    old = -torch.rand(6, 9, generator=gen, dtype=D) * 2
    new = (old + 0.3 * torch.randn(6, 9, generator=gen, dtype=D)).requires_grad_(True)
    adv = torch.randn(6, 9, generator=gen, dtype=D)
    lengths = torch.tensor([9, 1, 4, 7, 2, 5])
    mask = torch.arange(9)[None, :] < lengths[:, None]  # unequal lengths
    tokens = int(mask.sum())
    whole = weighted_sum(policy_gradient_terms(log_probs_BT=new, old_log_probs_BT=old, advantages_BT=adv),
                         weights=mask.to(D) / tokens)
    (grad_whole,) = torch.autograd.grad(whole, new)
    parts = []
    for rows in (slice(0, 2), slice(2, 3), slice(3, 6)):  # uneven micro-batches
        terms = policy_gradient_terms(log_probs_BT=new[rows], old_log_probs_BT=old[rows], advantages_BT=adv[rows])
        parts.append(weighted_sum(terms, weights=mask[rows].to(D) / tokens))
    total = sum(parts)
    (grad_parts,) = torch.autograd.grad(total, new)
    torch.testing.assert_close(total, whole, rtol=1e-14, atol=1e-16)
    torch.testing.assert_close(grad_parts, grad_whole, rtol=1e-14, atol=1e-16)
    # and the mini-batch value is the plain token mean of the per-token terms
    terms = policy_gradient_terms(log_probs_BT=new, old_log_probs_BT=old, advantages_BT=adv)
    torch.testing.assert_close(whole, terms[mask].mean(), rtol=1e-14, atol=1e-16)


def test_weighted_sum_ignores_zero_weight_garbage():
    values = torch.tensor([1.0, float("nan"), 3.0], dtype=D, requires_grad=True)
    total = weighted_sum(values, weights=torch.tensor([0.5, 0.0, 0.25], dtype=D))
    total.backward()
    assert total.item() == 1.25
    torch.testing.assert_close(values.grad, torch.tensor([0.5, 0.0, 0.25], dtype=D))


# what the shipped objectives declare: (needs_reference_forward, uses_policy_gradient, supports_topk,
# supports_task_reward, supports_sft, needs_task_reward, step_value_names), in the registry's order
SHIPPED = {
    "divergence": (False, False, True, True, True, False, ()),
    "sampled_token": (False, True, False, True, True, False, ()),
    "purified": (True, False, False, False, False, False, ()),
    "beta_opsd": (False, False, False, False, False, False, ("teacher_weight",)),
    "rlsd": (False, True, False, False, False, True, ("rlsd_lambda",)),
}


def _declared(cls):
    return (cls.needs_reference_forward, cls.uses_policy_gradient, cls.supports_topk, cls.supports_task_reward,
            cls.supports_sft, cls.needs_task_reward, cls.step_value_names)


def test_the_registry_knows_each_objective_and_what_it_needs():
    """Every module of the package registers its objective, listed by its declared ``order``; the shipped ones
    declare what they need (``SHIPPED``); a new one needs no line here."""
    import pkgutil

    from recipe.opsd.core import objectives
    from recipe.opsd.core.objectives import get_objective
    from recipe.opsd.core.objectives.base import HELPER_MODULES

    names = objective_names()
    assert names == sorted(names, key=lambda name: (get_objective(name).order, name))
    assert [name for name in names if name in SHIPPED] == list(SHIPPED)  # divergence, sampled_token, purified, ...
    modules = {m.name for m in pkgutil.iter_modules(objectives.__path__)} - set(HELPER_MODULES)
    assert {get_objective(name).__module__.rsplit(".", 1)[-1] for name in names} == modules
    assert {name: _declared(get_objective(name)) for name in SHIPPED} == SHIPPED
    with pytest.raises(ValueError, match="opsd.loss.objective must be one of"):
        get_objective("reverse_kl")


@pytest.mark.parametrize("name", objective_names())
def test_each_objectives_declared_attributes_are_what_the_config_and_the_glue_see(name):
    """What an objective declares is what the config accepts (``supports_*``) and what the glue is told
    (``uses_surrogate``, ``uses_task_reward``, ``step_values``) at the shared settings' defaults."""
    from recipe.opsd.core.config import LossConfig
    from recipe.opsd.core.objectives import get_objective

    cls = get_objective(name)
    built = LossConfig(objective=name).build_objective()
    assert built.uses_surrogate() is cls.uses_policy_gradient
    assert built.uses_task_reward() is cls.needs_task_reward
    assert set(built.step_values(step=0, total_steps=10)) == set(cls.step_value_names)
    for setting, supported in (("topk", cls.supports_topk), ("task_weight", cls.supports_task_reward),
                               ("sft_weight", cls.supports_sft)):
        value = 4 if setting == "topk" else 0.1
        if supported:
            LossConfig(objective=name, **{setting: value})
        else:
            with pytest.raises(ValueError, match=f"opsd.loss.{setting}"):
                LossConfig(objective=name, **{setting: value})


def test_objective_modules_are_found_by_discovery(tmp_path, monkeypatch):
    """A package's objective modules are imported by discovery: a new module registers its objective, the
    helpers and private modules are skipped (here they raise if imported), the order is the declared one."""
    from recipe.opsd.core.objectives import get_objective
    from recipe.opsd.core.objectives.base import _REGISTRY, import_objective_modules

    package = tmp_path / "throwaway_objectives"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for helper in ("base", "terms", "_private"):
        (package / f"{helper}.py").write_text("raise AssertionError('a helper module was imported')\n")
    (package / "zz_late.py").write_text(
        "from recipe.opsd.core.objectives import Objective, register_objective\n\n\n"
        "@register_objective\nclass Late(Objective):\n    name = 'test_zz_late'\n    order = -1\n")
    (package / "early.py").write_text(
        "from recipe.opsd.core.objectives import Objective, register_objective\n\n\n"
        "@register_objective\nclass Early(Objective):\n    name = 'test_early'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert import_objective_modules(package="throwaway_objectives", path=[str(package)]) == ["early", "zz_late"]
        names = objective_names()
        assert names[0] == "test_zz_late" and names[-1] == "test_early"  # order -1 first; the default order last
        assert get_objective("test_early").__module__ == "throwaway_objectives.early"
    finally:
        for name in ("test_early", "test_zz_late"):
            _REGISTRY.pop(name, None)
        for module in ("throwaway_objectives", "throwaway_objectives.early", "throwaway_objectives.zz_late"):
            sys.modules.pop(module, None)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(objective="reverse_kl"), "opsd.loss.objective must be one of"),
        (dict(task_weight=-0.1), "opsd.loss.task_weight"),
        (dict(sft_weight=float("nan")), "opsd.loss.sft_weight"),
        (dict(clip_ratio_low=None), "both be numbers or both be null"),
        (dict(clip_ratio_low=1.0), "clip_ratio_low must be < 1"),
        (dict(clip_ratio_high=0.0), "clip_ratio_high must be >"),
        (dict(objective="sampled_token", params={"discount": 1.5}), "discount"),
        (dict(objective="purified", task_weight=0.1), "task_weight=0.1 is not supported by opsd.loss.objective='purified'"),
        (dict(objective="beta_opsd", sft_weight=0.1), "sft_weight=0.1 is not supported"),
        (dict(objective="sampled_token", topk=4), "opsd.loss.topk must be null with opsd.loss.objective='sampled_token'"),
        (dict(params={"discount": 0.5}), "must be empty for objective 'divergence'"),
    ],
)
def test_the_loss_config_validates_naming_the_field(kwargs, match):
    from recipe.opsd.core.config import LossConfig

    with pytest.raises(ValueError, match=match):
        LossConfig(**kwargs)


def test_a_new_objective_is_one_registered_class():
    """A loss the glue has never heard of: registered in a test, selected by name, run by the unchanged
    glue (``actor_loss.opsd_loss``) on a micro-batch -- no branch on its name anywhere."""
    import dataclasses

    from recipe.opsd.actor_loss import STEP_VALUE_PREFIX, opsd_loss
    from recipe.opsd.core.config import LossConfig
    from recipe.opsd.core.objectives import Objective, ObjectiveLoss, register_objective
    from recipe.opsd.core.objectives import base

    @dataclasses.dataclass(frozen=True)
    class ScaleParams:
        scale: float = 1.0

    @register_objective
    class SampledTokenNLL(Objective):
        """scale x the step's value x -log pS(y) of each sampled token (a toy)."""

        name = "test_sampled_nll"
        Params = ScaleParams
        step_value_names = ("factor",)

        def step_values(self, *, step, total_steps):
            return {"factor": float(step + 1)}

        def loss(self, batch):
            logp_bR = self.student_log_probs_bR(batch)
            per_token_N = -logp_bR[batch.loss_mask_bR] * self.params.scale * batch.step_values["factor"]
            loss = (per_token_N * batch.weight_bR[batch.loss_mask_bR].to(per_token_N.dtype)).sum()
            return ObjectiveLoss(loss=loss, per_token_N=per_token_N, signals=batch.signals)

    try:
        cfg = LossConfig(objective="test_sampled_nll", params={"scale": 2.0}, student_temperature=1.0, chunk_size=2)
        assert cfg.build_objective().step_values(step=2, total_steps=5) == {"factor": 3.0}
        gen = torch.Generator().manual_seed(0)
        hs = torch.randn(2, 3, 4, generator=gen, dtype=D, requires_grad=True)
        ws = torch.randn(5, 4, generator=gen, dtype=D, requires_grad=True)
        mask = torch.tensor([[True, True, False], [True, False, False]])
        ids = torch.randint(0, 5, (2, 3), generator=gen)
        data = {"teacher_hidden": hs.detach(), "loss_mask": mask, "response_mask": mask, "responses": ids,
                "dp_size": 1, "batch_num_tokens": 3, "opsd_loss_sequences": 2, "opsd_response_tokens": 3,
                STEP_VALUE_PREFIX + "factor": 3.0}
        loss, metrics = opsd_loss({"student_hidden": hs, "student_weight": ws, "student_bias": None}, data,
                                  loss_config=cfg, teacher_weight_VH=ws.detach())
        logp = torch.log_softmax(hs @ ws.T, -1).gather(-1, ids[..., None])[..., 0]
        # the paper's per-rollout mean (2 rollouts): (mean of row 0's two terms + row 1's term) / 2
        want = (-(logp[0, 0] + logp[0, 1]) / 2 - logp[1, 0]) / 2 * 2.0 * 3.0
        assert loss.item() == pytest.approx(want.item(), rel=1e-12)
        assert "opsd/fwd_kl" in metrics  # the glue's diagnostics pass ran for it
    finally:
        base._REGISTRY.pop("test_sampled_nll", None)
