"""SFT JSONL rules (docs/synth-compat.md 2.4), reported per line.

Each line is a JSON object with `messages`: a list of at least 2 messages (the SDK client's and the docs'
rule). Each message: `role` a non-empty string (system, user, assistant, tool, developer; other roles are
allowed by synth but warned about here), `content` a string, a list of OpenAI content parts, an object, or
null/absent; `tool_calls` a list whose items name a function (arguments a JSON string or an object);
`name`/`reasoning`/`raw_content` strings when present. Content parts: text parts carry `text`, image parts
(`{"type": "image_url", "image_url": {"url": ...}}` or `{"type": "image", "image": ...}`) carry an https:// or
data:image/ URL (http:// is warned about: the trainer and the actors must both reach it). With a
max_images_per_message, a message with more images is reported. An empty file is an error."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.errors import Problem, UserError

KNOWN_ROLES = {"system", "user", "assistant", "tool", "developer", "function"}
MIN_MESSAGES = 2


@dataclass
class DatasetReport:
    examples: int = 0
    images: int = 0
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _image_url(part: dict[str, Any]) -> Any:
    if part.get("type") == "image_url":
        value = part.get("image_url")
        return value.get("url") if isinstance(value, dict) else value
    value = part.get("image")
    return value.get("url") if isinstance(value, dict) else value


def _check_message(msg: Any, where: str, max_images: int | None, report: DatasetReport, add) -> None:
    if not isinstance(msg, dict):
        add(f"{where} is not an object", 'write each message as {"role": ..., "content": ...}')
        return
    role = msg.get("role")
    if not isinstance(role, str) or not role.strip():
        add(f"{where}.role must be a non-empty string", 'set "role": "user" (or system/assistant/tool)')
    elif role not in KNOWN_ROLES:
        report.warnings.append(f"{where}.role {role!r} is not a standard chat role")
    content = msg.get("content")
    images = 0
    if isinstance(content, list):
        for j, part in enumerate(content):
            pwhere = f"{where}.content[{j}]"
            if isinstance(part, str):
                continue
            if not isinstance(part, dict):
                add(
                    f"{pwhere} must be an object (an OpenAI content part)",
                    'use {"type": "text", "text": ...}',
                )
                continue
            kind = part.get("type")
            if kind in ("image_url", "image"):
                images += 1
                url = _image_url(part)
                if not isinstance(url, str) or not url.strip():
                    add(
                        f"{pwhere} image has no URL",
                        'use {"type": "image_url", "image_url": {"url": "https://..."}}',
                    )
                elif url.startswith("http://"):
                    report.warnings.append(
                        f"{pwhere}: http:// image URL; the trainer and actors must reach it"
                    )
                elif not (url.startswith("https://") or url.startswith("data:image/")):
                    add(f"{pwhere} image URL must be https:// or data:image/...;base64,...",
                        "host the image over https or inline it as a data:image URL")  # fmt: skip
            elif kind == "text":
                if not isinstance(part.get("text"), str):
                    add(f"{pwhere} text part has no text", 'use {"type": "text", "text": "..."}')
            elif kind is None:
                add(f"{pwhere} has no type", 'set "type": "text" or "image_url"')
    elif content is not None and not isinstance(content, (str, dict)):
        add(f"{where}.content must be a string, a list of parts, an object or null", "use a string")
    report.images += images
    if max_images is not None and images > max_images:
        add(f"{where} has {images} images, more than max_images_per_message = {max_images}",
            "split the message or raise model.max_images_per_message")  # fmt: skip
    calls = msg.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            add(f"{where}.tool_calls must be a list", "use a list of {function: {name, arguments}}")
        else:
            for j, call in enumerate(calls):
                fn = call.get("function") if isinstance(call, dict) else None
                name = (
                    fn.get("name")
                    if isinstance(fn, dict)
                    else (call.get("name") if isinstance(call, dict) else None)
                )
                if not isinstance(name, str) or not name:
                    add(
                        f"{where}.tool_calls[{j}] names no function",
                        'use {"function": {"name": ..., "arguments": ...}}',
                    )
                    continue
                args = fn.get("arguments") if isinstance(fn, dict) else call.get("arguments")
                if isinstance(args, str):
                    try:
                        json.loads(args)
                    except json.JSONDecodeError:
                        add(
                            f"{where}.tool_calls[{j}].arguments is not valid JSON",
                            "pass a JSON string or an object",
                        )
                elif args is not None and not isinstance(args, dict):
                    add(
                        f"{where}.tool_calls[{j}].arguments must be a JSON string or an object",
                        "use an object",
                    )
    for key in ("name", "reasoning", "raw_content"):
        if key in msg and msg[key] is not None and not isinstance(msg[key], str):
            add(f"{where}.{key} must be a string", f"make {key} a string")


def validate_jsonl(
    path: str | Path, *, max_images_per_message: int | None = None, require_images: bool = False,
    max_problems: int = 50,
) -> DatasetReport:  # fmt: skip
    """Check an SFT JSONL file; problems carry the file and the line number."""
    path = Path(path)
    report = DatasetReport()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        report.problems.append(Problem("dataset not found", file=str(path), fix="check the --dataset path"))
        return report
    except (OSError, UnicodeDecodeError) as err:
        report.problems.append(Problem(f"cannot read dataset: {err}", file=str(path)))
        return report
    for number, line in enumerate(lines, start=1):
        if len(report.problems) >= max_problems:
            break
        if not line.strip():
            continue

        def add(message: str, fix: str | None = None, _n: int = number) -> None:
            report.problems.append(Problem(message, file=str(path), line=_n, fix=fix))

        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            add(f"not valid JSON: {err.msg}", "write one JSON object per line")
            continue
        if not isinstance(row, dict):
            add("a line must be a JSON object", 'write {"messages": [...]}')
            continue
        report.examples += 1
        messages = row.get("messages")
        if not isinstance(messages, list):
            add(
                "messages must be a list",
                'write {"messages": [{"role": "user", ...}, {"role": "assistant", ...}]}',
            )
            continue
        if len(messages) < MIN_MESSAGES:
            add(f"messages has {len(messages)} entries; at least {MIN_MESSAGES} turns are needed",
                "add the user turn and the assistant answer")  # fmt: skip
        before = report.images
        for i, msg in enumerate(messages):
            _check_message(msg, f"messages[{i}]", max_images_per_message, report, add)
        if require_images and report.images == before:
            add("no image in this example (vision dataset)", "add an image_url part or drop the example")
        if "tools" in row and not isinstance(row["tools"], list):
            add("tools must be a list", "use a list of {name, description, parameters}")
        if "metadata" in row and not isinstance(row["metadata"], dict):
            add("metadata must be an object", "use an object")
    if report.examples == 0 and not report.problems:
        report.problems.append(Problem("File contains no SFT examples", file=str(path), fix="add JSONL rows"))
    return report


def require_valid_jsonl(path: str | Path, *, max_images_per_message: int | None = None) -> DatasetReport:
    """validate_jsonl for the commands that go on to train: UserError (every problem with its file:line)
    unless the file is a valid SFT dataset."""
    report = validate_jsonl(path, max_images_per_message=max_images_per_message)
    if report.problems:
        raise UserError(report.problems)
    return report
