"""What the chains need to know about a chat model, whichever provider serves it.

The chains never import a provider, nor anything about how a model's calls are scheduled.
``ragchains.models`` builds a provider's model and describes it with an ``LLM``: the
runnable, its own token counter, and which of the two ways of getting structured replies it
supports (tool calling, or a GBNF grammar that constrains decoding, as llama.cpp does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AnyMessage, BaseMessage, convert_to_messages, trim_messages
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import Runnable, RunnableConfig
from pydantic import BeforeValidator

from ragchains.prompts.registry import Prompt

ChatRunnable = Runnable[LanguageModelInput, BaseMessage] | Runnable[LanguageModelInput, Any]

# The tag of the run that writes the answer a user reads (the answer stage's ``prompt |
# model``). It says what the run is, as LangChain's tags do; LangChain hands it down to the
# runs below, the model's among them, where a model that orders its calls may read it.
ANSWER_TAG = "answer"


def approximate_tokens(text: str) -> int:
    """langchain_core's chars-per-token estimate, for models whose tokenizer is not at hand."""
    return count_tokens_approximately([("human", text)])


def grammar_keyword(max_tokens: int, grammar: str | None) -> dict[str, Any]:
    """A call's options as LangChain's llama.cpp models take them: ``grammar=<GBNF>``."""
    return {"max_tokens": max_tokens, **({"grammar": grammar} if grammar is not None else {})}


@dataclass(frozen=True)
class LLM:
    """A chat model and its capabilities.

    ``model`` is a chat model or a chat model with fallbacks (``with_fallbacks`` keeps
    ``bind_tools`` working on every member).
    """

    model: ChatRunnable
    name: str
    count_tokens: Callable[[str], int] = approximate_tokens
    tool_calling: bool = False
    grammar: bool = False  # takes a GBNF grammar per call
    # The keyword arguments that send one call's max_tokens and grammar: a server may want
    # the grammar in its own field of the request body (``ragchains.models.providers``).
    call_options: Callable[[int, str | None], dict[str, Any]] = grammar_keyword

    @classmethod
    def of(cls, model: Any, **kwargs: Any) -> LLM:
        """Describe a chat model: whether it takes tools (probed), whether it takes a GBNF
        grammar (``accepts_grammar``), and its own token counter where it has one."""
        kwargs.setdefault("tool_calling", supports_tool_calling(model))
        kwargs.setdefault("grammar", bool(getattr(model, "accepts_grammar", False)))
        counter = getattr(model, "count_tokens", None)
        if callable(counter):
            kwargs.setdefault("count_tokens", counter)
        return cls(model=model, name=kwargs.pop("name", type(model).__name__), **kwargs)

    def bound(
        self,
        *,
        temperature: float,
        max_tokens: int,
        tools: list[dict[str, Any]] | None = None,
        grammar: str | None = None,
    ) -> Any:
        """The model with one prompt's sampling parameters, tools or grammar."""
        model: Any = self.model
        if tools and self.tool_calling:
            # Tools or a grammar, not both: a server that takes both applies one to the other.
            model, grammar = model.bind_tools(tools), None
        options = self.call_options(max_tokens, grammar if self.grammar else None)
        return model.bind(temperature=temperature, **options)

    def prompted(
        self,
        prompt: Prompt,
        *,
        tools: list[dict[str, Any]] | None = None,
        grammar: str | None = None,
        temperature: float | None = None,
    ) -> Runnable[dict[str, Any], Any]:
        """``prompt | model``: the prompt's template piped into the model bound to the
        prompt's own parameters (and ``tools`` or ``grammar``; ``temperature`` overrides the
        prompt's); the model's reply out."""
        model = self._for(prompt, tools, grammar, temperature)
        return (prompt.template | model).with_config(_run_config(prompt))

    def text(self, prompt: Prompt, *, grammar: str | None = None) -> Runnable[dict[str, Any], str]:
        """``prompt | model | StrOutputParser()``: the reply's text (streamed: each chunk's
        text)."""
        model = self._for(prompt, None, grammar)
        return (prompt.template | model | StrOutputParser()).with_config(_run_config(prompt))

    def _for(
        self,
        prompt: Prompt,
        tools: list[dict[str, Any]] | None,
        grammar: str | None,
        temperature: float | None = None,
    ) -> Any:
        params = prompt.model_parameters
        return self.bound(
            temperature=params.temperature if temperature is None else temperature,
            max_tokens=params.max_tokens,
            tools=tools,
            grammar=grammar,
        )

    def trim_history(self, history: Sequence[BaseMessage], max_tokens: int) -> list[BaseMessage]:
        return trim_history(history, max_tokens=max_tokens, count_tokens=self.count_tokens)


def _run_config(prompt: Prompt) -> RunnableConfig:
    """A prompt's run: named ``name@vN`` (no "/": run names are keys of astream_log's JSON
    patch paths, where a slash would read as a level) with its full ref in the metadata."""
    return {"run_name": f"{prompt.name}@v{prompt.version}", "metadata": {"prompt": prompt.ref}}


def as_llm(model: LLM | Any) -> LLM:
    """What the chains take as a chat model: an ``LLM`` as it is, or any LangChain chat model
    (``BaseChatModel``, or a runnable of one with fallbacks) described by ``LLM.of``."""
    if isinstance(model, LLM):
        return model
    if not isinstance(model, Runnable):
        raise ValueError(f"llm must be a LangChain chat model, not {type(model).__name__}")
    return LLM.of(model)


def supports_tool_calling(model: Any) -> bool:
    """Whether ``bind_tools`` works with a free choice of tool (llama.cpp's only forces one)."""
    probe = [
        {
            "type": "function",
            "function": {"name": "probe", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    try:
        model.bind_tools(probe)
    except (AttributeError, NotImplementedError, ValueError, TypeError):
        return False
    return True


def trim_history(
    history: Sequence[BaseMessage], *, max_tokens: int, count_tokens: Callable[[str], int]
) -> list[BaseMessage]:
    """Newest turns first, within ``max_tokens``; never a turn split in half."""
    if not history:
        return []

    def counter(messages: list[BaseMessage]) -> int:
        return sum(count_tokens(str(m.content)) + 4 for m in messages)

    return trim_messages(
        list(history),
        max_tokens=max_tokens,
        token_counter=counter,
        strategy="last",
        start_on="human",
        end_on=("ai", "human"),
        allow_partial=False,
    )


def _as_messages(value: Any) -> list[BaseMessage]:
    """Messages as LangChain serialises them ({"type": "human", ...}), as OpenAI writes them
    ({"role": "user", ...}) or as message objects; anything else is a validation error."""
    if not isinstance(value, list | tuple):
        raise ValueError("chat_history must be a list of messages")
    messages = []
    for n, item in enumerate(value):
        try:
            message = convert_to_messages([item])[0]
        except Exception as exc:  # langchain raises KeyError for a tool message without an id
            raise ValueError(_NOT_A_TURN.format(n=n)) from exc
        # The history is the conversation's turns: the user's and the assistant's words.
        if message.type not in ("human", "ai") or not isinstance(message.content, str):
            raise ValueError(_NOT_A_TURN.format(n=n))
        messages.append(message)
    return messages


_NOT_A_TURN = (
    "chat_history[{n}] is not a turn of the conversation; give {{'type': 'human' or 'ai', "
    "'content': text}} or {{'role': 'user' or 'assistant', 'content': text}}"
)


# The chat history field of every input that takes one.
ChatHistory = Annotated[list[AnyMessage], BeforeValidator(_as_messages)]
