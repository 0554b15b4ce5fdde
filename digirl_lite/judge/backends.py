"""VLM backends for the paper's judge: Gemini (``google-genai``) and OpenAI-compatible chat.

A backend turns one multimodal prompt (a list of text pieces and PIL images) into a reply.
It makes exactly one request per call: retries and backoff belong to the judge
(:class:`digirl_lite.judge.PaperJudge`), so both clients run with their own retries off.

API keys are read from an environment variable whose *name* the backend keeps; the key itself
is never stored on the object, logged, put in a ``repr`` or written to a config/checkpoint.

Install with ``pip install 'digirl-lite[judge]'``.
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

__all__ = ["Backend", "BackendReply", "BackendError", "GeminiBackend", "OpenAIBackend",
           "BACKENDS", "make_backend", "png_bytes"]

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class BackendReply:
    text: str
    tokens: int | None = None


class BackendError(RuntimeError):
    """A failed request. ``retryable``: rate limits, server errors, timeouts, lost
    connections; not retryable: bad requests, authentication, a missing model."""

    def __init__(self, message: str, retryable: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status


@runtime_checkable
class Backend(Protocol):
    name: str

    def generate(self, parts: Sequence[str | Image.Image]) -> BackendReply: ...

    def config(self) -> dict[str, Any]: ...


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG")
    return buf.getvalue()


def _require(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"this judge backend needs {module!r}: pip install 'digirl-lite[judge]'") from e


def _read_key(env_var: str | None, who: str) -> str | None:
    if env_var is None:
        return None
    key = os.environ.get(env_var)
    if not key:
        raise RuntimeError(f"{who}: set the environment variable {env_var} to your API key "
                           "(the key is read from there and never stored)")
    return key


def _scrub(message: str, env_var: str | None) -> str:
    """Remove the API key from a message (a proxy may echo a request back)."""
    key = os.environ.get(env_var) if env_var else None
    return message.replace(key, "<redacted>") if key else message


class GeminiBackend:
    """Gemini through ``google-genai``.

    Args:
        model: model name (the paper used Gemini 1.5 Pro; nothing is hard-coded).
        api_key_env: name of the environment variable holding the key.
        base_url: another endpoint (a proxy, or a local test server).
        timeout_s: per-request timeout.
        temperature: sampling temperature of the judge (0: as deterministic as it gets).
    """

    name = "gemini"

    def __init__(self, model: str = "gemini-1.5-pro", api_key_env: str = "GEMINI_API_KEY",
                 base_url: str | None = None, timeout_s: float = 60.0,
                 temperature: float = 0.0) -> None:
        self.model = model
        self.api_key_env = api_key_env
        self.base_url = base_url
        self.timeout_s = timeout_s
        self.temperature = temperature
        self._client = None

    def __repr__(self) -> str:
        return f"GeminiBackend(model={self.model!r}, base_url={self.base_url!r})"

    def config(self) -> dict[str, Any]:
        return {"backend": self.name, "model": self.model, "api_key_env": self.api_key_env,
                "base_url": self.base_url, "timeout_s": self.timeout_s,
                "temperature": self.temperature}

    def _get_client(self):
        if self._client is None:
            genai = _require("google.genai")
            types = _require("google.genai.types")
            opts: dict[str, Any] = {"timeout": int(self.timeout_s * 1000),
                                    "retry_options": types.HttpRetryOptions(attempts=1)}
            if self.base_url:
                opts["base_url"] = self.base_url
            self._client = genai.Client(api_key=_read_key(self.api_key_env, repr(self)),
                                        http_options=types.HttpOptions(**opts))
        return self._client

    def generate(self, parts: Sequence[str | Image.Image]) -> BackendReply:
        types = _require("google.genai.types")
        errors = _require("google.genai.errors")
        client = self._get_client()
        contents = [p if isinstance(p, str) else
                    types.Part.from_bytes(data=png_bytes(p), mime_type="image/png")
                    for p in parts]
        try:
            resp = client.models.generate_content(
                model=self.model, contents=contents,
                config=types.GenerateContentConfig(temperature=self.temperature))
        except errors.APIError as e:
            code = getattr(e, "code", None)
            msg = _scrub(f"Gemini API error {code}: {getattr(e, 'message', '')}",
                         self.api_key_env)
            raise BackendError(msg[:300], retryable=code in RETRYABLE_STATUS or code is None,
                               status=code) from None
        except Exception as e:  # timeouts and lost connections surface as httpx errors
            msg = _scrub(f"Gemini request failed: {type(e).__name__}: {e}", self.api_key_env)
            raise BackendError(msg[:300], retryable=True) from None
        usage = getattr(resp, "usage_metadata", None)
        tokens = getattr(usage, "total_token_count", None) if usage is not None else None
        return BackendReply(text=resp.text or "", tokens=tokens)


class OpenAIBackend:
    """Any OpenAI-compatible chat endpoint with image input (OpenAI, vLLM, SGLang, ...).

    Args:
        model: the served model's name.
        base_url: the endpoint, e.g. ``http://127.0.0.1:8000/v1`` for a local vLLM.
        api_key_env: name of the environment variable holding the key; None for local
            servers that need none.
        timeout_s: per-request timeout.
        temperature: sampling temperature of the judge.
        max_tokens: reply budget (the three-line answer is short).
    """

    name = "openai"

    def __init__(self, model: str, base_url: str | None = None,
                 api_key_env: str | None = "OPENAI_API_KEY", timeout_s: float = 60.0,
                 temperature: float = 0.0, max_tokens: int = 512) -> None:
        self.model = model
        self.base_url = base_url
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.temperature = temperature
        self.max_tokens = max_tokens
        self._client = None

    def __repr__(self) -> str:
        return f"OpenAIBackend(model={self.model!r}, base_url={self.base_url!r})"

    def config(self) -> dict[str, Any]:
        return {"backend": self.name, "model": self.model, "api_key_env": self.api_key_env,
                "base_url": self.base_url, "timeout_s": self.timeout_s,
                "temperature": self.temperature, "max_tokens": self.max_tokens}

    def _get_client(self):
        if self._client is None:
            openai = _require("openai")
            key = _read_key(self.api_key_env, repr(self)) or "EMPTY"
            self._client = openai.OpenAI(api_key=key, base_url=self.base_url,
                                         timeout=self.timeout_s, max_retries=0)
        return self._client

    def generate(self, parts: Sequence[str | Image.Image]) -> BackendReply:
        openai = _require("openai")
        client = self._get_client()
        content = []
        for p in parts:
            if isinstance(p, str):
                content.append({"type": "text", "text": p})
            else:
                b64 = base64.b64encode(png_bytes(p)).decode("ascii")
                content.append({"type": "image_url",
                                "image_url": {"url": f"data:image/png;base64,{b64}"}})
        try:
            resp = client.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": content}],
                temperature=self.temperature, max_tokens=self.max_tokens)
        except openai.APIStatusError as e:
            said = _scrub(str(getattr(e, "message", "") or ""), self.api_key_env)
            raise BackendError(f"OpenAI-compatible API error {e.status_code}: {said}"[:300],
                               retryable=e.status_code in RETRYABLE_STATUS,
                               status=e.status_code) from None
        except (openai.APITimeoutError, openai.APIConnectionError) as e:
            raise BackendError(f"OpenAI-compatible request failed: {type(e).__name__}",
                               retryable=True) from None
        except Exception as e:  # a 200 whose body is not JSON, or not a chat completion
            raise BackendError(f"OpenAI-compatible reply unreadable: {type(e).__name__}",
                               retryable=True) from None
        try:
            text = resp.choices[0].message.content or ""
            usage = getattr(resp, "usage", None)
            tokens = getattr(usage, "total_tokens", None)
        except (AttributeError, IndexError, TypeError, KeyError):
            raise BackendError("OpenAI-compatible reply is not a chat completion",
                               retryable=True) from None
        return BackendReply(text=str(text), tokens=tokens)


BACKENDS = {"gemini": GeminiBackend, "openai": OpenAIBackend}


def make_backend(cfg: dict[str, Any]) -> Backend:
    """A backend from its config (what :meth:`config` returns, so configs round-trip)::

        make_backend({"backend": "gemini", "model": "gemini-1.5-pro"})
        make_backend({"backend": "openai", "model": "Qwen2-VL-7B",
                      "base_url": "http://127.0.0.1:8000/v1", "api_key_env": None})

    The one way every part of the library builds a backend (the judge's factory, the
    harness's prompted agent and LLM proposer). Nothing is requested and no key is read
    here: the client is made on the first request.

    Raises:
        ValueError: ``backend`` missing or not one of :data:`BACKENDS`, or a key the
            backend does not take (each named).
    """
    import inspect

    if not isinstance(cfg, dict):
        raise ValueError(f"a backend config is a dict {{\"backend\": \"gemini\" | \"openai\", "
                         f"...}}, got {type(cfg).__name__}")
    kw = dict(cfg)
    name = kw.pop("backend", None)
    if name not in BACKENDS:
        raise ValueError(f"backend config: field 'backend' is {name!r}, not one of "
                         f"{sorted(BACKENDS)}")
    cls = BACKENDS[name]
    known = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    bad = [k for k in kw if k not in known]
    if bad:
        raise ValueError(f"backend config ({name}): unknown field(s) {bad}; known: {known}")
    if name == "openai" and not kw.get("model"):
        raise ValueError("backend config (openai): field 'model' (the served model's name) "
                         "is required")
    return cls(**kw)
