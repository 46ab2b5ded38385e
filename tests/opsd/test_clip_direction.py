"""What the per-entry clip does to the teacher-favoured token: the worked example of the docs, in numbers.

Forward KL at one position, four vocabulary entries (temperature 1), the student's favourite first:

    entry        "+"    "="    "a"    "b"
    pS          0.80   0.05   0.01   0.14
    pT          0.11   0.70   0.14   0.05
    pT ln pT/pS -0.218  1.847  0.369 -0.051    -> forward KL 1.947; clipped at 0.05: -0.170

A clipped term is a constant, so only the kept entries U = {"+", "b"} (sum of pT over U = 0.16) pass
gradient: d loss / d z_v = pS_v x 0.16 - pT_v [v in U] = (0.018, 0.008, 0.0016, -0.0276). A descent
step z <- z - eta g LOWERS the logit of "=" (the entry the teacher prefers most), but the logit of "+"
drops more and "b" rises, so the probability of "=" changes by
dp/deta = -pS_= (g_= - sum_v pS_v g_v) = -0.05 (0.008 - 0.010952) = +0.0001476: it RISES. Without the
clip (g = pS - pT) it rises by 0.05 x 1.1808 = 0.05904 per unit step: exactly 400x more. The sign is
not fixed: with pS = (0.94, 0.05, 0.01), pT = (0.28, 0.70, 0.02) the clipped step lowers p(=) instead.
"""

import math

import pytest
import torch

PS = (0.80, 0.05, 0.01, 0.14)
PT = (0.11, 0.70, 0.14, 0.05)
EQ, TAU = 1, 0.05  # the teacher-favoured entry "=", the paper's tau_clip


def _clipped_forward_kl(z_student, p_teacher, clip_tau):
    """sum_v min(pT_v (ln pT_v - ln pS_v), tau), pS = softmax(z): the paper's eq. opsd_clipped at beta = 0."""
    terms = p_teacher * (p_teacher.log() - torch.log_softmax(z_student, -1))
    return (terms if clip_tau is None else terms.clamp(max=clip_tau)).sum()


def _step(ps, pt, clip_tau):
    """Gradient at z = ln pS, and d p(=) / d eta of the descent step z - eta g at eta = 0 (forward-mode)."""
    p_student, p_teacher = torch.tensor(ps, dtype=torch.float64), torch.tensor(pt, dtype=torch.float64)
    z = p_student.log().requires_grad_(True)
    (grad,) = torch.autograd.grad(_clipped_forward_kl(z, p_teacher, clip_tau), z)
    _, dp_deta = torch.func.jvp(lambda eta: torch.softmax(z.detach() - eta * grad, -1), (torch.zeros((), dtype=torch.float64),),
                                (torch.ones((), dtype=torch.float64),))
    return grad, dp_deta


def test_the_worked_example_terms():
    terms = [t * math.log(t / s) for s, t in zip(PS, PT)]
    assert [round(t, 3) for t in terms] == [-0.218, 1.847, 0.369, -0.051]
    assert sum(terms) == pytest.approx(1.947, abs=5e-4)
    assert sum(min(t, TAU) for t in terms) == pytest.approx(-0.170, abs=5e-4)


def test_with_the_clip_the_logit_of_the_teacher_favoured_token_falls_and_its_probability_rises():
    grad, dp = _step(PS, PT, TAU)
    torch.testing.assert_close(grad, torch.tensor([0.018, 0.008, 0.0016, -0.0276], dtype=torch.float64))
    assert grad[EQ] > 0  # descent lowers the logit of "="
    assert dp[EQ].item() == pytest.approx(0.05 * (0.010952 - 0.008)) == pytest.approx(1.476e-4)  # its probability rises
    # the same numbers from the recipe's loss (full-vocabulary path, clip per vocabulary entry)
    from recipe.opsd.core.losses import token_divergence

    z = torch.tensor(PS, dtype=torch.float64).log()[None].requires_grad_(True)
    token_divergence(z, torch.tensor(PT, dtype=torch.float64).log()[None], beta=0.0, clip_tau=TAU).sum().backward()
    torch.testing.assert_close(z.grad[0], grad)


def test_without_the_clip_the_probability_moves_400_times_more():
    grad, dp = _step(PS, PT, None)
    torch.testing.assert_close(grad, torch.tensor(PS, dtype=torch.float64) - torch.tensor(PT, dtype=torch.float64))
    assert grad[EQ] < 0  # descent raises the logit of "="
    assert dp[EQ].item() == pytest.approx(0.05904)
    _, clipped = _step(PS, PT, TAU)
    assert dp[EQ].item() / clipped[EQ].item() == pytest.approx(400.0)
    # a finite step (eta = 0.1): p(=) 0.05 -> 0.0500147 with the clip, -> 0.0562 without
    for clip_tau, after in ((TAU, 0.0500147), (None, 0.0562316)):
        z = torch.tensor(PS, dtype=torch.float64).log()
        g, _ = _step(PS, PT, clip_tau)
        assert torch.softmax(z - 0.1 * g, -1)[EQ].item() == pytest.approx(after, abs=1e-7)


def test_with_the_clip_the_probability_can_also_fall():
    grad, dp = _step((0.94, 0.05, 0.01), (0.28, 0.70, 0.02), TAU)
    assert grad[EQ] > 0 and dp[EQ].item() == pytest.approx(-6.27e-4, rel=1e-3)
    _, unclipped = _step((0.94, 0.05, 0.01), (0.28, 0.70, 0.02), None)
    assert unclipped[EQ].item() == pytest.approx(0.06189, rel=1e-3)
