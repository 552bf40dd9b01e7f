"""A Gemma 3 chat handler for llama-cpp-python, and a quiet Llama of the embedded demo model.

The demo model's GGUF carries no chat template, and llama-cpp-python's built-in "gemma" format drops
system messages. Gemma 3 folds the system prompt into the first user turn; this template does that.
"""

from __future__ import annotations

import os
from typing import Any

from llama_cpp import Llama
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

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


def gemma_chat_handler(llm: Llama) -> Any:
    """A chat handler that renders Gemma 3 turns and stops at <end_of_turn>."""
    end_of_turn = llm.tokenize(END_OF_TURN.encode(), add_bos=False, special=True)
    formatter = Jinja2ChatFormatter(
        GEMMA3_TEMPLATE, eos_token=END_OF_TURN, bos_token="<bos>", stop_token_ids=end_of_turn
    )
    return formatter.to_chat_handler()


def gemma_llama(model_path: str, n_ctx: int = 4096, **kwargs: Any) -> Llama:
    """A quiet Llama of Gemma 3 with the Gemma 3 chat handler."""
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    kwargs.setdefault("n_threads", threads)
    kwargs.setdefault("n_threads_batch", threads)
    kwargs.setdefault("verbose", False)
    llm = Llama(model_path=str(model_path), n_ctx=n_ctx, **kwargs)
    llm.chat_handler = gemma_chat_handler(llm)
    return llm
