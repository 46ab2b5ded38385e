"""recipe.common.cli: the one-line input error, --debug / OPSD_DEBUG, the shared readers and refusals, a log
that survives a full disk."""

import json
from pathlib import Path

import pytest

from recipe.common import cli
from recipe.common.cli import InputError, MissingInputError, OutputExistsError


def test_message_layout_file_line_row_hint():
    assert str(InputError("bad value", file="a.jsonl", line=7, hint="fix it")) == "a.jsonl:7: bad value (fix it)"
    assert str(InputError("field 'answer' is missing", file="a.jsonl", row="dapo-3")) == (
        "a.jsonl:row 'dapo-3': field 'answer' is missing")
    assert str(InputError("--n must be >= 1")) == "--n must be >= 1"
    assert str(InputError("two\nlines", file="f")) == "f: two lines"  # always one line
    # the location parts a pure function lacked are filled in by its caller; the class is kept
    err = MissingInputError("no such file", hint="h").located(file="x", line=3)
    assert str(err) == "x:3: no such file (h)" and isinstance(err, FileNotFoundError)
    assert isinstance(OutputExistsError("exists", file="o"), FileExistsError)
    assert isinstance(InputError("x"), ValueError)


def test_split_debug_only_before_double_dash():
    assert cli.split_debug(["--debug", "a", "--", "--debug"]) == (["a", "--", "--debug"], True)
    assert cli.split_debug(["a", "--", "--debug"]) == (["a", "--", "--debug"], False)
    assert cli.split_debug(["x", "--debug"]) == (["x"], True)


def _failing_main(argv):
    raise InputError("what is wrong", file="data.jsonl", line=2, hint="how to fix")


def test_run_prints_one_line_and_returns_2(capsys, monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    assert cli.run(_failing_main, []) == 2
    err = capsys.readouterr().err
    assert err == "error: data.jsonl:2: what is wrong (how to fix)\n"


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_traceback(capsys, monkeypatch, how):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    argv = ["--debug"] if how == "flag" else []
    if how == "env":
        monkeypatch.setenv(cli.DEBUG_ENV, "1")
    assert cli.run(_failing_main, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "_failing_main" in err
    assert err.splitlines()[-1] == "error: data.jsonl:2: what is wrong (how to fix)"


def test_bugs_keep_their_traceback_and_argv_reaches_main():
    seen = []

    def main(argv):
        seen.append(argv)
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        cli.run(main, ["--debug", "x"])
    assert seen == [["x"]]
    assert cli.run(lambda argv: None, []) == 0 and cli.run(lambda argv: 3, []) == 3


def test_reraise_as_input_maps_only_the_named_types():
    with pytest.raises(InputError, match=r"^cfg.yaml: n must be >= 1 \(see --help\)$"):
        with cli.reraise_as_input(ValueError, file="cfg.yaml", hint="see --help"):
            raise ValueError("n must be >= 1")
    with pytest.raises(MissingInputError, match="^f: gone$"):
        with cli.reraise_as_input(FileNotFoundError, file="f"):
            raise FileNotFoundError("f: gone")  # the file is not repeated
    with pytest.raises(TypeError):
        with cli.reraise_as_input(ValueError):
            raise TypeError("a bug stays a bug")
    with pytest.raises(InputError, match="^data:row 'r': x$"):  # an InputError gains the file it lacked
        with cli.reraise_as_input(ValueError, file="data"):
            raise InputError("x", row="r")


def test_iter_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n')
    assert list(cli.iter_jsonl(path)) == [(1, {"a": 1}), (3, {"a": 2})]
    path.write_text('{"a": 1}\n{"a": 2,}\n')
    with pytest.raises(InputError, match=r"d.jsonl:2: not valid JSON: .*column 9"):
        list(cli.iter_jsonl(path))
    path.write_text('{"a": 1}\n7\n')
    with pytest.raises(InputError, match=r"d.jsonl:2: expected a JSON object, got int"):
        list(cli.iter_jsonl(path))
    with pytest.raises(MissingInputError, match=r"nope.jsonl: no such JSONL file"):
        list(cli.iter_jsonl(tmp_path / "nope.jsonl"))
    with pytest.raises(InputError, match="is a directory"):
        list(cli.iter_jsonl(tmp_path))
    path.write_bytes(b'{"a": 1}\n\xff\xfe\n')
    with pytest.raises(InputError, match=r"d.jsonl: not UTF-8 text"):
        list(cli.iter_jsonl(path))


def test_read_json_names_the_line(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text('{\n  "a": 1,\n  "b": \n}\n')
    with pytest.raises(InputError, match=r"spec.json:4: not valid JSON"):
        cli.read_json(path)
    path.write_text(json.dumps({"a": [1, 2]}))
    assert cli.read_json(path) == {"a": [1, 2]}


def test_refusals(tmp_path):
    out = tmp_path / "out.parquet"
    cli.refuse_overwrite([out], overwrite=False)  # nothing there yet
    out.write_text("x")
    with pytest.raises(OutputExistsError, match=r"out.parquet: exists \(pass --overwrite to replace it"):
        cli.refuse_overwrite([tmp_path / "other", out], overwrite=False)
    cli.refuse_overwrite([out], overwrite=True)
    cli.refuse_nonempty_dir(tmp_path / "missing", flag="--run-root")
    with pytest.raises(OutputExistsError, match=r"is not empty \(pass another --run-root\)"):
        cli.refuse_nonempty_dir(tmp_path, flag="--run-root")


def test_the_launch_log_survives_a_full_disk(capsys):
    log = cli.TolerantLog(Path("/dev/full"))  # every write: ENOSPC
    log.write("step:1\n")
    log.write("step:2\n")
    log.close()
    assert log.full and capsys.readouterr().out == (
        "[launch] /dev/full: no space left, the rest of the trainer's output is not written there\n")
