"""``python -m devtools.synthetic ARCH OUT.gguf [--layers N] [--ctx N] ...``: write a generated model.

The defaults are the test models' (about 1 MB, a 64K trained context); every shape
option maps to the architecture writer's keyword argument of the same meaning, and
options an architecture does not have are refused with one line (exit status 2).
"""

from __future__ import annotations

import argparse
import sys

from pipeline.errors import ConfigError
from . import WRITERS, write_model

#: option -> writer keyword
_OPTIONS = {
    "layers": "n_layers", "ctx": "n_ctx_train", "embd": "n_embd", "heads": "n_head", "kv_heads": "n_head_kv",
    "head_dim": "head_dim", "experts": "n_experts", "experts_used": "n_experts_used", "expert_ff": "expert_ff",
    "shared_ff": "shared_ff", "interval": "full_attention_interval", "window": "sliding_window",
    "vocab": "vocab", "seed": "seed",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m devtools.synthetic",
                                description="Write a generated GGUF model with random weights (its text is noise).")
    p.add_argument("arch", choices=sorted(WRITERS), help="architecture")
    p.add_argument("out", help="the GGUF file to write")
    p.add_argument("--layers", type=int, help="blocks (default 4; mamba 2)")
    p.add_argument("--ctx", type=int, help="trained context length (default 65536)")
    p.add_argument("--embd", type=int, help="embedding width (default 64)")
    p.add_argument("--heads", type=int, help="attention query heads")
    p.add_argument("--kv-heads", type=int, help="attention KV heads")
    p.add_argument("--head-dim", type=int, help="attention head size")
    p.add_argument("--experts", type=int, help="routed experts")
    p.add_argument("--experts-used", type=int, help="experts each token uses")
    p.add_argument("--expert-ff", type=int, help="an expert's feed-forward width")
    p.add_argument("--shared-ff", type=int, help="the shared expert's width (qwen35moe)")
    p.add_argument("--interval", type=int, help="every N-th layer is full attention (qwen35moe, default 4)")
    p.add_argument("--window", type=int, help="sliding-window size (gpt-oss, default 128)")
    p.add_argument("--vocab", type=int, help="pad the byte vocabulary to this many tokens")
    p.add_argument("--dtype", choices=("f32", "f16", "q8_0", "q4_0"), help="matrix type (default f32)")
    p.add_argument("--fill", choices=("random", "zero", "timing"),
                   help="random weights (default), zeros, or zero matrices with random embeddings and routers")
    p.add_argument("--seed", type=int, help="random seed (default 0)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    shapes = {kw: getattr(args, opt) for opt, kw in _OPTIONS.items() if getattr(args, opt) is not None}
    for opt in ("dtype", "fill"):
        if getattr(args, opt) is not None:
            shapes[opt] = getattr(args, opt)
    try:
        path = write_model(args.arch, args.out, **shapes)
    except (ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from .writer import tensor_names

    size = path.stat().st_size
    print(f"{path}: {args.arch}, {len(tensor_names(path))} tensors, {size / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
