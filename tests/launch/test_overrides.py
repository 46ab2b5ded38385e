"""recipe.launch.overrides: each key once, replacements recorded."""

import pytest

from recipe.launch.overrides import Override, OverrideList


@pytest.mark.parametrize(
    ("text", "prefix", "key", "value"),
    [
        ("a.b=1", "", "a.b", "1"),
        ("+model=qwen3_4b", "+", "model", "qwen3_4b"),
        ("++x.y=[1,2]", "++", "x.y", "[1,2]"),
        ("~trainer.logger", "~", "trainer.logger", None),
        ("path=s3://a=b", "", "path", "s3://a=b"),
    ],
)
def test_parse_round_trips(text, prefix, key, value):
    item = Override.parse(text)
    assert (item.prefix, item.key, item.value) == (prefix, key, value)
    assert str(item) == text


@pytest.mark.parametrize("text", ["novalue", "=1", "+"])
def test_parse_rejects_non_overrides(text):
    with pytest.raises(ValueError, match="not a hydra override"):
        Override.parse(text)


def test_one_entry_per_key_last_source_wins_and_is_recorded():
    overrides = OverrideList()
    overrides.add(["trainer.total_training_steps=4", "data.seed=42"], source="demo")
    overrides.add(["+platform=cpu"], source="DEVICE=cpu")
    overrides.add(["trainer.total_training_steps=9", "data.seed=42"], source="command line")
    assert overrides.as_list() == ["+platform=cpu", "trainer.total_training_steps=9", "data.seed=42"]
    # the same value twice is no replacement; a different one is
    assert overrides.replaced == [("trainer.total_training_steps", "4", "demo", "9", "command line")]
    assert overrides.get("trainer.total_training_steps") == "9"
    assert overrides.source("trainer.total_training_steps") == "command line"
    assert "data.seed" in overrides and "data.max_length" not in overrides


def test_group_selections_keep_their_order_ahead_of_values():
    overrides = OverrideList().add(["x=1", "+model=a", "+experiment=[b,c]", "+demo=toy"], source="s")
    assert overrides.as_list() == ["+model=a", "+experiment=[b,c]", "+demo=toy", "x=1"]
