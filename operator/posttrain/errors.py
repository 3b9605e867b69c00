"""User-facing errors: one line per problem, never a traceback for a user's mistake."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a user's input, and what to do about it."""

    message: str
    file: str | None = None
    line: int | None = None
    field: str | None = None
    fix: str | None = None

    def __str__(self) -> str:
        where = self.file or ""
        if self.file and self.line:
            where = f"{self.file}:{self.line}"
        parts = [p for p in (where, self.field) if p]
        head = ": ".join(parts)
        text = f"{head}: {self.message}" if head else self.message
        return f"{text} (fix: {self.fix})" if self.fix else text


class UserError(Exception):
    """Bad input from a person. The CLI prints each problem on its own line and exits 2."""

    def __init__(self, problems: list[Problem] | Problem | str):
        if isinstance(problems, str):
            problems = [Problem(problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = problems
        super().__init__("\n".join(str(p) for p in problems))
