from posttrain.cli import main
from posttrain.errors import Problem, UserError


def test_problem_names_file_line_field_and_fix():
    text = str(Problem("both are set", file="job.toml", line=3, field="model.source", fix="keep one"))
    assert text == "job.toml:3: model.source: both are set (fix: keep one)"


def test_user_error_keeps_every_problem():
    err = UserError([Problem("a"), Problem("b")])
    assert [p.message for p in err.problems] == ["a", "b"]


def test_cli_without_command_is_a_usage_error(capsys):
    try:
        main([])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("argparse should exit 2 without a command")
