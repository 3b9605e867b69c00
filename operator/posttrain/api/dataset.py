"""SFT JSONL rules (synth's chat-format dataset rows): the one place they live. `posttrain validate` / `convert` / `train` check a dataset with
`validate_jsonl`, and the trainer (posttrain_trainer.sft_data.parse_jsonl, which ships with this package)
refuses a row with the same `check_row`, so a dataset that validates is one the trainer takes.

Each line is a JSON object with `messages`: a list of at least 2 messages (the SDK client's and the docs'
rule) with at least one `assistant` message (the loss is on assistant tokens only: without one a row teaches
nothing). Each message: `role` one of system, user, assistant, tool, developer, function (a chat template
renders another role, e.g. human/bot, as text the model never learns from: refused, with the role it
probably means); `content` a string, a list of OpenAI content parts, an object, or null/absent;
`tool_calls` a list whose items name a function (arguments a JSON string or an object);
`name`/`reasoning`/`raw_content` strings when present. Content parts are objects with a `type`: text parts
carry `text`, image parts (`image_url`, `image`, `input_image`) carry a URL: https://, data:image/...,
http:// (warned: the trainer and the actors must both reach it) or a path relative to the dataset's folder
(warned: only this machine has it). More images in a message than max_images_per_message are trimmed by the
trainer (warned). Optional row keys: `tools` (a list), `metadata` (an object). An empty file is an error."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.errors import Problem
from posttrain.inputs import MAX_DATA_BYTES, read_text_input

KNOWN_ROLES = ("system", "user", "assistant", "tool", "developer", "function")
ROLE_SUGGESTIONS = {"human": "user", "bot": "assistant", "gpt": "assistant", "model": "assistant",
                    "ai": "assistant", "chatbot": "assistant", "sys": "system"}  # fmt: skip
MIN_MESSAGES = 2
IMAGE_PART_TYPES = ("image_url", "image", "input_image")
TEXT_PART_TYPES = ("text", "input_text", "output_text")


@dataclass
class RowCheck:
    """What is wrong with one row: problems as (message, fix), warnings as text, and its image count."""

    problems: list[tuple[str, str | None]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    images: int = 0

    def add(self, message: str, fix: str | None = None) -> None:
        self.problems.append((message, fix))


@dataclass
class DatasetReport:
    examples: int = 0
    images: int = 0
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def image_url(part: dict[str, Any]) -> Any:
    """The URL, data: URI or path of an image part."""
    value = part.get("image_url") or part.get("image") or part.get("url") or part.get("path")
    return value.get("url") if isinstance(value, dict) else value


def _check_image(url: Any, where: str, check: RowCheck, base_dir: Path | None) -> None:
    if not isinstance(url, str) or not url.strip():
        check.add(
            f"{where} image part without a URL",
            'use {"type": "image_url", "image_url": {"url": "https://..."}}',
        )
    elif url.startswith("http://"):
        check.warnings.append(f"{where}: http:// image URL; the trainer and actors must reach it")
    elif url.startswith(("https://", "data:image/")):
        return
    elif "://" in url or url.startswith("data:"):
        check.add(f"{where} image URL must be https://, data:image/...;base64,... or a path beside the dataset",
                  "host the image over https or inline it as a data:image URL")  # fmt: skip
    elif base_dir is not None and not (base_dir / url).is_file():
        check.add(f"{where} image file {url!r} not found beside the dataset",
                  "put the image next to the JSONL or use a data:image URL")  # fmt: skip
    else:
        check.warnings.append(f"{where}: local image path {url!r}; only this machine has it (a cluster job "
                              "needs https:// or data:image URLs)")  # fmt: skip


def _check_message(
    msg: Any, where: str, check: RowCheck, max_images: int | None, base_dir: Path | None
) -> None:
    if not isinstance(msg, dict):
        check.add(f"{where} is not an object", 'write each message as {"role": ..., "content": ...}')
        return
    role = msg.get("role")
    if not isinstance(role, str) or not role.strip():
        check.add(f"{where}.role must be a non-empty string (a message without a role)",
                  'set "role": "user" (or system/assistant/tool)')  # fmt: skip
    elif role not in KNOWN_ROLES:
        meant = ROLE_SUGGESTIONS.get(role.lower())
        check.add(f"{where}.role {role!r} is not a chat role ({', '.join(KNOWN_ROLES)})",
                  f'use "role": "{meant}"' if meant else "use one of the chat roles")  # fmt: skip
    content = msg.get("content")
    images = 0
    if isinstance(content, list):
        for j, part in enumerate(content):
            pwhere = f"{where}.content[{j}]"
            if not isinstance(part, dict) or "type" not in part:
                check.add(f"{pwhere} must be an object with a type (an OpenAI content part)",
                          'use {"type": "text", "text": ...}')  # fmt: skip
                continue
            kind = part.get("type")
            if kind in IMAGE_PART_TYPES:
                images += 1
                _check_image(image_url(part), pwhere, check, base_dir)
            elif kind in TEXT_PART_TYPES and not isinstance(part.get("text"), str):
                check.add(f"{pwhere} text part has no text", 'use {"type": "text", "text": "..."}')
    elif content is not None and not isinstance(content, (str, dict)):
        check.add(f"{where}.content must be a string, a list of parts, an object or null", "use a string")
    check.images += images
    if max_images is not None and images > max_images:
        check.warnings.append(f"{where} has {images} images, more than max_images_per_message = {max_images}: "
                              f"the trainer keeps the first {max_images}")  # fmt: skip
    calls = msg.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            check.add(f"{where}.tool_calls must be a list", "use a list of {function: {name, arguments}}")
            calls = []
        for j, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            name = (
                fn.get("name")
                if isinstance(fn, dict)
                else (call.get("name") if isinstance(call, dict) else None)
            )
            if not isinstance(name, str) or not name:
                check.add(
                    f"{where}.tool_calls[{j}] names no function",
                    'use {"function": {"name": ..., "arguments": ...}}',
                )
                continue
            args = fn.get("arguments") if isinstance(fn, dict) else call.get("arguments")
            if isinstance(args, str):
                try:
                    json.loads(args)
                except json.JSONDecodeError:
                    check.add(
                        f"{where}.tool_calls[{j}].arguments is not valid JSON",
                        "pass a JSON string or an object",
                    )
            elif args is not None and not isinstance(args, dict):
                check.add(
                    f"{where}.tool_calls[{j}].arguments must be a JSON string or an object", "use an object"
                )
    for key in ("name", "reasoning", "raw_content"):
        if key in msg and msg[key] is not None and not isinstance(msg[key], str):
            check.add(f"{where}.{key} must be a string", f"make {key} a string")


def check_row(
    row: Any, *, max_images_per_message: int | None = None, base_dir: Path | None = None
) -> RowCheck:
    """Every rule above for one parsed JSONL row (pure apart from looking for local image files)."""
    check = RowCheck()
    if not isinstance(row, dict):
        check.add("a line must be a JSON object", 'write {"messages": [...]}')
        return check
    messages = row.get("messages")
    if not isinstance(messages, list):
        check.add("messages must be a list (each line needs a messages list)",
                  'write {"messages": [{"role": "user", ...}, {"role": "assistant", ...}]}')  # fmt: skip
        return check
    if len(messages) < MIN_MESSAGES:
        check.add(f"messages has {len(messages)} entries; at least {MIN_MESSAGES} turns are needed",
                  "add the user turn and the assistant answer")  # fmt: skip
    for i, msg in enumerate(messages):
        _check_message(msg, f"messages[{i}]", check, max_images_per_message, base_dir)
    roles = [m.get("role") for m in messages if isinstance(m, dict)]
    if len(messages) >= MIN_MESSAGES and "assistant" not in roles:
        check.add("no assistant message to learn from (the loss is on assistant turns only)",
                  'add the answer as {"role": "assistant", "content": ...}')  # fmt: skip
    if "tools" in row and not isinstance(row["tools"], list):
        check.add("tools must be a list", "use a list of {name, description, parameters}")
    if "metadata" in row and not isinstance(row["metadata"], dict):
        check.add("metadata must be an object", "use an object")
    return check


_FIELD = re.compile(r"^(messages\[\d+\](?:\.[a-z_]+(?:\[\d+\])?)*)[: ]\s*(.*)$", re.S)


def _problem(message: str, fix: str | None, file: str, line: int) -> Problem:
    """`file:line: messages[1].role: ...`: the row's field path as the problem's field."""
    match = _FIELD.match(message)
    if match is None:
        return Problem(message, file=file, line=line, fix=fix)
    return Problem(match.group(2), file=file, line=line, field=match.group(1), fix=fix)


def parse_line(text: str) -> tuple[Any, str | None]:
    """(row, None) or (None, the JSON error)."""
    try:
        return json.loads(text), None
    except json.JSONDecodeError as err:
        return None, f"not valid JSON ({err.msg})"


def read_lines(path: str | Path, what: str = "dataset", field: str | None = None) -> list[tuple[int, str]]:
    """The non-blank lines of a UTF-8 JSONL file with their numbers; a UserError (naming `field`, the flag or
    key that gave the path) for a missing, binary, non-UTF-8 or non-regular file."""
    text = read_text_input(path, what=what, field=field, max_bytes=MAX_DATA_BYTES)
    return [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]


def validate_jsonl(
    path: str | Path, *, max_images_per_message: int | None = None, require_images: bool = False,
    max_problems: int = 50,
) -> DatasetReport:  # fmt: skip
    """Check an SFT JSONL file; problems carry the file and the line number."""
    from posttrain.errors import UserError

    path = Path(path)
    report = DatasetReport()
    try:
        lines = read_lines(path)
    except UserError as err:
        report.problems.extend(err.problems)
        return report
    for number, line in lines:
        if len(report.problems) >= max_problems:
            break
        row, error = parse_line(line)
        if error:
            report.problems.append(
                Problem(error, file=str(path), line=number, fix="write one JSON object per line")
            )
            continue
        report.examples += 1
        check = check_row(row, max_images_per_message=max_images_per_message, base_dir=path.parent)
        if require_images and check.images == 0 and not check.problems:
            check.add(
                "no image in this example (vision dataset)", "add an image_url part or drop the example"
            )
        report.problems += [_problem(m, f, str(path), number) for m, f in check.problems]
        report.warnings += [f"{path}:{number}: {w}" for w in check.warnings]
        report.images += check.images
    if report.examples == 0 and not report.problems:
        report.problems.append(Problem("File contains no SFT examples", file=str(path), fix="add JSONL rows"))
    return report

