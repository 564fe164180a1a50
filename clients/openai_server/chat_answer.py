"""One chat choice's generated text -> OpenAI's assistant message, whole or as stream deltas.

Text goes through the reasoning parser first (``reasoning_content``), then what is content through the
tool-call parser (``tool_calls``). With ``tool_choice`` ``required`` or a named function the model wrote
guided JSON from its first token, so there is no reasoning to split and the text is read as calls
(``tool_calls.json_array`` / ``tool_calls.named``). A text whose calls do not parse when it ends stays
content (streamed deltas already sent cannot be taken back; the final message of a non-streamed answer
is exact). A guided answer cut by max_tokens is still calls (``tool_calls.final_calls`` with ``cut``), never
its raw JSON as content: OpenAI's contract for those modes is tool calls.
"""
from __future__ import annotations

from . import reasoning as R
from . import tool_calls as T


class ChatAnswer:
    def __init__(self, reasoning_parser: str | None, tool_parser: T.Parser | None, guided: bool = False):
        self.guided = guided  # tool_choice required / named: the whole text was guided to be calls
        self.reasoning = R.ReasoningStream(reasoning_parser) if reasoning_parser else None
        self.tools = T.ToolCallStream(tool_parser) if tool_parser else None

    def deltas(self, text: str, final: bool = False) -> list[dict]:
        """The stream deltas (``delta`` objects of chat.completion.chunk) for newly generated ``text``."""
        thought, content = self.reasoning.feed(text, final) if self.reasoning else ("", text)
        out = []
        if thought:
            out.append({"reasoning_content": thought})
        calls = []
        if self.tools is not None:
            content, calls = self.tools.feed(content, final)
        if content:
            out.append({"content": content})
        if calls:
            out.append({"tool_calls": calls})
        return out

    @property
    def called(self) -> bool:
        """A streamed answer sent tool calls (its finish_reason is "tool_calls")."""
        return self.tools is not None and self.tools.called

    def message(self, text: str, cut: bool = False) -> dict:
        """The whole assistant message for a finished ``text`` (``cut``: max_tokens ended it)."""
        thought, content = R.split(self.reasoning.parser, text, True) if self.reasoning else ("", text)
        message: dict = {"role": "assistant", "content": content}
        if self.reasoning:
            message["reasoning_content"] = thought or None
        if self.tools is not None:
            found = T.final_calls(self.tools.parser, content, cut=cut and self.guided)
            if found is not None:
                message["content"], message["tool_calls"] = found
        return message
