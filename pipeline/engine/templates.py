"""Chat templates: a model's Jinja template rendered in a sandbox, and templates for servers that publish none.

The local engine renders the template its GGUF carries; a remote generator renders the
one its server publishes, or one of :data:`FALLBACK` picked by the turn markers the
server's vocabulary has. A model with no template gets a plain layout.
"""

from __future__ import annotations

#: Chat templates for servers that do not publish theirs, by the family their turn markers name.
FALLBACK = {
    "ChatML": ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
               "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
    "Gemma": ("{% set sys = messages[0]['content'] + '\n\n' if messages[0]['role'] == 'system' else '' %}"
              "{% for m in messages if m['role'] != 'system' %}"
              "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else 'user') + '\n' }}"
              "{{ (sys if loop.first else '') + m['content'] + '<end_of_turn>\n' }}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"),
}


def render(template: str, messages: list[dict], *, add_generation_prompt: bool = True, bos: str = "",
           eos: str = "") -> str:
    """``messages`` through the Jinja ``template`` (sandboxed: a model file's template is untrusted input)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                            bos_token=bos, eos_token=eos)


def render_chat(template: str, system: str, user: str, *, bos: str = "", eos: str = "") -> str:
    """``system`` and ``user`` through a chat template, ready for the answer; a plain layout where
    the model has no template."""
    if not template:
        return f"{system}\n\n{user}\n\nAnswer:"
    return render(template, [{"role": "system", "content": system}, {"role": "user", "content": user}],
                  bos=bos, eos=eos)


__all__ = ["FALLBACK", "render", "render_chat"]
