"""The commands the documents show a user, read from the documents themselves, and a runner that types them the
way a user would: a fresh login shell (`env -i`, `bash -l`: the system's PATH, no activated .venv, no PYTHON or
PYTHONPATH), from the folder the text implies.

Where the commands are read (DOCUMENTS, SCRIPT_HEADERS): the shell blocks of the Markdown documents, and the comment
block at the head of each launcher, Slurm script and data script. A command is a line of such a block (continued by
a trailing backslash), without its trailing comment. tests/README.md's table "Every documented command" lists each
of them with the test that runs it and how; tests/test_documented_commands.py fails when the documents and that
table disagree, so a command cannot change without its row, and each test runs the rows that name it.

A test may change only what a user would: the values of the variables and the path arguments the command shows
(`replace`, for small real data in a temporary folder), and variables that the document of the script it runs
documents (`env`); every replaced word must be in the command and every added variable in its script's header.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARKDOWN = ("README.md", "data/README.md")
SHELL_FENCES = ("bash", "sh", "shell", "console")
TABLE = REPO / "tests" / "README.md"
TABLE_HEADING = "## Every documented command"
HOWS = ("verbatim", "dry run", "help", "CI", "not here")


def script_headers() -> list[str]:
    """The scripts whose head comment shows commands: the launchers and their presets, the Docker helpers, the Slurm
    scripts, the data pipeline and Triton's server scripts."""
    found = [
        *REPO.glob("scripts/*.sh"),
        *REPO.glob("scripts/configs/*.sh"),
        *REPO.glob("scripts/docker/*.sh"),
        REPO / "run.sub",
        REPO / "data/prep.sub",
        REPO / "data/create_datasets_from_start.sh",
        *REPO.glob("triton/scripts/*.sh"),
    ]
    return sorted(str(p.relative_to(REPO)) for p in found)


@dataclass(frozen=True)
class Command:
    source: str
    line: int
    text: str  # one line: continuation lines joined by a space, the trailing comment removed
    block: int = 0  # the shell block of a Markdown document (a script's header is one block)

    @property
    def words(self) -> list[str]:
        return shlex.split(self.text)


def strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a # that starts a word outside quotes, as bash reads it)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _join(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """(line number, text) of each logical line: a trailing backslash continues it on the next line."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, text in lines:
        if pending is not None:
            number, text = pending[0], pending[1] + " " + text.strip()
            pending = None
        if text.rstrip().endswith("\\"):
            pending = (number, text.rstrip()[:-1].rstrip())
            continue
        out.append((number, text))
    if pending is not None:
        out.append(pending)
    return out


def markdown_commands(rel: str) -> list[Command]:
    """Every line of the shell blocks (```bash) of a Markdown document that is not a comment."""
    out: list[Command] = []
    block: list[tuple[int, str]] = []
    fence, blocks = None, 0  # the info string of the open block (None outside blocks), blocks seen
    for number, line in enumerate((REPO / rel).read_text(encoding="utf-8").splitlines(), 1):
        if not line.startswith("```"):
            if fence in SHELL_FENCES:
                block.append((number, line))
        elif fence is None:
            fence, block, blocks = line[3:].strip(), [], blocks + 1
        else:
            out += [
                Command(rel, n, strip_comment(t).strip(), blocks) for n, t in _join(block) if strip_comment(t).strip()
            ]
            fence = None
    return out


# A head-comment line shows a command when, after the '#' and an indent of two spaces or more, it starts with one of
# these (optionally after VAR=value words): the ways into this checkout's scripts, Slurm and the shell words the
# documents use. A synopsis starts with "usage:" and is not a command.
_COMMAND_START = re.compile(
    r"(bash|sbatch|source|export|unset|srun|cd|dask|python3?|\.venv/bin/\S+|jid=\$\(\S*"
    r"|data/\S+\.sh|triton/scripts/\S+|scripts/\S+)(\s|$)"
)
_ASSIGNMENT = re.compile(r"[A-Z_][A-Z0-9_]*=\S*\s+")


def header_lines(rel: str) -> list[tuple[int, str]]:
    """(line number, text after '#') of the comment block at the head of a script (after the shebang and #SBATCH)."""
    out = []
    for number, line in enumerate((REPO / rel).read_text(encoding="utf-8").splitlines(), 1):
        if number == 1 and line.startswith("#!"):
            continue
        if not line.startswith("#"):
            break
        if not line.startswith("#SBATCH"):
            out.append((number, line[1:]))
    return out


def header_commands(rel: str) -> list[Command]:
    """The lines of a script's head comment that show a command (see _COMMAND_START), continuations joined."""
    lines = header_lines(rel)
    starts = []
    for i, (number, text) in enumerate(lines):
        body = text.strip()
        rest = body
        while _ASSIGNMENT.match(rest):
            rest = rest[_ASSIGNMENT.match(rest).end() :]
        continued = i > 0 and lines[i - 1][1].rstrip().endswith("\\")
        if continued or (text.startswith("  ") and _COMMAND_START.match(rest)):  # examples are indented, prose not
            starts.append((number, body))
    out = []
    for number, text in _join(starts):
        text = strip_comment(text).strip()
        if text:
            out.append(Command(rel, number, text))
    return out


def documented_commands() -> list[Command]:
    """Every command the documents show, in document order, each time it is shown (a block that repeats a command
    runs it again: README.md's run.sub block submits phase 1 and 2 with a container, then without)."""
    return [c for rel in MARKDOWN for c in markdown_commands(rel)] + [
        c for rel in script_headers() for c in header_commands(rel)
    ]


# ---------------------------------------------------------------------------------------------------------------
# The table in tests/README.md


@dataclass(frozen=True)
class Row:
    command: str
    source: str
    how: str  # one of HOWS, "not here" followed by its reason
    test: str  # tests/<file>.py::<test>, or "" for "not here"


def _cells(line: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [c.strip().replace("\\|", "|") for c in cells]


def table_rows() -> list[Row]:
    """The rows of tests/README.md's table of documented commands (commands in backticks)."""
    text = TABLE.read_text(encoding="utf-8")
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        command, source, how, test = _cells(line)
        rows.append(Row(command.strip("`"), source.strip("`"), how, test.strip("`")))
    return rows


def tests_of(row: Row) -> list[str]:
    """The test functions (or fixtures) a row names: `tests/<file>.py::<name>`, several separated by commas."""
    return [t.strip().strip("`").split("::")[-1] for t in row.test.split(",") if "::" in t]


def commands_for(test: str) -> list[Command]:
    """The documented commands whose table row names `test` (a test function or fixture), each time the documents
    show it, in document order; at least one, each row still in its document."""
    named = {(r.source, r.command) for r in table_rows() if test in tests_of(r)}
    found = [c for c in documented_commands() if (c.source, c.text) in named]
    assert named and {(c.source, c.text) for c in found} == named, (
        f"tests/README.md names {test} for commands the documents no longer show"
    )
    return found


def blocks_for(test: str) -> list[list[Command]]:
    """commands_for(test) grouped by the block that shows them: each group runs in one shell (a block's exports,
    `cd` and `jid=$(...)` reach its later lines)."""
    groups: dict[tuple[str, int], list[Command]] = {}
    for c in commands_for(test):
        groups.setdefault((c.source, c.block), []).append(c)
    return list(groups.values())


def _leads_on(command: Command) -> bool:
    """A command whose effect is on the shell the next one runs in: cd, export, unset, source alone, a job left in
    the background, a job id kept."""
    text = command.text
    return bool(
        re.match(r"(cd|export|unset|source) ", text)
        and "&& bash" not in text
        or text.endswith("&")
        or text.startswith("jid=")
    )


def sessions_for(test: str) -> list[list[Command]]:
    """commands_for(test) in sessions: a command that leads on (cd, export, `... &`) runs in one shell with the
    commands after it in its block, up to the first that does not; a text already seen runs once."""
    sessions, seen = [], set()
    for block in blocks_for(test):
        current: list[Command] = []
        for command in block:
            current.append(command)
            if not _leads_on(command):
                key = tuple(c.text for c in current)
                if key not in seen:
                    seen.add(key)
                    sessions.append(current)
                current = []
        assert not current, f"{current[-1].source}:{current[-1].line}: a session that never runs a command"
    return sessions


def only_command_for(test: str) -> Command:
    (command,) = distinct(commands_for(test))
    return command


def distinct(commands: list[Command]) -> list[Command]:
    """One of each command text (shown in two documents, a command runs once)."""
    seen: dict[str, Command] = {}
    for c in commands:
        seen.setdefault(c.text, c)
    return list(seen.values())


# ---------------------------------------------------------------------------------------------------------------
# Running a command as a user types it


def login_env(**extra: str) -> dict[str, str]:
    """The environment of a fresh login shell on this machine: `env -i` keeps HOME and the locale; bash -l sets PATH
    from the system's profile. Nothing of this test process (PYTHONPATH, VIRTUAL_ENV, PYTHON, the .venv) leaks in."""
    env = {"HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8", "TERM": "dumb"}
    env.update(extra)
    return env


def word(old: str) -> str:
    """A regular expression for `old` as a whole shell word, or the value of a VAR=value or --flag=value word."""
    return rf"(?:(?<=[\s=])|^){re.escape(old)}(?=[\s;)]|$)"


def _replace_present(command: Command, replace: dict[str, str]) -> str:
    text = command.text
    for old, new in replace.items():
        text = re.sub(word(old), lambda _, new=new: new, text)  # the replacement as it is, no escapes read
    return text


def scripts_named(commands: list[Command]) -> list[str]:
    """The scripts with a head comment that the commands run or source (scripts/*.sh, data/*.sh, the .sub files)."""
    headers = set(script_headers())
    return sorted({w for c in commands for w in re.findall(r"[\w./-]+\.(?:sh|sub)\b", c.text) if w in headers})


def documented_variables(*scripts: str) -> str:
    return "\n".join(text for rel in scripts for _, text in header_lines(rel))


def run(
    commands: Command | str | list[Command],
    *,
    cwd: Path = REPO,
    replace: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    documented_in: tuple[str, ...] = (),
    machine: dict[str, str] | None = None,
    timeout: float = 600,
    check: bool = True,
    background: bool = False,
    path_prefix: Path | None = None,
) -> subprocess.CompletedProcess:
    """Run documented commands (a list: one shell, in order) in a fresh login shell from `cwd`.

    replace: doc word -> test word (see substitute; a key may be missing from some commands of a list, not from all).
    env: variables set before them, each named in the head comment of one of `documented_in` (default: the scripts
    the commands run or source).
    machine: what the test machine needs and a user's machine keeps in its system folders (SLURM_CONF: where Slurm's
    configuration is; SBATCH_OUTPUT: where a job's output goes, as a site default), never a setting of the project.
    background: the commands start processes that outlive them (`dask worker ... &`): the shell's whole process
    group is killed when the commands end.
    path_prefix: a folder put first on the login shell's PATH (a stand-in for a program this machine lacks)."""
    if isinstance(commands, str):  # a command that a documented one printed (what a container would run)
        commands = Command("(printed)", 0, commands)
    commands = [commands] if isinstance(commands, Command) else commands
    replace, env = replace or {}, env or {}
    texts = [_replace_present(c, replace) for c in commands]
    missing = [old for old in replace if not any(re.search(word(old), c.text) for c in commands)]
    assert not missing, f"{missing} are not words of {[c.text for c in commands]}"
    documented_in = documented_in or tuple(scripts_named(commands))
    header = documented_variables(*documented_in)
    undocumented = [name for name in env if not re.search(rf"\b{name}\b", header)]
    assert not undocumented, f"{undocumented} are not documented in {documented_in}"
    script = "\n".join(["set -e", *texts]) if len(texts) > 1 else texts[0]
    if path_prefix is not None:  # after bash -l, whose profile sets PATH
        script = f"export PATH={shlex.quote(str(path_prefix))}:$PATH\n{script}"
    # Output to files, not pipes: a process left in the background would hold a pipe open after the shell ended.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            ["bash", "-lc", script],
            cwd=cwd,
            env=login_env(**env, **(machine or {})),
            stdout=out,
            stderr=err,
            text=True,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout)
        finally:
            if background or proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
        stdout, stderr = (f.seek(0) or f.read() for f in (out, err))
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    if check:  # a preset or tool the shell does not know is a failure even where the command goes on without it
        assert "command not found" not in stderr, f"`{script}`:\n{stderr[-3000:]}"
        assert done.returncode == 0, f"`{script}` exited {done.returncode}:\n{stdout[-3000:]}\n{stderr[-3000:]}"
    return done


def submit(
    commands: list[Command],
    *,
    slurm_conf: Path,
    output: Path,
    replace: dict[str, str],
    env: dict[str, str],
    documented_in: tuple[str, ...] = (),
) -> str:
    """Run documented sbatch commands against the test machine's Slurm; the job id the last one printed. `replace`
    keys that none of the commands holds are left out (one map serves several documents' forms)."""
    replace = {k: v for k, v in replace.items() if any(re.search(word(k), c.text) for c in commands)}
    done = run(
        commands,
        replace=replace,
        env=env,
        documented_in=documented_in,
        machine={"SLURM_CONF": str(slurm_conf), "SBATCH_OUTPUT": str(output)},
    )
    return re.findall(r"Submitted batch job (\d+)", done.stdout)[-1]


# ---------------------------------------------------------------------------------------------------------------
# Small real data for the pipeline's commands

# The pipeline's size variables (documented in data/create_datasets_from_start.sh) for a corpus of a few articles.
SMALL_PIPELINE = {"N_TRAINING_SHARDS": "2", "N_TEST_SHARDS": "1", "FRACTION_TEST_SET": "0.2", "DUPE_FACTOR": "1"}


def tiny_wikiextractor(folder: Path, shared_data: Path, articles: int = 6) -> Path:
    """A WikiExtractor folder of one file: the first `articles` real articles of the Wikipedia slice."""
    import gzip

    with gzip.open(shared_data / "wikipedia-en-slice" / "text" / "AA" / "wiki_00.gz", "rt", encoding="utf-8") as f:
        kept = f.read().split("</doc>\n")[:articles]
    with gzip.open(folder / "wiki_00.gz", "wt", encoding="utf-8") as f:
        f.write("</doc>\n".join(kept) + "</doc>\n")
    return folder
