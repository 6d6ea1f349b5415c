"""Typed, frozen configurations and their command lines: the one way every command of the project declares its
flags (torchtitan's and litgpt's style: a typed dataclass whose docstrings are the --help).

A configuration is a frozen dataclass (a subclass of `Config`) whose fields are sections, each section a frozen
dataclass whose fields are flags: --<field> with the field's default, and the docstring under the field as its
--help text (`field_docs` reads them; Python keeps no docstrings of attributes at run time). `flag()` marks a
field that needs more than its name and type: other spellings, another flag name, a required flag, a positional
argument, a help text made in code, switches that store a constant into it (--fp16 is --precision fp16), a
mutually exclusive group, a default computed when the parser is built (this machine's CPUs, an environment
variable), or argparse's own `metavar`, `choices`, `nargs` and `action`.

    cfg = flags.parse(PretrainConfig, "run_pretraining.py", __doc__, argv)
    cfg.training.max_steps, cfg.flags()["max_steps"]

The converter (`build_parser`) makes the argparse parser: a --help group per section (titled by the docstring under
the section's field; the `ungrouped` sections' flags under argparse's own heading), flags added in the
configuration's `flag_order`, a switch for a bool, choices for a Literal, `X | None` accepting X, `list[X]` taking
one or more X, and --debug (cli.add_debug_argument) unless the configuration sets `has_debug = False`. Class variables
of the configuration choose how its --help reads (`formatter`, `doc_layout`) and which exclusive groups must be
given (`required_groups`); a section's `omitted` fields keep their defaults and get no flag, and its
`help_prefix` starts each of its help texts. Argparse's own errors are one line and exit status 2.
`parse` builds the configuration from the command line and applies its cross-flag rules (`Config.rules`:
(refused, message) pairs, the first refused one raised as cli.InputError, which only a script's main() turns into
its line); `parse_command` does the same for a command line of sub-commands (`Config.commands`).
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
from typing import Any, Callable, ClassVar, Literal, Sequence, TypeVar

from bert_recipe.io import cli

C = TypeVar("C", bound="Config")
MISSING: Any = dataclasses.MISSING
ARGPARSE_OPTIONS = ("action", "choices", "metavar", "nargs", "type")  # what flag() passes on to argparse as given
OWN_OPTIONS = ("positional", "exclusive", "switches", "help_after")  # what flag() reads itself (see flag)


@dataclasses.dataclass(frozen=True)
class Switch:
    """Another flag that stores `const` into a field's flag (--fp16 stores "fp16" into --precision, --cased False
    into --do_lower_case), listed right after it, in its exclusive group if it has one. `default` is argparse's
    for this flag: SUPPRESS (the field's default stands) unless the command always had another."""

    names: tuple[str, ...]
    const: Any
    help: str
    default: Any = argparse.SUPPRESS


def flag(
    default: Any = MISSING,
    *aliases: str,
    name: str | None = None,
    required: bool = False,
    help: str | None = None,
    factory: Callable[[], Any] | None = None,
    **options: Any,
) -> Any:
    """A field whose flag needs more than its name and type: other spellings (`aliases`), a flag name other than
    --<field> (`name`: --json-summary), a flag the command line must give (`required`), a --help text made in code
    instead of the docstring (`help`: one built from a list kept elsewhere), a default computed when the parser is
    built (`factory`: this machine's CPUs, an environment variable). `options` are argparse's own (action, choices,
    metavar, nargs, type), passed on as given, and these of ours:
      positional  True: a positional argument named after the field, not --<field>
      exclusive   the name of a mutually exclusive group the flag belongs to (the configuration's
                  `required_groups` says whether one of its flags must be given)
      switches    Switch flags that store a constant into this one (--fp16 for --precision fp16)
      help_after  text after the docstring ("<docstring>. <help_after>"), or the whole help without one: the
                  shared rule of precision_policy.py"""
    unknown = set(options) - set(ARGPARSE_OPTIONS) - set(OWN_OPTIONS)
    if unknown:
        raise TypeError(f"flag() takes {', '.join(ARGPARSE_OPTIONS + OWN_OPTIONS)} as options, not {sorted(unknown)}")
    metadata = {
        "aliases": aliases,
        "flag": name,
        "required": required,
        "help": help,
        **{key: options.get(key) for key in OWN_OPTIONS},
        "argparse": {key: value for key, value in options.items() if key in ARGPARSE_OPTIONS},
    }
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)  # MISSING: a value the caller always gives


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


def _flag_fields(section: type) -> list[dataclasses.Field]:
    """The fields of a section class that are flags: all but its `omitted` ones."""
    omitted = getattr(section, "omitted", ())
    return [f for f in dataclasses.fields(section) if f.name not in omitted]


@dataclasses.dataclass(frozen=True)
class Config:
    """A configuration of sections (see the module's docstring); a subclass declares them as fields, each with
    a default_factory and, under it, the title of its --help group."""

    has_debug: ClassVar[bool] = True  # whether the command has --debug (cli.script_errors reads it)
    debug_section: ClassVar[str | None] = None  # the --help group --debug is listed in (None: the last)
    ungrouped: ClassVar[tuple[str, ...]] = ()  # sections listed under argparse's own heading, not a group
    required_groups: ClassVar[tuple[str, ...]] = ()  # exclusive groups (flag(exclusive=...)) one of which is needed
    formatter: ClassVar[type[argparse.HelpFormatter]] = argparse.ArgumentDefaultsHelpFormatter
    # The --help's description: "summary" the first paragraph of the command's docstring, "whole" all of it (with
    # a formatter that keeps its lines, RawDescriptionHelpFormatter), "split" the first paragraph, then the rest
    # after the flags (an epilog).
    doc_layout: ClassVar[Literal["summary", "whole", "split"]] = "summary"
    commands: ClassVar[dict[str, type[Config]]] = {}  # sub-commands (parse_command): name -> configuration

    @classmethod
    def from_flags(cls: type[C], flags: dict[str, Any]) -> C:
        """The sections from a flat {flag: value} dict (argparse's namespace); a flag not given keeps its
        default."""
        sections = {}
        for section in dataclasses.fields(cls):
            kind = section.default_factory
            sections[section.name] = kind(**{f.name: flags[f.name] for f in _flag_fields(kind) if f.name in flags})
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
        debug_section = (cls.debug_section or fields[-1].name) if cls.has_debug and fields else None
        order: list[tuple[str, str | None]] = []
        for section in fields:
            order += [(section.name, f.name) for f in _flag_fields(section.default_factory)]
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
    """The parser of configuration `cls` (see the module's docstring); its description comes from `doc`, the
    command's docstring, as `cls.doc_layout` says."""
    summary, _, rest = doc.partition("\n\n")
    layout = {"summary": (summary, None), "whole": (doc, None), "split": (summary, rest)}[cls.doc_layout]
    parser = OneLineParser(prog=prog, description=layout[0], epilog=layout[1], formatter_class=cls.formatter)
    add_flags(parser, cls)
    return parser


def add_flags(parser: argparse.ArgumentParser, cls: type[Config]) -> None:
    """The flags of configuration `cls` on `parser`: a group per section (titled by the docstring under the
    section's field) unless the section is `ungrouped`, a flag per field, added in `cls.flag_order()`."""
    titles = field_docs(cls)
    containers, fields, hints, docs, prefixes = {}, {}, {}, {}, {}
    for section in dataclasses.fields(cls):
        kind = section.default_factory
        ungrouped = section.name in cls.ungrouped
        containers[section.name] = parser if ungrouped else parser.add_argument_group(titles.get(section.name))
        fields[section.name] = {f.name: f for f in _flag_fields(kind)}
        prefixes[section.name] = getattr(kind, "help_prefix", "")
        hints[section.name], docs[section.name] = typing.get_type_hints(kind), field_docs(kind)
    exclusive: dict[tuple[str, str], Any] = {}
    for section, name in cls.flag_order():
        container = containers[section]
        if name is None:
            cli.add_debug_argument(container)  # read by cli.script_errors from the command line, no field
            continue
        f = fields[section][name]
        group = f.metadata.get("exclusive")
        if group is not None:
            if (section, group) not in exclusive:
                exclusive[section, group] = container.add_mutually_exclusive_group(
                    required=group in cls.required_groups
                )
            container = exclusive[section, group]
        add_flag(container, f, hints[section][name], docs[section].get(name, ""), prefixes[section])


def _help(f: dataclasses.Field, doc: str, prefix: str) -> str | None:
    """A flag's help text: the docstring (or flag(help=...)), then flag(help_after=...), after `prefix`."""
    text = f.metadata.get("help") or doc
    after = f.metadata.get("help_after")
    if after:
        text = f"{text}. {after}" if text else after
    return prefix + text if text else None


def _value_type(kind: Any) -> tuple[Any, dict[str, Any]]:
    """(the type argparse converts each value to, the options the annotation implies): `X | None` -> X,
    Literal -> its choices, list[X] -> X with nargs="+"."""
    implied: dict[str, Any] = {}
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        kind = next(t for t in typing.get_args(kind) if t is not type(None))
    if typing.get_origin(kind) is list:
        implied["nargs"] = "+"
        kind = typing.get_args(kind)[0]
    if typing.get_origin(kind) is Literal:
        implied["choices"] = typing.get_args(kind)
        kind = type(implied["choices"][0])
    return kind, implied


def add_flag(container, f: dataclasses.Field, kind: Any, doc: str, prefix: str = "") -> None:
    """The flag of field `f` (annotated `kind`) and its switches on `container` (a parser, group or exclusive
    group): a switch for a bool, choices for a Literal, one or more values for a list, `None` allowed as default."""
    meta = f.metadata
    text = _help(f, doc, prefix)
    options: dict[str, Any] = {"help": None if text is None else text.replace("%", "%%")}  # argparse formats with %
    if f.default is not MISSING:
        options["default"] = f.default
    elif f.default_factory is not MISSING:
        options["default"] = f.default_factory()
    else:
        options["default"] = None  # a field without a default: its flag is required (or positional)
    kind, implied = _value_type(kind)
    given = dict(meta.get("argparse", {}))
    if kind is bool and "action" not in given:
        given["action"] = "store_true"
    if "action" not in given or given["action"] in ("store", "append"):
        options.update({k: v for k, v in implied.items() if not ("action" in given and k == "nargs")})
        if kind is not str:
            options["type"] = kind
    options.update(given)
    if meta.get("positional"):
        container.add_argument(f.name, **options)
    else:
        names = [meta.get("flag") or f"--{f.name}", *meta.get("aliases", ())]
        container.add_argument(*names, dest=f.name, required=meta.get("required", False), **options)
    for switch in meta.get("switches") or ():
        container.add_argument(
            *switch.names,
            dest=f.name,
            action="store_const",
            const=switch.const,
            default=switch.default,
            help=switch.help,
        )


def parse(cls: type[C], prog: str, doc: str, argv: Sequence[str] | None = None) -> C:
    """Configuration `cls` from the command line (`argv`, default sys.argv[1:]); cli.InputError (one line, from
    the script's main) for the first of its rules that refuses the values."""
    flags = vars(build_parser(cls, prog, doc).parse_args(argv))
    flags.pop("debug", None)
    cfg = cls.from_flags(flags)
    check(cfg.rules())
    return cfg


def parse_command(cls: type[C], prog: str, doc: str, argv: Sequence[str] | None = None) -> tuple[C, str, Config]:
    """(configuration `cls`, the sub-command's name, its configuration) from a command line of `cls`'s flags, then
    one of `cls.commands` and its flags (each sub-command's --help summary is its configuration's docstring); the
    rules of both are checked, `cls`'s first."""
    parser = build_parser(cls, prog, doc)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, kind in cls.commands.items():
        add_flags(sub.add_parser(name, help=" ".join(kind.__doc__.split()), formatter_class=kind.formatter), kind)
    flags = vars(parser.parse_args(argv))
    flags.pop("debug", None)
    name = flags.pop("command")
    cfg, command = cls.from_flags(flags), cls.commands[name].from_flags(flags)
    check([*cfg.rules(), *command.rules()])
    return cfg, name, command


def check(rules: Sequence[tuple[bool, str]]) -> None:
    """cli.InputError with the message of the first refused (refused, message) rule."""
    for refused, message in rules:
        if refused:
            raise cli.InputError(message)
