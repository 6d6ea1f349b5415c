"""The dataclass-to-argparse converter (flags.py) against expectations written out here: every kind of field
parses from a command line to the value it should, bad values are argparse's one line with exit status 2, --help
shows each field's docstring by section, the cross-flag rules are one-line InputErrors, and configurations are
frozen."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import pytest

import run_glue
import run_squad
import run_swag
from bert_recipe.io import cli, flags
from bert_recipe.io.flags import flag


@dataclass(frozen=True)
class Sizes:
    """A section of every kind of field."""

    count: int = 3
    """how many of them"""
    rate: float = 0.5
    """a fraction, 50% by default"""
    name: str | None = None
    """an optional name"""
    mode: Literal["fast", "slow"] = "fast"
    """how it goes"""
    verbose: bool = False
    """say more"""


@dataclass(frozen=True)
class Paths:
    """A section of flags that need more than their names."""

    out: str | None = flag(None, required=True)
    """where it goes"""
    log_file: str = flag("log.json", "--log_file", name="--log-file")
    """the log"""
    limit: int = flag(7, "--cap")
    """the most there may be"""


@dataclass(frozen=True)
class MoreSizes(Sizes):
    """A section that changes a default and a help text of the one it derives from."""

    count: int = 9
    mode: Literal["fast", "slow"] = "slow"
    """how it goes here"""


@dataclass(frozen=True)
class Example(flags.Config):
    sizes: MoreSizes = field(default_factory=MoreSizes)
    """sizes and modes"""
    paths: Paths = field(default_factory=Paths)
    """paths"""

    def rules(self) -> list[tuple[bool, str]]:
        return [
            (self.sizes.count < 1, f"--count {self.sizes.count} must be at least 1"),
            (self.sizes.rate > self.sizes.count, "--rate must not exceed --count"),
        ]


def parse(*argv: str) -> Example:
    return flags.parse(Example, "example.py", "An example.\n\nMore.", list(argv))


def test_every_kind_of_field_parses_to_its_value():
    cfg = parse(
        "--out",
        "o",
        "--count",
        "4",
        "--rate",
        "0.25",
        "--name",
        "n",
        "--mode",
        "fast",
        "--verbose",
        "--log_file",
        "l.json",
        "--cap",
        "2",
    )
    assert cfg.sizes == MoreSizes(count=4, rate=0.25, name="n", mode="fast", verbose=True)
    assert cfg.paths == Paths(out="o", log_file="l.json", limit=2)
    assert parse("--out", "o", "--log-file", "x", "--limit", "5").paths == Paths(out="o", log_file="x", limit=5)
    defaults = parse("--out", "o")
    assert defaults.sizes == MoreSizes() and (defaults.sizes.count, defaults.sizes.mode) == (9, "slow")
    assert defaults.sizes.name is None and defaults.sizes.verbose is False
    assert defaults.flags() == {
        "count": 9,
        "rate": 0.5,
        "name": None,
        "mode": "slow",
        "verbose": False,
        "out": "o",
        "log_file": "log.json",
        "limit": 7,
    }
    assert Example.from_flags(defaults.flags()) == defaults


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--out", "o", "--count", "x"], ("--count", "invalid int value: 'x'")),
        (["--out", "o", "--rate", "half"], ("--rate", "invalid float value")),
        (["--out", "o", "--mode", "quick"], ("--mode", "invalid choice: 'quick'")),
        (["--out", "o", "--verbose", "yes"], ("unrecognized arguments: yes",)),
        ([], ("required", "--out")),
        (["--out", "o", "--unknown"], ("unrecognized arguments: --unknown",)),
    ],
)
def test_bad_values_are_one_line_with_exit_status_2(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        parse(*argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("example.py: error: ") and err.rstrip().endswith("(see --help)"), err
    for word in words:
        assert word in err, err


def test_rules_refuse_with_the_first_message():
    with pytest.raises(cli.InputError, match=r"^--count 0 must be at least 1$"):
        parse("--out", "o", "--count", "0")
    with pytest.raises(cli.InputError, match="--rate must not exceed --count"):
        parse("--out", "o", "--count", "1", "--rate", "2")


def test_help_lists_each_docstring_by_section(capsys):
    with pytest.raises(SystemExit) as e:
        parse("--help")
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split("options:")[1].split())  # the groups, after the usage line
    assert text.index("sizes and modes:") < text.index("--count") < text.index("paths:") < text.index("--out")
    for doc in (
        "how many of them (default: 9)",
        "a fraction, 50% by default (default: 0.5)",
        "an optional name (default: None)",
        "{fast,slow} how it goes here (default: slow)",
        "say more (default: False)",
        "where it goes (default: None)",
        "--log-file LOG_FILE, --log_file LOG_FILE the log (default: log.json)",
        "--limit LIMIT, --cap LIMIT the most there may be (default: 7)",
        "--debug",
    ):
        assert doc in text, doc
    assert text.index("--debug") > text.index("--out")  # in the last section's group


def test_field_docs_follow_the_classes_they_derive_from():
    assert flags.field_docs(MoreSizes) == {
        "count": "how many of them",
        "rate": "a fraction, 50% by default",
        "name": "an optional name",
        "mode": "how it goes here",
        "verbose": "say more",
    }


def test_configurations_are_frozen():
    cfg = parse("--out", "o")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.sizes.count = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.sizes = MoreSizes()


def test_fine_tuning_configurations_are_frozen_and_typed(tmp_path):
    """Each fine-tuning script parses a typical command line into its frozen configuration: the shared sections
    with the script's own defaults (GLUE's seed, SQuAD's windows and log_freq, SWAG's batch and learning rate),
    the script's own flags in their sections, --do_eval implying --do_predict for SQuAD."""
    squad_file = tmp_path / "dev.json"
    squad_file.write_text("{}")
    squad = run_squad.parse_args(
        [
            "--init_checkpoint",
            "ckpt.pt",
            "--output_dir",
            "out",
            "--do_eval",
            "--predict_file",
            str(squad_file),
            "--bf16",
            "--doc_stride",
            "64",
        ]
    )
    assert (squad.model.init_checkpoint, squad.model.max_seq_length, squad.data.predict_file) == (
        "ckpt.pt",
        384,
        str(squad_file),
    )
    assert (squad.run.do_eval, squad.run.do_predict, squad.run.do_train) == (True, True, False)
    assert (squad.training.predict_batch_size, squad.training.seed, squad.training.precision) == (64, 42, "bf16")
    assert (squad.runtime.log_freq, squad.windows.doc_stride, squad.windows.max_query_length) == (50, 64, 64)
    glue = run_glue.parse_args(
        [
            "--task_name",
            "mrpc",
            "--data_dir",
            "glue/MRPC",
            "--init_checkpoint",
            "ckpt.pt",
            "--output_dir",
            "out",
            "--do_train",
            "--max_steps",
            "5",
            "--local-rank",
            "0",
            "--json-summary",
            "log.json",
            "--disable-progress-bar",
        ]
    )
    assert (glue.data.task_name, glue.data.data_dir, glue.data.predict_split) == ("mrpc", "glue/MRPC", "dev")
    assert (glue.training.seed, glue.training.max_steps, glue.training.eval_batch_size) == (2, 5.0, 128)
    assert (glue.runtime.local_rank, glue.runtime.json_summary, glue.runtime.disable_progress_bar) == (
        0,
        "log.json",
        True,
    )
    assert glue.model.max_seq_length == 128 and glue.training.precision == "auto"
    swag = run_swag.parse_args(
        [
            "--data_dir",
            "swag",
            "--init_checkpoint",
            "ckpt.pt",
            "--output_dir",
            "out",
            "--do_predict",
            "--predict_split",
            "test",
            "--max_eval_examples",
            "8",
        ]
    )
    assert (swag.training.train_batch_size, swag.training.learning_rate, swag.training.eval_batch_size) == (
        16,
        2e-5,
        64,
    )
    assert (swag.data.predict_split, swag.data.max_eval_examples, swag.runtime.log_freq) == ("test", 8, 10)
    assert swag.flags()["train_batch_size"] == 16 and "debug" not in swag.flags()
    for cfg in (squad, glue, swag):
        with pytest.raises(dataclasses.FrozenInstanceError):
            cfg.training.seed = 3
        with pytest.raises(dataclasses.FrozenInstanceError):
            cfg.run = cfg.run
    with pytest.raises(cli.InputError, match="^nothing to do: pass at least one of --do_train, --do_eval, "):
        run_glue.parse_args(["--task_name", "mrpc", "--data_dir", "d", "--init_checkpoint", "c", "--output_dir", "o"])


# --------------------------------------------------------------------------------------------------------------
# What the other commands need: positionals, lists, switches, exclusive groups, defaults made when the parser is
# built, sections under argparse's own heading, omitted fields, help prefixes, sub-commands


@dataclass(frozen=True)
class Job:
    """A section of the rarer kinds of field."""

    source: str = flag(positional=True)
    """what to read"""
    files: list[str] = flag(required=True)
    """one or more files"""
    sizes: list[int] | None = flag(None, nargs="*")
    """zero or more sizes"""
    extra: list[str] = flag(None, action="append", metavar="X")
    """repeatable"""
    level: int = flag(3, choices=range(1, 10), metavar="{1..9}")
    """a level"""
    phase: Literal[1, 2] = 1
    """an integer choice"""
    lower: bool = flag(
        True, action=argparse.BooleanOptionalAction, switches=[flags.Switch(("--cased",), False, "keep case")]
    )
    """lower-case"""
    workers: int = flag(factory=lambda: WORKERS["now"])
    """made when the parser is built"""
    to_file: str | None = flag(None, exclusive="output")
    """one file"""
    to_dir: str | None = flag(None, exclusive="output")
    """one folder"""


WORKERS = {"now": 4}


@dataclass(frozen=True)
class Limits:
    """A section with a help prefix and a field left out of the command line."""

    width: int = 10
    """the width"""
    height: int = 20
    """the height"""

    omitted: ClassVar[tuple[str, ...]] = ("height",)
    help_prefix: ClassVar[str] = "box: "


@dataclass(frozen=True)
class Rare(flags.Config):
    """The rarer kinds, all under argparse's own heading."""

    job: Job = field(default_factory=Job)
    limits: Limits = field(default_factory=Limits)

    ungrouped: ClassVar[tuple[str, ...]] = ("job", "limits")
    required_groups: ClassVar[tuple[str, ...]] = ("output",)
    has_debug: ClassVar[bool] = False
    formatter: ClassVar[type[argparse.HelpFormatter]] = argparse.RawDescriptionHelpFormatter
    doc_layout: ClassVar[str] = "split"


def rare(*argv: str) -> Rare:
    return flags.parse(Rare, "rare.py", "A rare command.\n\nMore about it,\n  kept as written.", list(argv))


def test_the_rarer_kinds_of_field_parse_to_their_values(monkeypatch):
    cfg = rare("in.txt", "--files", "a", "b", "--to_dir", "out", "--extra", "x", "--extra", "y", "--cased")
    assert cfg.job == Job(
        source="in.txt", files=["a", "b"], extra=["x", "y"], lower=False, workers=4, to_dir="out", to_file=None
    )
    assert (cfg.job.sizes, cfg.job.level, cfg.job.phase, cfg.limits) == (None, 3, 1, Limits(10, 20))
    cfg = rare("i", "--files", "a", "--to_file", "f", "--sizes", "--level", "9", "--phase", "2", "--width", "5")
    assert (cfg.job.sizes, cfg.job.level, cfg.job.phase, cfg.job.lower, cfg.limits.width) == ([], 9, 2, True, 5)
    assert rare("i", "--files", "a", "--to_file", "f", "--no-lower").job.lower is False
    monkeypatch.setitem(WORKERS, "now", 7)  # a default made when the parser is built, not at import
    assert rare("i", "--files", "a", "--to_file", "f").job.workers == 7
    assert "height" not in rare("i", "--files", "a", "--to_file", "f").flags()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["i", "--files", "a"], ("one of the arguments --to_file --to_dir is required",)),
        (["i", "--files", "a", "--to_file", "f", "--to_dir", "d"], ("--to_dir: not allowed with argument --to_file",)),
        (["i", "--files", "a", "--to_file", "f", "--level", "10"], ("--level", "invalid choice: 10")),
        (["i", "--files", "a", "--to_file", "f", "--phase", "3"], ("--phase", "invalid choice: 3")),
        (["i", "--files", "a", "--to_file", "f", "--height", "3"], ("unrecognized arguments: --height 3",)),
        (["i", "--files", "a", "--to_file", "f", "--debug"], ("unrecognized arguments: --debug",)),
        (["--files", "a", "--to_file", "f"], ("the following arguments are required: source",)),
    ],
)
def test_the_rarer_kinds_refuse_in_one_line(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        rare(*argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("rare.py: error: "), err
    for word in words:
        assert word in err, err


def test_help_of_the_rarer_kinds(capsys):
    with pytest.raises(SystemExit):
        rare("--help")
    out = capsys.readouterr().out
    usage = " ".join(out.split("\n\n")[0].split())
    assert usage == (
        "usage: rare.py [-h] --files FILES [FILES ...] [--sizes [SIZES ...]] [--extra X] [--level {1..9}] "
        "[--phase {1,2}] [--lower | --no-lower] [--cased] [--workers WORKERS] (--to_file TO_FILE | --to_dir TO_DIR) "
        "[--width WIDTH] source"
    )
    assert "\nA rare command.\n\npositional arguments:\n  source " in out  # the first paragraph
    assert out.rstrip().endswith("More about it,\n  kept as written.")  # the rest of the docstring, as written
    text = " ".join(out.split())
    assert "--width WIDTH box: the width" in text and "--cased keep case" in text
    assert "(default:" not in text.replace("(default: True)", "")  # BooleanOptionalAction adds its own only


@dataclass(frozen=True)
class StartFlags:
    """The start command's flags."""

    port: int = 80
    """the port"""


@dataclass(frozen=True)
class Start(flags.Config):
    """start it"""

    start: StartFlags = field(default_factory=StartFlags)

    has_debug: ClassVar[bool] = False

    def rules(self) -> list[tuple[bool, str]]:
        return [(self.start.port < 1, f"--port {self.start.port} must be positive")]


@dataclass(frozen=True)
class Stop(flags.Config):
    """stop it"""

    has_debug: ClassVar[bool] = False


@dataclass(frozen=True)
class Service(flags.Config):
    """--name, then start or stop."""

    job: Limits = field(default_factory=Limits)

    ungrouped: ClassVar[tuple[str, ...]] = ("job",)
    commands: ClassVar[dict[str, type[flags.Config]]] = {"start": Start, "stop": Stop}


def test_sub_commands_parse_to_their_configurations(capsys):
    top, name, cfg = flags.parse_command(Service, "svc.py", "A service.", ["--width", "3", "start", "--port", "8"])
    assert (top.job, name, cfg) == (Limits(3, 20), "start", Start(StartFlags(8)))
    assert flags.parse_command(Service, "svc.py", "A service.", ["stop"])[1:] == ("stop", Stop())
    with pytest.raises(cli.InputError, match=r"^--port 0 must be positive$"):
        flags.parse_command(Service, "svc.py", "A service.", ["start", "--port", "0"])
    with pytest.raises(SystemExit) as e:
        flags.parse_command(Service, "svc.py", "A service.", ["stop", "--port", "8"])
    assert e.value.code == 2 and "unrecognized arguments: --port 8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        flags.parse_command(Service, "svc.py", "A service.", ["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "{start,stop} start start it stop stop it" in text and "--debug" in text


def test_flag_passes_on_only_what_argparse_needs():
    with pytest.raises(TypeError, match="not \\['dest'\\]"):
        flag(1, dest="other")
