"""The value types of the command line's flags: each turns a flag's text into its value, or
into argparse's own error ("argument --flag: <message>"). Shared by every parser that
``deploy/settings.py`` builds; nothing here imports the rest of ``deploy/``, so the table and
the modules that read parsed settings can all import it."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from conveyor.ingress.restricted import RestrictedGroup, parse_group, parse_openai_group
from conveyor.proto.errors import ConveyorError


def triton_bool(text: str) -> bool:
    """Triton's boolean flags take true/false (also 1/0, yes/no)."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def triton_int_bool(text: str) -> int:
    """``--log-verbose``: an integer, or true/false as 1/0 (Triton's ParseIntBoolOption)."""
    value = text.strip().lower()
    if value in ("true", "false"):
        return int(value == "true")
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid option value: '{text}'") from None


def triton_bool_int(text: str) -> int:
    """A boolean that gRPC core takes as 0/1 (``--grpc-keepalive-permit-without-calls``)."""
    return int(triton_bool(text))


def checked(check: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse ``type``: the text as given once ``check`` accepts it; its ValueError becomes
    argparse's own error ("argument --flag: <message>")."""

    def parse(text: str) -> str:
        try:
            check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    return parse


def load_threads(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a number of threads, 1 or more: {text!r}")
    return n


def backend_setting(text: str) -> object:
    from conveyor.router.repository.backend_config import parse_setting

    return parse_setting(text)


def dispatch_cpu_text(text: str) -> object:
    from conveyor.deploy.runtime.dispatch_cpu import dispatch_cpu

    return dispatch_cpu(text)


def cache_config(text: str) -> str:
    from conveyor.router.response_cache import parse_cache_config

    try:
        parse_cache_config([text])
    except ConveyorError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def resource_limit(text: str) -> str:
    from conveyor.router.scheduling.rate_limiter import ResourceLimit

    try:
        ResourceLimit.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def restricted_group(text: str) -> RestrictedGroup:
    try:
        return parse_group(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def restricted_text(group: RestrictedGroup) -> str:
    """A restricted group as the text ``restricted_group`` parses back to it."""
    return f"{','.join(group.categories)}:{group.key}={group.value}"


class OpenAiRestrictedGroup(argparse.Action):
    """``--openai-restricted-api``, repeatable: Triton's three words ``<api>,... <key> <value>`` (its
    ``nargs=3``), or the one word ``<api>,...:<key>=<value>`` the other restricted flags take (and
    ``conveyor serve`` hands its children)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        words = [values] if isinstance(values, str) else [str(v) for v in values or ()]
        try:
            group = parse_openai_group(words)
        except ValueError as err:
            raise argparse.ArgumentError(self, str(err)) from None
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or []), group])


class FlagsOverDefault(argparse.Action):
    """Several values after one flag, the flag repeatable (vLLM's ``--api-key a b``); the values given replace
    the default (one the environment decided) rather than add to it, as argparse's ``extend`` would."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        given = [values] if isinstance(values, str) else [str(v) for v in values or ()]
        current = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, [*(current if current is not None and current is not self.default else []),
                                       *given])


def tool_parser(text: str) -> str:
    """``--tool-call-parser``: one of the OpenAI endpoint's tool-call parsers (vLLM's names, and Triton's
    frontend's ``llama3`` for ``llama3_json``). The parsers are imported only for a name: every ingress is
    handed the flag, mostly empty, and importing them was a tenth of a second of each one's start-up."""
    if not text:
        return ""  # none
    from conveyor.ingress.openai.tools import PARSERS, TRITON_PARSERS

    name = TRITON_PARSERS.get(text, text)
    if name and name not in PARSERS:  # "": none (argparse passes the default through too)
        raise argparse.ArgumentTypeError(f"'{text}' is not a tool-call parser: {', '.join(sorted(PARSERS))} "
                                         f"(or {', '.join(TRITON_PARSERS)})")
    return name


def port_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    try:
        if not sep:
            raise ValueError
        return int(low), int(high)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "Cannot parse pair option due to incorrect number of inputs.--<pair option> argument requires "
            f"format <first>-<second>. Found: {text}"
        ) from None
