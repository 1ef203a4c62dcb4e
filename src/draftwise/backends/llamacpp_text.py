"""Text side of the llama.cpp backend: vocabulary, tokenize, detokenize, chat template.

The chat template is the GGUF's own Jinja template (`tokenizer.chat_template`), rendered by
llama-cpp-python's `Jinja2ChatFormatter`, which renders it the way transformers does (sandboxed,
trim_blocks, lstrip_blocks, loop controls, transformers' `tojson`; llama-cpp-python >= 0.3.24), so
both backends build the same prompt ids.  `llama_chat_apply_template` is not used: it matches
templates against a built-in list and drops what the Jinja source does (SmolLM2's default system
prompt).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Sequence

import llama_cpp
import numpy as np
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from draftwise.runtime.text import utf8_bytes



def vocab_texts(vocab, n_vocab: int) -> list[str]:
    """Token texts in id order as stored in the GGUF (byte-level BPE texts, like HF's convert_ids_to_tokens)."""
    get = llama_cpp.llama_vocab_get_text
    return [(get(vocab, i) or b"").decode("utf-8", "surrogateescape") for i in range(n_vocab)]


def tokenize(vocab, text: str, add_special: bool) -> list[int]:
    data = utf8_bytes(text)  # text that is not valid UTF-8 is refused by name (draftwise.runtime.text)
    size = len(data) + 8
    for _ in range(2):
        buf = (llama_cpp.llama_token * size)()
        # parse_special=True: like HF tokenizers, "<|im_start|>" in the text is the special token
        n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, size, add_special, True)
        if n >= 0:
            return list(buf[:n])
        size = -n
    raise RuntimeError(f"llama_tokenize kept asking for a larger buffer ({size} tokens)")


def detokenize(vocab, tokens: Sequence[int]) -> str:
    ids = np.ascontiguousarray(tokens, dtype=np.int32)
    ptr = ids.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token))
    size = 8 * len(ids) + 16
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        # remove_special=False, unparse_special=True: like HF decode(skip_special_tokens=False)
        n = llama_cpp.llama_detokenize(vocab, ptr, len(ids), buf, size, False, True)
        if n >= 0:
            return buf.raw[:n].decode("utf-8", "replace")
        size = -n
    raise RuntimeError(f"llama_detokenize kept asking for a larger buffer ({size} bytes)")


def model_meta(model, key: str) -> str | None:
    size = 1 << 16
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, size)
        if n < 0:
            return None
        if n < size:
            return buf.value.decode("utf-8")
        size = n + 1
    return None


@functools.lru_cache(maxsize=8)
def _chat_formatter(template: str, bos_token: str, eos_token: str) -> Jinja2ChatFormatter:
    return Jinja2ChatFormatter(template, eos_token=eos_token, bos_token=bos_token, add_generation_prompt=True)


def render_chat(template: str, messages: Sequence[dict], bos_token: str, eos_token: str) -> str:
    """The chat template applied like transformers' apply_chat_template(add_generation_prompt=True)."""
    return _chat_formatter(template, bos_token, eos_token)(messages=list(messages)).prompt
