"""The types settings are declared with: one setting, its flag, how it parses, the text it is handed on as
(``Setting``, declared by ``setting(...)``); and a typed view of parsed settings (``Settings``), whose
subclasses in ``deploy/settings.py``, ``router_settings.py`` and ``ingress_settings.py`` declare every setting
once.

A ``Settings`` subclass declares settings as annotated class attributes, ``name: type = setting(...)``:
the name is the parsed value's attribute, the annotation its type, ``setting(...)`` the flag. The class says
who uses what it declares (``ACTORS``), or whose own flags they are (``ONLY``). Classes that combine
others declare nothing and are the typed settings of one actor: ``RouterSettings.of(namespace)``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Self

# The commands a setting is a flag of. "serve" is also ``tritonserver``: both start the same group.
SERVE, ROUTER, INGRESS, WORKER = "serve", "router", "ingress", "worker"
# Who reads a setting: the supervisor of ``conveyor serve``, or the children it is handed to.
SUPERVISOR = "supervisor"
CHILDREN = (ROUTER, WORKER, INGRESS)

_SAME = object()  # tritonserver's default is conveyor serve's


def _text(value: Any) -> str:
    """A value as its flag's text: booleans as Triton spells them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def path_text(value: Any) -> str:
    # A child may run in another folder: it gets the file the supervisor was given.
    return os.path.abspath(value) if value else ""


@dataclass(frozen=True)
class Setting:
    """One flag. ``flags`` are its spellings (the first names it; the rest are aliases)."""

    flags: tuple[str, ...]
    help: str
    kind: Callable[[str], Any] | None = None  # argparse's ``type``; None: the text as given
    default: Any = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    repeatable: bool = False  # each use adds a value (a list)
    nargs: str | None = None  # argparse's ``nargs`` (with ``action``: a value of several words)
    action: type[argparse.Action] | None = None  # argparse's ``action``, in place of store/append
    switch: bool = False  # takes no value (store_true)
    dest: str = ""  # the Namespace attribute; default: the first flag's name
    # Who uses it: SUPERVISOR, and the children (ROUTER, WORKER, INGRESS) ``handoff`` passes it to.
    actors: frozenset[str] = frozenset({SUPERVISOR})
    # The commands that take it, beyond serve and the children it is handed to: accepted there and
    # not used (kept so that command lines written for them still run).
    also: frozenset[str] = frozenset()
    # A process's own flag, not serve's (its endpoints, its systemd instance): the commands that take it.
    only: frozenset[str] = frozenset()
    triton: bool = False  # one of tritonserver's own flags (its spellings are Triton's)
    triton_default: Any = _SAME  # tritonserver's default, where Triton's differs from conveyor serve's
    required: frozenset[str] = frozenset()  # the commands that refuse to run without it
    section: str = ""  # the argument group it is listed under ("": the command's options)
    env: str = ""  # the variable whose value, when set, is the default (parsed as the flag's text)
    default_from: Callable[[], Any] | None = None  # a default the environment decides otherwise
    unused: str = ""  # a Triton flag accepted and not used: why it changes nothing
    grpc_option: str = ""  # the grpc core channel argument it sets (Triton's grpc_server.cc)
    to_text: Callable[[Any], str] = _text  # a value back to the flag's text, for a child's command line
    # A secret (an API key): never on a child's command line, which every user of the host can read in
    # /proc; handed to the children in this environment variable instead (``secret_text`` of the value).
    secret_env: str = ""

    @property
    def commands(self) -> frozenset[str]:
        """The commands that take it: serve (and tritonserver) and every child it is handed to,
        so that a child cannot be handed a flag its parser lacks, nor take one of serve's unused."""
        if self.only:
            return self.only
        return frozenset({SERVE}) | (self.actors & frozenset(CHILDREN)) | self.also

    @property
    def name(self) -> str:
        return self.dest or self.flags[0][2:].replace("-", "_")

    def default_now(self, triton: bool = False) -> Any:
        """The default for a parser built now (the environment read now)."""
        if triton and self.triton_default is not _SAME:
            return self.triton_default
        if self.default_from is not None:
            return self.default_from()
        if self.env and os.environ.get(self.env):
            text = os.environ[self.env]
            return self.kind(text) if self.kind is not None else text
        return list(self.default) if isinstance(self.default, list) else self.default  # a list of its own

    def add_to(self, p: argparse.ArgumentParser | argparse._ArgumentGroup, command: str, triton: bool) -> None:
        kwargs: dict[str, Any] = {"dest": self.name, "help": self.help}
        if self.switch:
            kwargs["action"] = "store_true"
        else:
            kwargs["default"] = self.default_now(triton)
            if self.kind is not None:
                kwargs["type"] = self.kind
            if self.metavar is not None:
                kwargs["metavar"] = self.metavar
            if self.choices is not None:
                kwargs["choices"] = list(self.choices)
            if self.nargs is not None:
                kwargs["nargs"] = self.nargs
            if self.action is not None:
                kwargs["action"] = self.action
            elif self.repeatable:
                kwargs["action"] = "append"
        if command in self.required:
            kwargs["required"] = True
        p.add_argument(*self.flags, **kwargs)

    def environment(self, value: Any) -> dict[str, str]:
        """A secret's value in a child's environment (one item a line); nothing for another setting."""
        if not self.secret_env or not value:
            return {}
        return {self.secret_env: "\n".join(value) if self.repeatable or isinstance(value, list) else str(value)}

    def argv(self, value: Any) -> list[str]:
        """The flag and its value(s) on a child's command line; nothing for an unset value."""
        if value is None or self.secret_env:
            return []
        if self.switch:
            return [self.flags[0]] if value else []
        values = value if self.repeatable else [value]
        out: list[str] = []
        for v in values:
            text = self.to_text(v)
            # One argument when the text could read as a flag of its own (a pattern, a negative number).
            out += [f"{self.flags[0]}={text}"] if text.startswith("-") else [self.flags[0], text]
        return out



def setting(flags: tuple[str, ...], help: str, **kwargs: Any) -> Any:
    """A setting declared in a ``Settings`` class body (typed as its value there: the class reads it back)."""
    return Setting(flags, help, **kwargs)


class Settings:
    """Parsed settings, typed: each attribute a class declares with :func:`setting` holds its parsed value."""

    ACTORS: ClassVar[frozenset[str]] = frozenset({SUPERVISOR})  # who uses the settings a class declares
    ONLY: ClassVar[frozenset[str]] = frozenset()  # a process's own flags: the commands that take them
    _declared: ClassVar[tuple[Setting, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = []
        for name, value in list(vars(cls).items()):
            if isinstance(value, Setting):
                value = replace(value, dest=name, actors=cls.ACTORS, only=cls.ONLY)
                setattr(cls, name, value)
                own.append(value)
        cls._declared = tuple(own)

    @classmethod
    def declared(cls) -> tuple[Setting, ...]:
        """The settings this class itself declares, in their order."""
        return cls._declared

    @classmethod
    def settings(cls) -> tuple[Setting, ...]:
        """Every setting of this class and the classes it combines, in the order they are combined."""
        found: dict[str, Setting] = {}
        for klass in cls.__mro__:
            if issubclass(klass, Settings):
                for s in klass.declared():
                    found.setdefault(s.name, s)
        return tuple(found.values())

    @classmethod
    def of(cls, parsed: argparse.Namespace) -> Self:
        """This class's settings as parsed (after Triton's aliases are folded in)."""
        out = cls.__new__(cls)
        for s in cls.settings():
            setattr(out, s.name, getattr(parsed, s.name))
        return out
