"""The generated models' tokenizers: a byte-level ``gpt2`` vocabulary with a chat family's control tokens.

Two families, as the real models have them:

* ``chatml`` (Qwen): ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` and a ChatML template;
* ``harmony`` (gpt-oss): OpenAI's harmony markup (``<|start|>``, ``<|message|>``, ``<|channel|>``,
  ``<|end|>``, ``<|return|>``...) and a template in its format. llama.cpp treats some of
  these as always-parsed text (it marks ``<|start|>``, ``<|message|>``, ``<|channel|>`` and
  ``<|constrain|>`` user-defined), as it does for the real gpt-oss vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import ConfigError

# At least one merge is required: llama.cpp refuses a gpt2 vocabulary without merges.
MERGES = ("Ġ t", "h e", "i n")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: The harmony format of gpt-oss, reduced to its markup: a system header, the system prompt as the
#: developer's instructions, turns as ``<|start|>role<|message|>...<|end|>``, the assistant's on the
#: ``final`` channel, and the generation prompt ``<|start|>assistant``.
HARMONY_TEMPLATE = (
    "{{ '<|start|>system<|message|>Reasoning: low\\n\\n# Valid channels: analysis, commentary, final. "
    "Channel must be included for every message.<|end|>' }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{{ '<|start|>developer<|message|># Instructions\\n\\n' + message['content'] + '<|end|>' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' }}"
    "{% else %}"
    "{{ '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}"
)


@dataclass(frozen=True)
class ChatFamily:
    """A family's control tokens, which of them are BOS/EOS/PAD, its pre-tokenizer and template."""

    specials: tuple[str, ...]
    bos: str
    eos: str
    pad: str
    pre: str
    template: str


FAMILIES = {
    "chatml": ChatFamily(specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"), bos="<|endoftext|>",
                         eos="<|im_end|>", pad="<|endoftext|>", pre="qwen2", template=CHATML_TEMPLATE),
    "harmony": ChatFamily(
        specials=("<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
                  "<|end|>", "<|message|>", "<|call|>"),
        bos="<|startoftext|>", eos="<|return|>", pad="<|endoftext|>", pre="gpt-4o", template=HARMONY_TEMPLATE),
}

# gguf token types (llama_token_type)
NORMAL, CONTROL, UNUSED = 1, 3, 5


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode table: one printable character per byte value."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    table = {}
    extra = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def byte_vocab(size: int | None = None, *, family: str = "chatml") -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of the byte-level vocabulary.

    256 byte tokens, one token per merge, then the family's control tokens; ``size``
    pads with unused filler tokens up to that many (to give the output head a real size).
    """
    specials = FAMILIES[family].specials
    tokens = _byte_tokens()
    types = [NORMAL] * len(tokens)
    for merge in MERGES:
        tokens.append(merge.replace(" ", ""))
        types.append(NORMAL)
    for special in specials:
        tokens.append(special)
        types.append(CONTROL)
    if size is not None:
        if size < len(tokens):
            raise ConfigError(f"The byte vocabulary needs at least {len(tokens)} tokens (asked for {size}).")
        for i in range(size - len(tokens)):
            tokens.append(f"<|filler_{i}|>")
            types.append(UNUSED)
    return tokens, types, list(MERGES)


def resolve_vocab(vocab: str | int, family: str) -> tuple[list[str], list[int], list[str]]:
    """:func:`byte_vocab` for a ``vocab`` argument: ``"bytes"`` (no padding) or a size to pad to."""
    if vocab == "bytes":
        return byte_vocab(family=family)
    if isinstance(vocab, int) and not isinstance(vocab, bool):
        return byte_vocab(vocab, family=family)
    raise ConfigError(f"vocab must be 'bytes' or a vocabulary size, not {vocab!r}.")


def add_tokenizer(writer, tokens: list[str], types: list[int], merges: list[str], family: str) -> None:
    """The byte-level ``gpt2`` vocabulary, its control tokens and the family's chat template."""
    fam = FAMILIES[family]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(fam.pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index(fam.bos))
    writer.add_eos_token_id(tokens.index(fam.eos))
    writer.add_pad_token_id(tokens.index(fam.pad))
    writer.add_add_bos_token(False)
    writer.add_chat_template(fam.template)


__all__ = ["CHATML_TEMPLATE", "FAMILIES", "HARMONY_TEMPLATE", "add_tokenizer", "byte_vocab", "resolve_vocab"]
