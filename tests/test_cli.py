"""The CLI prints flashtree's own user errors as one line (exit 2); any other exception is a bug
and keeps its traceback."""
import types

import pytest

from flashtree import cli
from flashtree.config import ConfigError
from flashtree.errors import UserError, is_user_error


@pytest.fixture()
def command(monkeypatch):
    """A fake `flashtree boom` whose run() raises what the test puts in `raised`."""
    raised = []

    def run(args):
        raise raised[0]

    mod = types.ModuleType("fake_boom")
    mod.add_arguments, mod.run = (lambda p: None), run
    monkeypatch.setitem(__import__("sys").modules, "fake_boom", mod)
    monkeypatch.setattr(cli, "COMMANDS", {"boom": ("fake_boom", "raises")})
    return raised


@pytest.mark.parametrize("err", [UserError("--steps must be >= 1"), ConfigError("x/config.json: file not found")])
def test_user_errors_print_one_line_and_exit_2(command, err, capsys):
    command.append(err)
    assert cli.main(["boom"]) == 2
    assert capsys.readouterr().err == f"flashtree boom: error: {err}\n"


@pytest.mark.parametrize("err", [TypeError("unsupported operand"), ValueError("too many values to unpack"),
                                 KeyError("k"), FileNotFoundError("/tmp/x")])
def test_internal_bugs_keep_their_traceback(command, err):
    command.append(err)
    with pytest.raises(type(err)):
        cli.main(["boom"])


def test_project_errors_are_user_errors_builtins_are_not():
    from flashtree.engine import engine
    assert is_user_error(UserError("x")) and is_user_error(ConfigError("x"))
    if hasattr(engine, "RequestError"):
        assert is_user_error(engine.RequestError("x"))
    assert not is_user_error(ValueError("x")) and not is_user_error(TypeError("x"))
    assert issubclass(UserError, ValueError)  # Python callers may keep catching ValueError


def test_bad_device_and_prompt_file_are_user_errors(capsys, tmp_path):
    assert cli.main(["generate", "x", "--device", "nonsense", "--method", "ar"]) == 2
    assert "--device nonsense" in capsys.readouterr().err
    assert cli.main(["generate", "x", "--dtype", "int3", "--method", "ar"]) == 2
    assert "int3" in capsys.readouterr().err
    assert cli.main(["bench", "--prompts", str(tmp_path / "none.jsonl"), "--methods", "ar", "--no-peers"]) == 2
    assert "prompt file not found" in capsys.readouterr().err
