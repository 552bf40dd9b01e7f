"""Chat templates for models whose GGUF carries none, starting with Gemma 3.

Without `tokenizer.chat_template` in its metadata, llama-cpp-python falls back to the "llama-2"
chat format, which Gemma does not understand, and its built-in "gemma" format drops system
messages. Gemma 3 has no system role: its own template folds the system message into the first
user turn. The embedded demo model (Gemma-3-270M Q4_K_M) ships without a template, so a chat on it
needs the template below to read its system prompt at all, and a snapshot warmed for that system
prompt only matches later chats when both render the same way.
"""

from __future__ import annotations

import logging
from typing import Any

import llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

__all__ = [
    "END_OF_TURN",
    "GEMMA3_TEMPLATE",
    "fallback_chat_handler",
    "gemma3_chat_handler",
    "has_chat_template",
]

_log = logging.getLogger("snapcache")

# Gemma 3's published template for text-only chats; `trim` and the blank line after the system text
# are as Google's, so that prompts match the ones the model was tuned on.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
END_OF_TURN = "<end_of_turn>"
_GEMMA3_BOS = "<bos>"
_TEMPLATE_KEY = "tokenizer.chat_template"


def gemma3_chat_handler(llm: llama_cpp.Llama) -> Any:
    """A llama-cpp-python chat handler that renders Gemma 3 turns and stops at `<end_of_turn>`."""
    end_of_turn = llm.tokenize(END_OF_TURN.encode(), add_bos=False, special=True)
    formatter = Jinja2ChatFormatter(
        GEMMA3_TEMPLATE, eos_token=END_OF_TURN, bos_token=_GEMMA3_BOS, stop_token_ids=end_of_turn
    )
    return formatter.to_chat_handler()


def has_chat_template(llm: llama_cpp.Llama) -> bool:
    """Whether the model's GGUF metadata carries a chat template (the default or a named one)."""
    return any(name == _TEMPLATE_KEY or name.startswith(_TEMPLATE_KEY + ".") for name in llm.metadata)


def fallback_chat_handler(llm: llama_cpp.Llama) -> Any | None:
    """The chat handler a model without a template needs, or None to keep llama-cpp-python's choice."""
    if has_chat_template(llm):
        return None
    if llm.metadata.get("general.architecture") == "gemma3":
        _log.debug("%s has no chat template: using Gemma 3's", llm.model_path)
        return gemma3_chat_handler(llm)
    return None
