"""Typed, frozen configurations and their command lines, one way for every script (torchtitan's style).

A configuration is a frozen dataclass (a subclass of `Config`) whose fields are sections, each section a frozen
dataclass whose fields are flags: --<field> with the field's default, and the docstring under the field as its
--help text (`field_docs` reads them; Python keeps no docstrings of attributes at run time). `flag()` marks a
field that needs more than its name (aliases, another flag name, a required flag, a help text made in code).

    cfg = flags.parse(PretrainConfig, "run_pretraining.py", __doc__, argv)
    cfg.training.max_steps, cfg.flags()["max_steps"]

The converter (`build_parser`) makes the argparse parser: --help grouped by section (flags added in the
configuration's `flag_order`, section by section unless it says otherwise), a switch for a bool, choices
for a Literal, `X | None` accepting X, the shared --precision flags (precision_policy.add_arguments) for a field named
`precision`, and --debug (cli.add_debug_argument). Argparse's own errors are one line and exit status 2.
`parse` builds the configuration from the command line and applies its cross-flag rules (`Config.rules`: (refused,
message) pairs, the first refused one raised as cli.InputError, which only a script's main() turns into its line).
A configuration is never changed after parsing: what a script derives from it is a new object
(dataclasses.replace) or a value of its own.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from typing import Any, ClassVar, Sequence, TypeVar

from bert_recipe.io import cli
from bert_recipe.training import precision_policy

C = TypeVar("C", bound="Config")


def flag(default: Any, *aliases: str, name: str | None = None, required: bool = False, help: str | None = None) -> Any:
    """A field whose flag needs more than its name: other spellings (`aliases`), a flag name other than
    --<field> (`name`: --json-summary), a flag the command line must give (`required`), or a --help text made in
    code (`help`: one built from a list kept elsewhere, or the shared text of precision_policy.py) instead of the
    docstring."""
    return dataclasses.field(
        default=default, metadata={"aliases": aliases, "flag": name, "required": required, "help": help}
    )


def field_docs(cls: type) -> dict[str, str]:
    """{field name: the docstring under it, white space folded}, read from the source of `cls` and of the
    dataclasses it derives from (a subclass's docstring for a field it declares again wins)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass) and "__dataclass_fields__" in vars(klass):
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


@dataclasses.dataclass(frozen=True)
class Config:
    """A configuration of sections (see the module's docstring); a subclass declares them as fields, each with
    a default_factory and, under it, the title of its --help group."""

    debug_section: ClassVar[str | None] = None  # the --help group --debug is listed in (None: the last)

    @classmethod
    def from_flags(cls: type[C], flags: dict[str, Any]) -> C:
        """The sections from a flat {flag: value} dict (argparse's namespace); a flag not given keeps its
        default."""
        sections = {}
        for section in dataclasses.fields(cls):
            kind = section.default_factory
            sections[section.name] = kind(
                **{f.name: flags[f.name] for f in dataclasses.fields(kind) if f.name in flags}
            )
        return cls(**sections)

    def flags(self) -> dict[str, Any]:
        """{flag: value} of every flag, flat, in `flag_order` (what a PARAMETER log line and a checkpoint's "args"
        hold)."""
        return {name: getattr(getattr(self, section), name) for section, name in self.flag_order() if name}

    @classmethod
    def flag_order(cls) -> list[tuple[str, str | None]]:
        """(section, field) of every flag in the order the parser adds them: the usage line's order, and each
        --help group's; (section, None) is --debug. Here section by section, --debug after the fields of
        `debug_section` (None: the last section)."""
        fields = dataclasses.fields(cls)
        debug_section = cls.debug_section or fields[-1].name
        order: list[tuple[str, str | None]] = []
        for section in fields:
            order += [(section.name, f.name) for f in dataclasses.fields(section.default_factory)]
            if section.name == debug_section:
                order.append((section.name, None))  # read by cli.script_errors from the command line, no field
        return order

    def sections(self) -> list[Any]:
        return [getattr(self, s.name) for s in dataclasses.fields(self)]

    def rules(self) -> list[tuple[bool, str]]:
        """(refused, message) for every rule between flags, in the order they are reported."""
        return []


class OneLineParser(argparse.ArgumentParser):
    """Errors as one line ("<prog>: error: ...") and exit status 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser(cls: type[Config], prog: str, doc: str) -> argparse.ArgumentParser:
    """The parser of configuration `cls`: a group per section (titled by the docstring under the section's field),
    a flag per field, added in `cls.flag_order()`; the description is the first paragraph of `doc`."""
    parser = OneLineParser(
        prog=prog, description=doc.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    titles = field_docs(cls)
    groups, fields, hints, docs = {}, {}, {}, {}
    for section in dataclasses.fields(cls):
        groups[section.name] = parser.add_argument_group(titles[section.name])
        kind = section.default_factory
        fields[section.name] = {f.name: f for f in dataclasses.fields(kind)}
        hints[section.name], docs[section.name] = typing.get_type_hints(kind), field_docs(kind)
    for section, name in cls.flag_order():
        if name is None:
            cli.add_debug_argument(groups[section])  # read by cli.script_errors from the command line, no field
        else:
            add_flag(groups[section], fields[section][name], hints[section][name], docs[section].get(name, ""))
    return parser


def add_flag(group, f: dataclasses.Field, kind: Any, doc: str) -> None:
    """The flag of field `f` (type `kind`): a switch for a bool, choices for a Literal, `None` allowed as default."""
    text = f.metadata.get("help") or doc
    if f.name == "precision":  # --precision auto|fp32|tf32|fp16|bf16 and its aliases, as every entry script
        if f.metadata.get("help"):
            precision_policy.add_arguments(group, help_text=text)  # the shared text is the whole help
        else:
            precision_policy.add_arguments(group, doc)  # the docstring, then the training rule for auto
        return
    names = [f.metadata.get("flag") or f"--{f.name}", *f.metadata.get("aliases", ())]
    help = text.replace("%", "%%")  # argparse formats help with %
    if kind is bool:
        group.add_argument(*names, dest=f.name, action="store_true", help=help)
        return
    choices = None
    if typing.get_origin(kind) is typing.Literal:
        choices, kind = typing.get_args(kind), str
    if isinstance(kind, types.UnionType):  # "str | None"
        kind = next(t for t in typing.get_args(kind) if t is not type(None))
    group.add_argument(
        *names,
        dest=f.name,
        type=kind,
        default=f.default,
        help=help,
        choices=choices,
        required=f.metadata.get("required", False),
    )


def parse(cls: type[C], prog: str, doc: str, argv: Sequence[str] | None = None) -> C:
    """Configuration `cls` from the command line (`argv`, default sys.argv[1:]); cli.InputError (one line, from
    the script's main) for the first of its rules that refuses the values."""
    flags = vars(build_parser(cls, prog, doc).parse_args(argv))
    flags.pop("debug")
    cfg = cls.from_flags(flags)
    check(cfg.rules())
    return cfg


def check(rules: Sequence[tuple[bool, str]]) -> None:
    """cli.InputError with the message of the first refused (refused, message) rule."""
    for refused, message in rules:
        if refused:
            raise cli.InputError(message)
