"""The README's commands work as written: every `make ...` and `posttrain ...` (or `.venv/bin/posttrain ...`)
command line README.md and examples/README.md show, in code blocks and in inline code, is checked.

- `make` lines run as `make -n` (a dry run: nothing is built) and must exit 0; a usage error such as
  "No rule to make target 'agent'" (`make demo DEMO_ARGS=--task agent` without quotes) fails. The options a
  line hands the demo through DEMO_ARGS are parsed by the demo's own parser too.
- `posttrain` lines are parsed by the CLI's own parser (posttrain.cli.build_parser: exactly what `posttrain`
  does with that argv before it runs anything; argparse's `--help` would stop before reporting unknown
  arguments): an unrecognized argument, an invalid choice or an option without its value fails, and so
  does a missing required argument on a code-block line (inline code may name a command without its
  arguments: `posttrain convert`). Placeholders (`<hash>`, `NS`, `...`) are plain values: a value check's
  refusal of a placeholder is no usage error; FLAGS (where a line leaves the flags to the reader) is dropped."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = (REPO / "README.md", REPO / "examples" / "README.md")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")
PLACEHOLDER = re.compile(r"<([A-Za-z0-9 _.-]+)>")
SEPARATORS = {"&&", "||", ";", "|", "&"}
REDIRECTS = {">", ">>", "<", "2>", "2>&1"}
POSTTRAIN = ("posttrain", ".venv/bin/posttrain")
LEFT_TO_THE_READER = {"FLAGS"}
# argparse's errors about a command line's shape (not about a value a placeholder stands in for)
SHAPE_ERRORS = ("unrecognized arguments", "invalid choice", "expected one argument", "expected at least one",
                "not allowed with argument", "ambiguous option")  # fmt: skip
REQUIRED = "arguments are required"
# a line of a code block that runs make or posttrain (a block may also hold a tree, TOML, YAML, ...)
COMMAND_LINE = re.compile(r"(?:^|&&|;|\|)\s*(?:make|posttrain|\.venv/bin/posttrain)(?:\s|$)")


def _words(line: str) -> list[list[str]]:
    """One shell line -> its simple commands (split at && ; | &), each cut at its first redirection, with
    `<placeholder>`s as plain words and comments dropped."""
    lexer = shlex.shlex(PLACEHOLDER.sub(lambda m: m.group(1).replace(" ", "-").upper(), line),
                        posix=True, punctuation_chars=True)  # fmt: skip
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: list[list[str]] = [[]]
    cut = False
    for token in lexer:
        if token in SEPARATORS:
            commands.append([])
            cut = False
        elif token in REDIRECTS or cut:
            cut = True
        elif token not in LEFT_TO_THE_READER:
            commands[-1].append(token)
    return [c for c in commands if c]


def commands_in(text: str, *, inline: bool | None = None) -> list[list[str]]:
    """Every make / posttrain command of a Markdown text: code-block lines (`\\` continuations joined) and
    inline code spans (a span may wrap across lines); inline=False / True: only those of blocks / spans."""
    found: list[list[str]] = []
    if inline is not True:
        for block in FENCE.findall(text):
            for line in block.replace("\\\n", " ").splitlines():
                if COMMAND_LINE.search(line):
                    found += _words(line)
    if inline is not False:
        for span in INLINE.findall(FENCE.sub("", text)):
            with contextlib.suppress(ValueError):  # a span that is not a shell line (unbalanced quotes)
                found += _words(" ".join(span.split()))
    return [c for c in found if c[0] == "make" or c[0] in POSTTRAIN]


def _collected() -> list[tuple[str, list[str], bool]]:
    out = []
    for doc in DOCS:
        for inline in (False, True):
            for command in commands_in(doc.read_text(), inline=inline):
                out.append((f"{doc.relative_to(REPO)}: {shlex.join(command)}", command, inline))
    return out


COMMANDS = _collected()


def test_the_extraction_finds_the_commands_the_readme_shows():
    text = "run `make demo DEMO_ARGS=\"--task agent\"` or\n```bash\nmake demo   # a comment\n" \
           ".venv/bin/posttrain plot demo-rl-<hash> -o curve.png  # x\nposttrain convert --config a.toml \\\n" \
           "  --namespace team-a > rljob.yaml\npip install posttrain\n```\nand `posttrain filter --input s3://B/\n" \
           "--min-reward 1`, `git clone x && make setup`"  # fmt: skip
    assert commands_in(text) == [
        ["make", "demo"],
        [".venv/bin/posttrain", "plot", "demo-rl-HASH", "-o", "curve.png"],
        ["posttrain", "convert", "--config", "a.toml", "--namespace", "team-a"],
        ["make", "demo", "DEMO_ARGS=--task agent"],
        ["posttrain", "filter", "--input", "s3://B/", "--min-reward", "1"],
        ["make", "setup"],
    ]
    # unquoted, make sees `agent` as a goal of its own: the check below must catch it
    assert commands_in("`make demo DEMO_ARGS=--task agent`") == [["make", "demo", "DEMO_ARGS=--task", "agent"]]
    assert any(c[0] == "make" for _, c, _ in COMMANDS) and any(c[0] in POSTTRAIN for _, c, _ in COMMANDS)


def make_problem(command: list[str]) -> str | None:
    """Why `make -n <args>` fails (its stderr), or None when the dry run succeeds."""
    done = subprocess.run(["make", "-n", *command[1:]], cwd=REPO, capture_output=True, text=True, timeout=120)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def test_an_unquoted_demo_option_is_a_make_usage_error():
    problem = make_problem(["make", "demo", "DEMO_ARGS=--task", "agent"])
    assert problem and "No rule to make target" in problem and "agent" in problem
    assert make_problem(["make", "demo", "DEMO_ARGS=--task agent"]) is None


def parse_problem(command: list[str], *, fragment: bool = False) -> str | None:
    """The CLI's usage error for a posttrain argv (what `posttrain` prints before exiting 2), or None.
    fragment: the command may lack required arguments (inline code naming a command)."""
    from posttrain.cli import build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(command[1:])
    except SystemExit as exit_:
        message = err.getvalue().strip()
        shape = [*SHAPE_ERRORS, *([] if fragment else [REQUIRED])]
        if exit_.code not in (0, None) and (any(s in message for s in shape) or not message):
            return message or f"exit {exit_.code}"
    return None


def test_an_unknown_posttrain_option_is_caught():
    assert "unrecognized arguments" in parse_problem(["posttrain", "status", "--no-such-flag"])
    assert "invalid choice" in parse_problem(["posttrain", "train", "--type", "ppo", "--config", "x.toml"])
    assert parse_problem(["posttrain", "status", "-A"]) is None
    assert "required" in parse_problem(["posttrain", "plot"])
    assert parse_problem(["posttrain", "plot"], fragment=True) is None
    assert parse_problem(["posttrain", "convert", "-n", "NS", "--config", "x.toml"]) is None  # a placeholder


@pytest.mark.parametrize("where,command,inline", COMMANDS, ids=[w for w, _, _ in COMMANDS])
def test_readme_command(where: str, command: list[str], inline: bool):
    if command[0] == "make":
        problem = make_problem(command)
        assert problem is None, f"{where}: `make -n` fails: {problem}"
        for word in command[1:]:
            if word.startswith("DEMO_ARGS="):
                from posttrain.local.demo import parse_args

                err = io.StringIO()
                try:
                    with contextlib.redirect_stderr(err):
                        parse_args(shlex.split(word.split("=", 1)[1]))
                except SystemExit as exit_:
                    pytest.fail(f"{where}: the demo refuses DEMO_ARGS (exit {exit_.code}): {err.getvalue()}")
    else:
        problem = parse_problem(command, fragment=inline)
        assert problem is None, f"{where}: usage error: {problem}"
