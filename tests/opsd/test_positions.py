"""Loss-position masks of recipe.opsd.core.positions on ragged right-padded batches, checked
against hand-written masks (selection for the loss of paper eq:opsd_clipped).

Run: python -m pytest tests/opsd/test_positions.py
"""

import pytest
import torch

from recipe.opsd.core.positions import (
    PositionSpec,
    entropy_fraction,
    final_n,
    first_n,
    parse_position_spec,
    select_positions,
    teacher_topk,
    uniform_n,
)

# rows: 5 valid, 2 valid, empty, 7 valid (full)
MASK = torch.tensor([
    [1, 1, 1, 1, 1, 0, 0],
    [1, 1, 0, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0, 0],
    [1, 1, 1, 1, 1, 1, 1],
])


def _b(rows):
    return torch.tensor(rows, dtype=torch.bool)


def test_first_n_by_hand():
    expect = _b([[1, 1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0], [0] * 7, [1, 1, 1, 0, 0, 0, 0]])
    assert torch.equal(first_n(MASK, n=3), expect)
    assert torch.equal(select_positions("first:3", response_mask_BT=MASK), expect)


def test_final_n_by_hand():
    expect = _b([[0, 0, 0, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0, 0], [0] * 7, [0, 0, 0, 0, 0, 1, 1]])
    assert torch.equal(final_n(MASK, n=2), expect)
    assert torch.equal(select_positions("final:2", response_mask_BT=MASK), expect)


def test_first_and_final_with_a_hole_in_the_mask():
    mask = torch.tensor([[1, 0, 1, 1, 0, 1, 0]])
    assert torch.equal(first_n(mask, n=2), _b([[1, 0, 1, 0, 0, 0, 0]]))
    assert torch.equal(final_n(mask, n=2), _b([[0, 0, 0, 1, 0, 1, 0]]))


def test_uniform_n_counts_subset_and_reproducibility():
    sel = uniform_n(MASK, n=3, seed=7)
    assert torch.equal(sel.sum(1), torch.tensor([3, 2, 0, 3]))  # at most n per row
    assert not (sel & ~MASK.bool()).any()
    assert torch.equal(sel, uniform_n(MASK, n=3, seed=7))
    long_mask = torch.ones(4, 200, dtype=torch.long)
    a, b = uniform_n(long_mask, n=20, seed=1), uniform_n(long_mask, n=20, seed=2)
    assert not torch.equal(a, b)
    assert torch.equal(select_positions("uniform:20", response_mask_BT=long_mask, seed=1), a)
    # not just the first positions: the draw spreads over the sequence
    assert a[:, 100:].any()


def test_uniform_n_is_roughly_uniform_over_positions():
    mask = torch.ones(4000, 10, dtype=torch.long)
    freq = uniform_n(mask, n=2, seed=0).float().mean(0)
    assert torch.allclose(freq, torch.full((10,), 0.2), atol=0.03)


ENT = torch.tensor([
    [0.5, 2.0, 1.0, 3.0, 0.1, 9.0, 9.0],   # padded positions carry huge entropies: must be ignored
    [0.2, 0.3, 9.0, 9.0, 9.0, 9.0, 9.0],
    [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
    [0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1],
])


def test_entropy_fraction_highest_by_hand():
    # fraction 0.4: ceil(0.4*5)=2, ceil(0.4*2)=1, 0, ceil(0.4*7)=3
    expect = _b([[0, 1, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0], [0] * 7, [1, 1, 1, 0, 0, 0, 0]])
    assert torch.equal(entropy_fraction(MASK, ENT, fraction=0.4, highest=True), expect)
    assert torch.equal(select_positions("he:0.4", response_mask_BT=MASK, entropy_BT=ENT), expect)


def test_entropy_fraction_lowest_by_hand():
    expect = _b([[1, 0, 0, 0, 1, 0, 0], [1, 0, 0, 0, 0, 0, 0], [0] * 7, [0, 0, 0, 0, 1, 1, 1]])
    assert torch.equal(entropy_fraction(MASK, ENT, fraction=0.4, highest=False), expect)
    assert torch.equal(select_positions("le:0.4", response_mask_BT=MASK, entropy_BT=ENT), expect)


def test_entropy_fraction_rounding_and_ties():
    # 0.1 * 30 = 3.0000000000000004 in floating point: still keeps exactly 3
    mask = torch.ones(1, 30, dtype=torch.long)
    ent = torch.arange(30.0)[None]
    assert int(entropy_fraction(mask, ent, fraction=0.1, highest=True).sum()) == 3
    # ties are broken by the earlier position
    sel = entropy_fraction(torch.ones(1, 4), torch.ones(1, 4), fraction=0.5, highest=True)
    assert torch.equal(sel, _b([[1, 1, 0, 0]]))
    # HE20 and LE80 partition a completion when 0.2 * n is an integer
    mask = torch.ones(3, 10)
    ent = torch.randn(3, 10, generator=torch.Generator().manual_seed(0))
    he20 = entropy_fraction(mask, ent, fraction=0.2, highest=True)
    le80 = entropy_fraction(mask, ent, fraction=0.8, highest=False)
    assert torch.equal(he20 ^ le80, torch.ones(3, 10, dtype=torch.bool))


def test_teacher_topk_by_hand():
    rank = torch.tensor([
        [0, 5, 3, 4, 1, 0, 0],
        [16, 15, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0],
        [0, 1, 2, 3, 4, 20, 100],
    ])
    expect = _b([[1, 0, 1, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0], [0] * 7, [1, 1, 1, 1, 0, 0, 0]])
    assert torch.equal(teacher_topk(MASK, rank, k=4), expect)
    assert torch.equal(select_positions("advt:4", response_mask_BT=MASK, teacher_rank_BT=rank), expect)
    # rank 16 is outside the top 16 (ranks 0..15), rank 15 inside
    assert torch.equal(teacher_topk(MASK, rank, k=16)[1], _b([0, 1, 0, 0, 0, 0, 0]))


def test_all_is_the_response_mask():
    assert torch.equal(select_positions("all", response_mask_BT=MASK), MASK.bool())


@pytest.mark.parametrize("spec, parsed", [
    ("all", PositionSpec("all", None)), ("first:256", PositionSpec("first", 256)),
    ("uniform:256", PositionSpec("uniform", 256)), ("final:256", PositionSpec("final", 256)),
    ("he:0.2", PositionSpec("he", 0.2)), ("le:0.8", PositionSpec("le", 0.8)), ("advt:16", PositionSpec("advt", 16)),
])
def test_parse_position_spec(spec, parsed):
    assert parse_position_spec(spec) == parsed


@pytest.mark.parametrize("spec", ["", "everything", "first", "first:0", "first:-3", "first:2.5", "uniform:abc",
                                  "he:20", "he:1", "le:0", "advt:0", "he:", 256])
def test_bad_specs_raise_naming_the_spec(spec):
    with pytest.raises(ValueError, match="allowed: all | first:N"):
        parse_position_spec(spec)
    with pytest.raises(ValueError, match=repr(spec).replace("[", r"\[")):
        parse_position_spec(spec)


def test_missing_inputs_and_bad_shapes():
    with pytest.raises(ValueError, match="entropy_BT"):
        select_positions("he:0.2", response_mask_BT=MASK)
    with pytest.raises(ValueError, match="teacher_rank_BT"):
        select_positions("advt:4", response_mask_BT=MASK)
    with pytest.raises(ValueError, match="entropy_BT"):
        entropy_fraction(MASK, ENT[:, :3], fraction=0.2, highest=True)
    with pytest.raises(ValueError, match="response_mask_BT"):
        first_n(torch.ones(5), n=2)
    with pytest.raises(ValueError, match="n must be"):
        first_n(MASK, n=0)


@pytest.mark.parametrize("spec", ["all", "first:3", "final:3", "uniform:3", "he:0.5", "le:0.5", "advt:2"])
def test_every_mask_is_a_subset_of_the_response_mask(spec):
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([0, 1, 4, 9, 12])
    mask = (torch.arange(12)[None] < lengths[:, None]).long()
    sel = select_positions(spec, response_mask_BT=mask, entropy_BT=torch.rand(5, 12, generator=g),
                           teacher_rank_BT=torch.randint(0, 5, (5, 12), generator=g), seed=4)
    assert sel.dtype == torch.bool and sel.shape == mask.shape
    assert not (sel & ~mask.bool()).any()
    assert sel[0].sum() == 0 and sel[1].sum() <= 1
