"""Credentials kept out of what a run writes (issue 32, item 6).

A run's config is saved with its results (``summary.json``, every checkpoint's
``state.json``, a grid's result files), and a device farm's credentials live in it: in the
URL of an Appium hub (``https://user:key@hub.example.com/wd/hub``) and in capabilities
(``{"bstack:options": {"accessKey": ...}}``, ``{"lt:options": {"accessKey": ...}}``,
``"password"``, ``"token"``). :func:`redact` is the one function every writer passes such
data through. Its rules:

* **URL user info.** In every string, anywhere (values, list items, log messages naming a
  device), the user info of a URL is replaced: ``https://user:key@hub/wd/hub`` ->
  ``https://***@hub/wd/hub`` (scheme, host, port and path kept).
* **Secret query parameters.** In every string, a ``?name=value`` or ``&name=value`` whose
  name is a secret's (the next rule) keeps its name: ``?accessKey=abc`` -> ``?accessKey=***``.
* **Secret names.** A dict key is split into words (``accessKey`` -> access, key;
  ``browserstack.key`` -> browserstack, key; ``api_key`` -> api, key), and names a secret
  when any word is, or ends with, one of :data:`SECRET_WORDS` (``client_secret``,
  ``keystorePassword``, ``password_hash``), or its *last* word is, or ends with, one of
  :data:`SECRET_LAST_WORDS` (``accessKey``, ``apikey``, ``authToken``, ``basic_auth``).
  "key" and "token" must end the name because ML code uses them for other things
  (``eos_token_id``, ``num_key_value_heads``, ``token_ids``); ``max_tokens``,
  ``tokenizer``, ``keyboard`` and ``keyAlias`` are not secrets. Its value is replaced by
  :data:`REDACTED` whatever it holds (a string, a number, a nested dict or list), except:

  - None and booleans (nothing to hide: unset, or a switch), and "" (unset);
  - an integer under the bare name ``key``: the key code of the Android lifecycle's
    press-key command (``{"key": 3}`` in ``android.setup``), not a credential;
  - a name whose last word is ``env`` (``api_key_env``, ``tokenEnv``): it holds the *name*
    of the environment variable the secret is read from (``"GEMINI_API_KEY"``), which is
    what configs are meant to hold (:mod:`digirl_lite.envs.judges`), so it is kept.

Everything else is copied as it is, recursively through dicts, lists and tuples. The
function is idempotent (``redact(redact(x)) == redact(x)``), so a config read back from
disk compares equal to the redacted live config it came from: the trainer's resume compares
the two redacted, and a run never needs a secret from disk (it comes from the live config
or the environment).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["redact", "is_secret_name", "REDACTED", "SECRET_WORDS", "SECRET_LAST_WORDS"]

REDACTED = "***"
"""What a secret is replaced by."""
SECRET_WORDS = ("secret", "password", "passwd", "passphrase", "credential", "credentials",
                "authorization")
"""A dict key with any word that is, or ends with, one of these names a secret."""
SECRET_LAST_WORDS = ("key", "token", "auth")
"""A dict key whose last word is, or ends with, one of these names a secret."""

_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")  # camelCase, snake, dots
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s]*@")
_QUERY = re.compile(r"(?P<lead>[?&;](?P<name>[^=&;#?\s]+)=)(?P<value>[^&;#\s]*)")


def _words(name: str) -> list[str]:
    return [w.lower() for w in _WORDS.findall(name)]


def is_secret_name(name: str) -> bool:
    """Whether a dict key (a capability, an option, a config field) names a secret; see the
    module's rules. ``accessKey``, ``api_key``, ``browserstack.key``, ``password``,
    ``authToken``: yes; ``api_key_env``, ``max_tokens``, ``eos_token_id``, ``keyboard``:
    no."""
    words = _words(name)
    if not words or words[-1] == "env":  # the variable's name, not its value
        return False
    return (any(w.endswith(s) for w in words for s in SECRET_WORDS)
            or any(words[-1].endswith(s) for s in SECRET_LAST_WORDS))


def _redact_text(text: str) -> str:
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    return _QUERY.sub(lambda m: m["lead"] + (REDACTED if m["value"] and
                                             is_secret_name(m["name"]) else m["value"]), text)


def _keep_secret_value(name: str, value: Any) -> bool:
    if value is None or isinstance(value, bool) or value == "":
        return True
    return isinstance(value, int) and _words(name) == ["key"]  # {"key": 3}: a key code


def redact(obj: Any) -> Any:
    """A copy of ``obj`` (a config, a record, a string) with its credentials replaced by
    ``"***"``: URL user info and secret query parameters in every string, and the value of
    every dict key that names a secret (module docstring). Dicts, lists and tuples are
    copied recursively; other values are returned as they are."""
    if isinstance(obj, str):
        return _redact_text(obj)
    if isinstance(obj, Mapping):
        out = {}
        for k, v in obj.items():
            secret = isinstance(k, str) and is_secret_name(k)
            out[k] = REDACTED if secret and not _keep_secret_value(k, v) else redact(v)
        return out
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(redact(v) for v in obj)
    return obj
