"""Purified OPSD and beta-OPSD (recipe.opsd.core.objectives.purified / beta_opsd) against float64
references written out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from recipe.opsd.core.objectives import get_objective
from recipe.opsd.core.objectives.beta_opsd import BetaOPSDParams, beta_opsd_token_loss, teacher_weight_schedule
from recipe.opsd.core.objectives.purified import PurifiedParams, purified_target_log_probs, purified_token_loss, soft_clip
from recipe.opsd.core.objectives.terms import discounted_returns


def variant_params(name, params):
    """The objective's parameters (``opsd.loss.params``) as its registry entry parses them."""
    return get_objective(name).parse_params(params)

D = torch.float64


def _lp(row):
    """log of a normalised probability row given as a list."""
    return torch.tensor(row, dtype=D).log()


# ------------------------------------------------------------------ Purified OPSD
def test_soft_clip_values():
    x = torch.tensor([0.0, 1.0, -25.0, 1e6], dtype=D)
    got = soft_clip(x, threshold=10.0)
    want = torch.tensor([0.0, 10 * math.tanh(0.1), 10 * math.tanh(-2.5), 10.0], dtype=D)
    torch.testing.assert_close(got, want)


def test_purified_target_hand_computed():
    # logits = log probabilities, so softmax returns them exactly
    p_t = [0.5, 0.3, 0.2]
    p_r = [0.25, 0.5, 0.25]
    got = purified_target_log_probs(_lp(p_t), _lp(p_r), pmi_strength=1.0, pmi_clip=10.0).exp()
    # q_v ~ pT_v * exp(10 tanh(log(pT_v / pR_v) / 10))
    raw = [pt * math.exp(10 * math.tanh(math.log(pt / pr) / 10)) for pt, pr in zip(p_t, p_r)]
    want = torch.tensor([r / sum(raw) for r in raw], dtype=D)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    # without saturation the target is ~ pT^2 / pR: entry 0 is up-weighted, entry 1 down-weighted
    assert got[0] > p_t[0] and got[1] < p_t[1]


def test_purified_identical_teachers_give_teacher_target():
    logits = torch.tensor([[1.0, -0.5, 2.0, 0.3]], dtype=D)
    got = purified_target_log_probs(logits, logits.clone(), teacher_temperature=1.1)
    torch.testing.assert_close(got, torch.log_softmax(logits / 1.1, -1))


def test_purified_saturating_clip_and_strength():
    # Delta = log(0.9 / 1e-30) ~ 67: the clip saturates at 10; strength 2 doubles the exponent
    p_t, p_r = [0.9, 0.1], [1e-30, 1.0 - 1e-30]
    got = purified_target_log_probs(_lp(p_t), _lp(p_r), pmi_strength=2.0, pmi_clip=10.0).exp()
    d0 = 10 * math.tanh(math.log(0.9 / 1e-30) / 10)
    d1 = 10 * math.tanh(math.log(0.1 / (1.0 - 1e-30)) / 10)
    raw = [0.9 * math.exp(2 * d0), 0.1 * math.exp(2 * d1)]
    want = torch.tensor([r / sum(raw) for r in raw], dtype=D)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_purified_loss_is_symmetric_jsd_to_target():
    p_s = [0.6, 0.3, 0.1]
    p_t = [0.2, 0.5, 0.3]
    p_r = [0.3, 0.3, 0.4]
    student = _lp(p_s).requires_grad_(True)
    loss = purified_token_loss(student, _lp(p_t), _lp(p_r), beta=0.5)
    raw = [pt * math.exp(10 * math.tanh(math.log(pt / pr) / 10)) for pt, pr in zip(p_t, p_r)]
    q = [r / sum(raw) for r in raw]
    m = [0.5 * a + 0.5 * b for a, b in zip(p_s, q)]
    want = 0.5 * sum(a * math.log(a / c) for a, c in zip(q, m)) + 0.5 * sum(a * math.log(a / c) for a, c in zip(p_s, m))
    assert loss.dtype == D and loss.shape == ()
    assert abs(loss.item() - want) < 1e-13
    loss.backward()
    assert student.grad is not None and torch.isfinite(student.grad).all()


def test_purified_loss_clip_and_temperature_rows():
    torch.manual_seed(0)
    s, t, r = (torch.randn(2, 3, 5, dtype=D) for _ in range(3))
    got = purified_token_loss(s, t, r, beta=0.0, clip_tau=0.05, student_temperature=1.1, teacher_temperature=0.7)
    logq = purified_target_log_probs(t, r, teacher_temperature=0.7)
    logp = torch.log_softmax(s / 1.1, -1)
    want = (logq.exp() * (logq - logp)).clamp(max=0.05).sum(-1)
    torch.testing.assert_close(got, want)
    assert got.shape == (2, 3)


def test_purified_rejects_bad_input():
    x = torch.zeros(2, 3, dtype=D)
    with pytest.raises(ValueError, match="shapes must match"):
        purified_token_loss(x, x, torch.zeros(2, 4, dtype=D))
    with pytest.raises(ValueError, match="pmi_strength"):
        purified_target_log_probs(x, x, pmi_strength=0)
    with pytest.raises(ValueError, match="threshold"):
        purified_target_log_probs(x, x, pmi_clip=-1.0)


# ------------------------------------------------------------------ beta-OPSD
def test_teacher_weight_schedule():
    assert teacher_weight_schedule(0, total_steps=200) == 0.5
    assert teacher_weight_schedule(199, total_steps=200) == pytest.approx(0.8)
    assert teacher_weight_schedule(1, total_steps=3) == pytest.approx(0.65)
    assert teacher_weight_schedule(0, total_steps=1) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="step must be"):
        teacher_weight_schedule(200, total_steps=200)


def test_discounted_returns_skip_masked_positions():
    rewards = torch.tensor([[1.0, 2.0, 3.0, 9.0], [5.0, 7.0, 1.0, 2.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 0, 1]])
    got = discounted_returns(rewards, mask, discount=0.5)
    want = torch.tensor([[1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3.0, 0.0], [0.0, 7 + 0.5 * 2, 0.0, 2.0]], dtype=D)
    torch.testing.assert_close(got, want)


def test_beta_opsd_hand_computed():
    # one sequence, 2 valid positions + 1 pad, V = 3; logits = log probabilities
    p_s = [[0.5, 0.25, 0.25], [0.1, 0.6, 0.3], [1 / 3, 1 / 3, 1 / 3]]
    p_t = [[0.2, 0.7, 0.1], [0.4, 0.4, 0.2], [1 / 3, 1 / 3, 1 / 3]]
    student = torch.tensor(p_s, dtype=D).log()[None].requires_grad_(True)
    teacher = torch.tensor(p_t, dtype=D).log()[None]
    ids = torch.tensor([[1, 0, 2]])
    mask = torch.tensor([[1, 1, 0]])
    w, gamma = 0.6, 0.99
    out = beta_opsd_token_loss(student, teacher, ids, mask, teacher_weight=w, discount=gamma)
    r0 = math.log(w * 0.7 + (1 - w) * 0.25) - math.log(0.25)
    r1 = math.log(w * 0.4 + (1 - w) * 0.1) - math.log(0.1)
    g0, g1 = r0 + gamma * r1, r1
    torch.testing.assert_close(out.reward_BT, torch.tensor([[r0, r1, 0.0]], dtype=D))
    torch.testing.assert_close(out.return_BT, torch.tensor([[g0, g1, 0.0]], dtype=D))
    torch.testing.assert_close(
        out.loss_BT.detach(), torch.tensor([[-g0 * math.log(0.25), -g1 * math.log(0.1), 0.0]], dtype=D)
    )
    # gradient = -G_t d log pS(y_t) / d logits = -G_t (onehot(y_t) - pS_t)
    out.loss_BT.sum().backward()
    want = torch.zeros(1, 3, 3, dtype=D)
    for t, (g, y) in enumerate(((g0, 1), (g1, 0))):
        onehot = torch.zeros(3, dtype=D)
        onehot[y] = 1.0
        want[0, t] = -g * (onehot - torch.tensor(p_s[t], dtype=D))
    torch.testing.assert_close(student.grad, want)


def test_beta_opsd_teacher_equal_student_gives_zero_reward():
    logits = torch.randn(2, 4, 6, dtype=D)
    ids = torch.randint(0, 6, (2, 4))
    out = beta_opsd_token_loss(logits, logits.clone(), ids, torch.ones(2, 4), teacher_weight=0.8,
                               student_temperature=1.1)
    assert out.reward_BT.abs().max().item() < 1e-12
    assert out.loss_BT.abs().max().item() < 1e-12


def test_beta_opsd_reward_lower_bound_and_bad_ids():
    # teacher puts ~0 mass on the sampled token: r >= log(1 - w)
    student = torch.tensor([[[0.0, 0.0]]], dtype=D)
    teacher = torch.tensor([[[-60.0, 0.0]]], dtype=D)
    out = beta_opsd_token_loss(student, teacher, torch.tensor([[0]]), torch.tensor([[1]]), teacher_weight=0.5)
    assert out.reward_BT.item() == pytest.approx(math.log(0.5), abs=1e-12)
    with pytest.raises(ValueError, match="outside"):
        beta_opsd_token_loss(student, teacher, torch.tensor([[2]]), torch.tensor([[1]]), teacher_weight=0.5)


def test_variant_params_validation():
    assert variant_params("divergence", None) is None
    assert variant_params("purified", {"pmi_strength": 1, "pmi_clip": 10}) == PurifiedParams()
    assert variant_params("beta_opsd", {}) == BetaOPSDParams(0.5, 0.8, 0.99)
    with pytest.raises(ValueError, match="params.discount"):
        variant_params("beta_opsd", {"discount": 1.5})
    with pytest.raises(ValueError, match="unknown opsd.loss.params"):
        variant_params("purified", {"strength": 1})
    with pytest.raises(ValueError, match="must be empty"):
        variant_params("divergence", {"pmi_clip": 10})
    with pytest.raises(ValueError, match="objective must be one of"):
        variant_params("pmi", {})
