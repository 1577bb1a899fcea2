"""Which failing goals may be fixed in the same wave: those whose footprints cannot overlap.

The rules are in docs/evolve.md ("Independence"). The overlap test may say "overlap" when there is
none but never "disjoint": the regression gate after the wave is the safety net for what it cannot see.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from collections.abc import Iterable, Mapping

from .evolve_goals import Goal

_WILD = set("*?[{")
_SPLIT = re.compile(r"[;&|()<>=,`\"']+")
_EXT = re.compile(r"^[^/]*\.[A-Za-z0-9_]{1,8}$")
_IGNORED_PREFIXES = ("/dev/", "/proc/", "/sys/", "/tmp/", "/usr/", "/bin/", "/etc/")
# Tools whose verdict depends on the whole project: a fix for such a goal may touch any file, and any other goal's fix
# may break it. Only a goal's own ``writes`` narrows them.
_WHOLE_PROJECT: frozenset[str] = frozenset().union(
    ("pytest", "py.test", "tox", "nox", "unittest", "nose2", "coverage", "pre-commit"),
    ("ruff", "flake8", "pylint", "pyflakes", "pycodestyle", "black", "isort", "mypy", "pyright", "pytype", "bandit"),
    ("eslint", "tsc", "prettier", "jest", "vitest", "mocha", "npm", "yarn", "pnpm", "npx"),
    ("go", "golangci-lint", "staticcheck", "cargo", "clippy-driver"),
    ("make", "cmake", "ctest", "mvn", "gradle", "gradlew", "bazel", "dotnet"),
    ("rubocop", "rspec", "rake", "phpunit", "shellcheck"),
)
_SHELLS = ("sh", "bash", "zsh")
# Launchers that run the tool named after them (``python -m pytest``, ``uv run mypy``).
_LAUNCHERS = {
    **dict.fromkeys(("python", "python3"), ("-m",)),
    **dict.fromkeys(("uv", "poetry", "pipx", "pdm", "hatch"), ("run",)),
    **dict.fromkeys(("env", "timeout", "nice", "exec", "time", "uvx", "npx"), ()),
    **dict.fromkeys(_SHELLS, ("-c",)),
}
# Tools that read a fixed file without naming it on the command line.
_IMPLIED = {
    "make": "Makefile",
    **dict.fromkeys(("npm", "yarn", "pnpm"), "package.json"),
    "tox": "tox.ini",
    "just": "justfile",
    "cargo": "Cargo.toml",
}


def _segments(glob: str) -> list[str]:
    return [s for s in glob.strip().split("/") if s not in ("", ".")] or ["**"]


def _literal_ends(seg: str) -> tuple[str, str]:
    """The literal text before the first and after the last wildcard character."""
    first = next(i for i, c in enumerate(seg) if c in _WILD)
    last = max(i for i, c in enumerate(seg) if c in _WILD or c in "]}")
    return seg[:first], seg[last + 1 :]


def _segments_may_match(a: str, b: str) -> bool:
    wild_a, wild_b = bool(_WILD & set(a)), bool(_WILD & set(b))
    if not wild_a and not wild_b:
        return a == b
    if wild_a != wild_b:
        literal, pattern = (b, a) if wild_a else (a, b)
        if "{" not in pattern:  # fnmatch has no braces; then fall through to the coarse test
            return fnmatch.fnmatchcase(literal, pattern)
    pa, sa = _literal_ends(a) if wild_a else (a, a)
    pb, sb = _literal_ends(b) if wild_b else (b, b)
    # Any common string starts with both prefixes and ends with both suffixes.
    prefix_ok = pa.startswith(pb) or pb.startswith(pa)
    suffix_ok = sa.endswith(sb) or sb.endswith(sa)
    return prefix_ok and suffix_ok


def globs_may_overlap(a: str, b: str) -> bool:
    """False only when no path can match both globs (the rules: docs/evolve.md, "Independence")."""
    sa, sb = _segments(a), _segments(b)
    for x, y in zip(sa, sb, strict=False):  # a longer glob is a directory prefix case (see below)
        if "**" in x or "**" in y:
            return True
        if not _segments_may_match(x, y):
            return False
    return True  # equal, or one is a directory prefix of the other


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=True)
    except ValueError:  # unbalanced quotes: still split, roughly
        return command.split()


def path_tokens(command: str) -> list[str]:
    """Tokens of a shell command that look like files, scripts or directories."""
    tokens: list[str] = []
    first = True
    for word in _words(command):
        for part in _SPLIT.split(word):
            part = part.strip()
            if not part:
                continue
            if first and part in _IMPLIED:
                tokens.append(_IMPLIED[part])
            first = False
            if part.startswith("-") or part.startswith("$") or part.startswith(_IGNORED_PREFIXES):
                continue
            if part in (".", "./") or "/" in part or _EXT.match(part):
                tokens.append(part)
        if word in (";", "&&", "||", "|"):
            first = True
    return sorted(set(tokens))


def _commands(command: str) -> list[str]:
    """The program each simple command of a shell line runs, looking through launchers and assignments."""
    out: list[str] = []
    start = True
    launcher_args: tuple[str, ...] | None = None
    prev = ""
    for raw in _words(command):
        if raw in (";", "&&", "||", "|", "(", ")", "&"):
            start, launcher_args = True, None
            continue
        word, ends = (raw[:-1], True) if raw.endswith(";") else (raw, False)
        if (
            start
            and word
            and not ("=" in word and not word.startswith(("-", "=")) and word.split("=", 1)[0].isidentifier())
        ):
            # (a VAR=value before the command is skipped)
            if launcher_args is not None and out and out[-1] in _SHELLS and prev == "-c":
                out += _commands(word)  # sh -c "pytest -q": the script is a command line of its own
                start, launcher_args = False, None
            elif launcher_args is not None and (word.startswith("-") or word.isdigit() or word in launcher_args):
                pass
            else:
                name = word.rsplit("/", 1)[-1]
                out.append(name)
                if name in _LAUNCHERS:
                    launcher_args = _LAUNCHERS[name]
                else:
                    start, launcher_args = False, None
        if ends:
            start, launcher_args = True, None
        prev = word
    return out


def footprint(goal: Goal) -> tuple[str, ...]:
    if goal.writes:
        return tuple(goal.writes)
    if any(name in _WHOLE_PROJECT for name in _commands(goal.check)):
        return (".",)
    return tuple(path_tokens(goal.check))


def independent(a: Goal, b: Goal) -> bool:
    return not any(globs_may_overlap(x, y) for x in footprint(a) for y in footprint(b))


def select_goals(
    failing: Iterable[Goal],
    max_parallel: int,
    learned_conflicts: frozenset[frozenset[str]] = frozenset(),
    idle_counts: Mapping[str, int] | None = None,
) -> tuple[list[Goal], dict[str, str]]:
    """Up to ``max_parallel`` goals by weight (ties by id), each independent of those picked before it, and why each
    goal left out was. ``idle_counts`` (fixes that changed nothing) ranks first: such a goal lets the others go first.
    """
    idle_counts = idle_counts or {}
    picked: list[Goal] = []
    skipped: dict[str, str] = {}
    for goal in sorted(failing, key=lambda g: (idle_counts.get(g.id, 0), -g.weight, g.id)):
        if len(picked) >= max_parallel:
            skipped[goal.id] = "wave full"
            continue
        clash = next((p for p in picked if not independent(goal, p)), None)
        if clash is not None:
            skipped[goal.id] = f"overlaps {clash.id}"
            continue
        learned = next((p for p in picked if frozenset((goal.id, p.id)) in learned_conflicts), None)
        if learned is not None:
            skipped[goal.id] = f"interfered with {learned.id} in a reverted wave"
            continue
        picked.append(goal)
    return picked, skipped
