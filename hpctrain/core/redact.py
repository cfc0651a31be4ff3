"""Secrets left out of what hpctrain writes for people to read: record.json's command line, sweep.json's
overrides, the report's reproduce command, TensorBoard's HParams, the checkpoint's copy of the config.

The rule is on names: a key is secret when its last dotted component, lower-cased, is or ends with one of
:data:`SECRET_ENDINGS` (``wandb.api_key``, ``hf_token``, ``HF_TOKEN``, ``db.password``,
``aws_secret_access_key``); ``max_tokens``, ``monkey`` or ``tokenizer`` are not. A value read from such an
environment variable (``${oc.env:HF_TOKEN}``), or from such a key (``${wandb.api_key}``), is secret too.

Shared by both wings: no torch, no Hydra; OmegaConf only inside :func:`redact_config`.
"""

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

REDACTED = "<redacted>"
SECRET_ENDINGS = ("api_key", "apikey", "token", "secret", "password", "passwd", "credentials", "credential",
                  "private_key", "access_key", "secret_key", "auth")
# a tokenizer's special tokens end like secrets but are vocabulary: shown as they are
NOT_SECRET = frozenset({"pad_token", "eos_token", "bos_token", "unk_token", "sep_token", "cls_token", "mask_token",
                        "start_token", "end_token"})
_ENV_REF = re.compile(r"oc\.env:\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)")
_NODE_REF = re.compile(r"\$\{\s*([A-Za-z_][\w.]*)\s*\}")  # ``${wandb.api_key}``: a plain node interpolation
# a secret key inside a dict value, ``env={HF_TOKEN: abc, X: 1}``: the key, then a quoted or plain value
_DICT_ITEM = re.compile(r"([{,]\s*)([A-Za-z_][\w.]*)(\s*:\s*)('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^,}\]]*)")


def is_secret_key(name: str) -> bool:
    """``wandb.api_key``, ``+hf_token``, ``HF_TOKEN``, ``api-key`` (a flag): True; ``max_tokens``, ``monkey``,
    ``key_dim``: False."""
    last = str(name).strip().lstrip("+~").split("@", 1)[0].rsplit(".", 1)[-1].lower().replace("-", "_")
    return last not in NOT_SECRET and any(last.endswith(ending) for ending in SECRET_ENDINGS)


def reads_secret(value: str) -> bool:
    """Whether a config string interpolates a secret environment variable or a secret key."""
    return any(is_secret_key(name) for name in _ENV_REF.findall(value) + _NODE_REF.findall(value))


def redact_override(override: str) -> str:
    """``+wandb.api_key=abc`` -> ``+wandb.api_key=<redacted>`` (a quoted or swept value too); a dict value's
    secret keys (``hydra.launcher.env={HF_TOKEN:abc}``); anything else unchanged."""
    key, sep, value = override.partition("=")
    if not sep:
        return override
    if is_secret_key(key):
        return f"{key}={REDACTED}"
    if value.lstrip().startswith("{"):
        return f"{key}={_redact_dict_items(value)}"
    return override


def _redact_dict_items(value: str) -> str:
    def item(m: "re.Match[str]") -> str:
        return m[1] + m[2] + m[3] + REDACTED if is_secret_key(m[2]) else m[0]

    return _DICT_ITEM.sub(item, value)


def redact_overrides(overrides: Sequence[str]) -> List[str]:
    """Each Hydra override with a secret key keeps its key and loses its value: the run's identity (its keys,
    its other values) stays readable."""
    return [redact_override(str(o)) for o in overrides]


def redact_argv(argv: Sequence[str]) -> List[str]:
    """A command line with secret values left out: overrides (``+hf_token=abc``), flags (``--token=abc``,
    ``--token abc``)."""
    out: List[str] = []
    hide_next = False
    for arg in map(str, argv):
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg.startswith("-") and not arg.startswith("--="):
            flag, sep, _ = arg.partition("=")
            secret = is_secret_key(flag.lstrip("-"))
            out.append(f"{flag}={REDACTED}" if secret and sep else arg)
            hide_next = secret and not sep
        else:
            out.append(redact_override(arg))
    return out


def redact_env(env: Mapping[str, str]) -> Dict[str, str]:
    """Environment variables with secret names keep their names only."""
    return {k: REDACTED if is_secret_key(k) else v for k, v in env.items()}


def redacted_keys(overrides: Sequence[str]) -> List[str]:
    """The keys (as written, ``+`` and ``~`` left off) whose values :func:`redact_overrides` leaves out."""
    keys = []
    for o in overrides:
        key, sep, _ = str(o).partition("=")
        if sep and is_secret_key(key):
            keys.append(key.strip().lstrip("+~").split("@", 1)[0])
    return keys


def secret_keys(job_overrides: Sequence[Sequence[str]]) -> List[str]:
    """The secret keys any point of a sweep sets: left out of run-dir names, so that a run's directory (its
    identity for a rerun) neither shows a secret nor changes when the secret does."""
    return list(dict.fromkeys(k for point in job_overrides for k in redacted_keys(point)))


def env_name(key: str) -> str:
    """The environment variable a secret key could be read from: ``wandb.api_key`` -> ``WANDB_API_KEY``."""
    return re.sub(r"\W", "_", key).upper()


def secret_hint(overrides: Sequence[str]) -> Optional[str]:
    """A shell comment for a command line whose secrets were left out: where to put them instead."""
    keys = redacted_keys(overrides)
    if not keys:
        return None
    first = keys[0]
    return (f"# {REDACTED}: secrets are not written down; set them in the job's environment, e.g. "
            f"export {env_name(first)}=... and pass +{first}='${{oc.env:{env_name(first)}}}'")


def redact_config(cfg: Any) -> Dict[str, Any]:
    """The resolved config as plain data, for copies the run keeps (checkpoint, TensorBoard hparams), with
    secrets left out: values of secret keys, and values read from secret environment variables
    (``${oc.env:HF_TOKEN}``) or secret keys (``${wandb.api_key}``)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(cfg, resolve=False)
    resolved = OmegaConf.to_container(cfg, resolve=True)

    def walk(r: Any, v: Any) -> Any:
        if isinstance(v, dict):
            return {k: REDACTED if is_secret_key(str(k)) else walk(r.get(k) if isinstance(r, dict) else None, x)
                    for k, x in v.items()}
        if isinstance(v, list):
            return [walk(r[i] if isinstance(r, list) and i < len(r) else None, x) for i, x in enumerate(v)]
        if isinstance(r, str) and reads_secret(r):
            return REDACTED
        return v

    return walk(raw, resolved)

