"""The boundary to llama.cpp: the only package that imports ``llama_cpp``.

llama-cpp-python is layered as raw ctypes bindings (``llama_cpp.llama_cpp``), private
internals (``llama_cpp._internals``) and a public ``Llama`` class. This package is our
private layer over all three; the local engine (:mod:`..local`), the embedder
(:mod:`..embed`), the prefix cache's state files (:mod:`..cache.prefix_cache`) and the
tuner's measurements use only what it exposes here:

* :func:`load` (:mod:`.loading`) builds a :class:`Model`: one model with one context and
  one batch, from typed settings (KV types and RoPE scaling by name), with tensor
  buffer-type overrides and model params the ``Llama`` constructor has no argument
  for (``use_extra_bufts``, ``no_alloc``, ``no_host``...);
* :class:`Model` (:mod:`.model`): facts and timing counters, composed of tokens and
  text (:mod:`.tokens`), decoding and sampling (:mod:`.decode`: a prompt slice, one
  token, one token for each of several sequences, whole sequences for embeddings; the
  sampler chain; the abort flag), sequence memory and state files (:mod:`.memory`);
* :class:`TensorOverrides` (:mod:`.overrides`): the C array of
  ``llama_model_tensor_buft_override`` (pattern, buffer type) the loader reads;
* :class:`LlamaLog` (:mod:`.log`): capture llama.cpp's log (every level, debug
  included) while keeping whatever logging was in place before;
* the memory API composed prompts need (:mod:`.composing`: shift, remove, states as bytes,
  decodes into any sequence with every token's logits, cells in use), and a reader of
  llama.cpp's serialised sequence state (:mod:`.state_format`);
* :func:`system_info`, :func:`devices` (:mod:`.build`): the build, for ``rag status``;
  :func:`supports_gpu_offload`, :func:`binding_version`.

No other module touches llama-cpp-python's private attributes (``_ctx``, ``_model``,
``_batch``); the test suite checks it.
"""

from .build import devices, system_info
from .decode import Aborted, AbortFlag, Sampler
from .loading import ModelLoadError, binding_version, load, supports_gpu_offload
from .log import (LOADING_SWITCH_SECONDS, LOG_CONT, LOG_DEBUG, LOG_ERROR, LOG_INFO, LOG_NONE, LOG_WARN, LlamaLog,
                  LogRecord)
from .model import Model, Timings, open_models
from .overrides import TensorOverrides, buffer_type, buffer_types

__all__ = ["Aborted", "AbortFlag", "LOADING_SWITCH_SECONDS", "LOG_CONT", "LOG_DEBUG", "LOG_ERROR", "LOG_INFO", "LOG_NONE", "LOG_WARN",
           "LlamaLog", "LogRecord", "Model", "ModelLoadError", "Sampler", "TensorOverrides", "Timings",
           "binding_version", "buffer_type", "buffer_types", "devices", "load", "open_models", "supports_gpu_offload",
           "system_info"]
