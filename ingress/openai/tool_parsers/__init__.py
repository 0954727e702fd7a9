"""The tool-call parsers: a model's text read back as tool calls, whole or one step at a time, after vLLM's
parsers of the same names (``tools.py`` decides which reader a request's ``tool_choice`` needs).

``base.py`` holds the interface every reader implements and the JSON scanner most share; ``forced.py`` the
readers of a forced ``tool_choice`` (a named function, ``required``); one module per parser family:
``hermes.py``, ``llama.py``, ``pythonic.py``, ``mistral.py``, and ``granite.py``, ``jamba.py``, ``xlam.py``
(a JSON array behind a marker: ``arrays.py``). A model names its parser by ``TOOL_CALL_PARSER``.
"""

from __future__ import annotations

from collections.abc import Callable

from conveyor.ingress.openai.tool_parsers.base import CallReader
from conveyor.ingress.openai.tool_parsers.granite import GraniteCalls
from conveyor.ingress.openai.tool_parsers.hermes import HermesCalls
from conveyor.ingress.openai.tool_parsers.jamba import JambaCalls
from conveyor.ingress.openai.tool_parsers.llama import Llama3JsonCalls
from conveyor.ingress.openai.tool_parsers.mistral import MistralCalls
from conveyor.ingress.openai.tool_parsers.pythonic import PythonicCalls
from conveyor.ingress.openai.tool_parsers.xlam import XlamCalls

# The parsers by vLLM's names (a model's TOOL_CALL_PARSER).
PARSERS: dict[str, Callable[[], CallReader]] = {
    "hermes": HermesCalls,
    "llama3_json": Llama3JsonCalls,
    "llama4_json": Llama3JsonCalls,  # vLLM's name for the same parser on Llama 4
    "pythonic": PythonicCalls,
    "mistral": MistralCalls,
    "granite": GraniteCalls,
    "jamba": JambaCalls,
    "xlam": XlamCalls,
}
