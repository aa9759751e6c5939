"""The secret scan of exported data, and the one redaction of secret settings.

Detection is Yelp's `detect-secrets` (its pattern plugins, run on strings), plus targeted patterns only
where it has no detector: Hugging Face tokens, OpenAI-style `sk-...` keys of the current formats (its
OpenAI plugin knows only the legacy `T3BlbkFJ` ones), AWS secret keys written unquoted (`KEY=value`
in an env file) and whole private-key blocks (its plugin matches the BEGIN line only).

Invariants: a redacted string holds none of the values any detector reported (each becomes
`[REDACTED:<detector>]`, a private key its whole block); Arrow columns are rewritten column-wise, only
the string fields named in `TEXT_FIELDS` are scanned, and every distinct string is scanned once.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# detect-secrets' pattern plugins. Entropy plugins are left out by default: checksums and commit ids fill tool
# outputs of coding agents, and redacting them would damage the data without protecting anything.
DEFAULT_DETECTORS = (
    "ArtifactoryDetector", "AWSKeyDetector", "AzureStorageKeyDetector", "BasicAuthDetector", "CloudantDetector",
    "DiscordBotTokenDetector", "GitHubTokenDetector", "GitLabTokenDetector", "IbmCloudIamDetector",
    "IbmCosHmacDetector", "JwtTokenDetector", "KeywordDetector", "MailchimpDetector", "NpmDetector",
    "OpenAIDetector", "PrivateKeyDetector", "PypiTokenDetector", "SendGridDetector", "SlackDetector",
    "SoftlayerDetector", "SquareOAuthDetector", "StripeDetector", "TelegramBotTokenDetector", "TwilioKeyDetector")
# Where detect-secrets has no detector (group 1, else the whole match, is the secret).
TARGETED = {
    "Hugging Face Token": re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}"),
    "OpenAI-style Key": re.compile(r"(?<![A-Za-z0-9_-])sk-(?:proj-|ant-|svcacct-|admin-)?(?=[A-Za-z0-9_-]*\d)"
                                   r"[A-Za-z0-9_-]{20,}"),
    "AWS Secret Key": re.compile(r"(?i)aws.{0,20}?(?:secret|key).{0,20}?[=:]\s*['\"]?([A-Za-z0-9/+]{40})"
                                 r"(?![A-Za-z0-9/+])"),
}
PRIVATE_BLOCK = re.compile(r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----.*?(-----END[A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----|\Z)"
                           r"|PuTTY-User-Key-File-2.*?(Private-MAC: *\S+|\Z)", re.S)
# String fields scanned in an Arrow column (role, ids and tool names are not free text): message text, and a
# hack flag's `command` / `detail` (what the agent ran).
TEXT_FIELDS = frozenset({"content", "arguments", "reasoning_content", "command", "detail"})
REDACTED = "[REDACTED]"
SEP = "\n\x00\n"  # between strings joined into one blob: no pattern matches across it
BLOB_CHARS = 4 << 20


def mark(detector: str) -> str:
    return f"[REDACTED:{detector}]"


def _plugins(names: Iterable[str]) -> list[Any]:
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

    by_name = {cls.__name__: cls for cls in get_mapping_from_secret_type_to_class().values()}
    unknown = sorted(set(names) - set(by_name))
    if unknown:
        raise ValueError(f"export.secrets.detectors: unknown detect-secrets plugin(s) {unknown}; "
                         f"choose from {sorted(by_name)}")
    return [by_name[n]() for n in names]


@dataclass
class Scanner:
    """Finds and redacts secrets in strings. `hits` counts findings per detector (across calls)."""

    detectors: list[str] | None = None
    hits: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._plugins = _plugins(self.detectors if self.detectors is not None else DEFAULT_DETECTORS)
        self._prefilter: str | None = None

    def find(self, text: str) -> list[tuple[str, str]]:
        """(detector, secret value) pairs in `text`, longest values first; a private key is its whole block."""
        return self.find_many(pa.array([text], pa.string()))

    def candidates(self, strings: pa.Array) -> pa.Array:
        """The strings that may hold a finding: one RE2 pass (Arrow's kernel) of every detector's pattern with its
        lookarounds dropped (a superset of what the exact patterns match). Exactness comes after, in `find_many`."""
        if self._prefilter is None:
            self._prefilter = _prefilter(self._plugins)
        return strings.filter(pc.match_substring_regex(strings, self._prefilter).fill_null(False))

    def find_many(self, strings: pa.Array) -> list[tuple[str, str]]:
        """The findings of many strings at once: pattern plugins run over joined blobs of them (one regex pass,
        not one per string), the keyword plugin only on strings holding one of its keywords (an RE2 test),
        private-key blocks only in strings that name one. Longest values first."""
        from detect_secrets.plugins.keyword import DENYLIST_REGEX, QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP

        found: dict[str, str] = {}
        keyed = [p for p in self._plugins if p.secret_type == "Secret Keyword"]
        plain = [p for p in self._plugins if p.secret_type not in ("Secret Keyword", "Private Key")]
        for blob in _blobs(strings):
            for plugin in plain:
                for value in plugin.analyze_string(blob):
                    found.setdefault(value, plugin.secret_type)
            for name, rx in TARGETED.items():
                for m in rx.finditer(blob):
                    found.setdefault(m.group(1) if rx.groups else m.group(0), name)
        if keyed:
            hint = pc.match_substring_regex(strings, DENYLIST_REGEX, ignore_case=True).fill_null(False)
            for text in strings.filter(hint).to_pylist():  # one by one: its patterns may span lines
                for rx, group in QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP.items():
                    for m in rx.finditer(text):
                        found.setdefault(m.group(group), "Secret Keyword")
        if any(p.secret_type == "Private Key" for p in self._plugins):
            named = pc.or_(pc.match_substring(strings, "PRIVATE KEY"), pc.match_substring(strings, "PuTTY-User-Key"))
            for text in strings.filter(named.fill_null(False)).to_pylist():
                for m in PRIVATE_BLOCK.finditer(text):
                    found[m.group(0)] = "Private Key"
        values = [(d, v) for v, d in found.items() if v and len(v) >= 4 and SEP not in v]
        return sorted(values, key=lambda x: -len(x[1]))

    def redact(self, text: str) -> tuple[str, list[str]]:
        """`text` with every finding replaced by its mark, and the detectors that fired (one per finding)."""
        text, found = self._redact(text)
        self.hits.update(found)
        return text, found

    def _redact(self, text: str) -> tuple[str, list[str]]:
        found, hit = self.find(text), []
        for detector, value in found:
            if value in text:  # (a shorter value inside a longer one is gone with it)
                text = text.replace(value, mark(detector))
                hit.append(detector)
        return text, hit

    # -- Arrow ------------------------------------------------------------------------------------------
    def redact_column(self, arr: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, dict[int, set[str]]]:
        """A nested column with its `TEXT_FIELDS` strings redacted, and {row: detectors} of the rows that had
        a secret."""
        arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
        flagged: dict[int, set[str]] = {}
        out = self._rewrite(arr, np.arange(len(arr)), flagged, scan=pa.types.is_string(arr.type))
        return out, flagged

    def redact_json_column(self, arr: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, dict[int, set[str]]]:
        """A column of JSON texts with every string value inside redacted (scanned decoded: JSON escaping of
        quotes would hide `key = "value"` from the keyword patterns), and {row: detectors}. A row without a
        finding keeps its text byte for byte."""
        import json

        texts = (arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr).to_pylist()
        docs = [json.loads(t) if t is not None else None for t in texts]
        leaves: list[str] = []
        starts = [0]
        for doc in docs:
            _walk(doc, leaves)
            starts.append(len(leaves))
        rows = np.repeat(np.arange(len(docs)), np.diff(starts))
        flagged: dict[int, set[str]] = {}
        new = self._redact_strings(pa.array(leaves, pa.large_string()), rows, flagged).to_pylist()
        for i in flagged:
            texts[i] = json.dumps(_rebuild(docs[i], new[starts[i]:starts[i + 1]]), ensure_ascii=False,
                                  separators=(",", ":"))
        return pa.array(texts, arr.type), flagged

    def redact_tree(self, obj: Any) -> Any:
        """A copy of a JSON-like value (dicts, lists, strings) with every string redacted; one vectorised
        pass over all its strings."""
        leaves: list[str] = []
        _walk(obj, leaves)
        if not leaves:
            return obj
        new = self._redact_strings(pa.array(leaves, pa.large_string()), np.zeros(len(leaves), dtype=np.int64), {})
        return _rebuild(obj, iter(new.to_pylist()))

    def _rewrite(self, arr: pa.Array, rows: np.ndarray, flagged: dict[int, set[str]], scan: bool) -> pa.Array:
        t = arr.type
        if pa.types.is_struct(t):
            children = [self._rewrite(pc.struct_field(arr, [i]), rows, flagged, scan=f.name in TEXT_FIELDS)
                        for i, f in enumerate(t)]
            return pa.StructArray.from_arrays(children, fields=list(t), mask=arr.is_null() if arr.null_count else None)
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            values = arr.flatten()
            if not _has_text(t.value_type) or not len(values):
                return arr
            child = self._rewrite(values, rows[pc.list_parent_indices(arr).to_numpy()], flagged, scan)
            offsets = pc.subtract(arr.offsets, arr.offsets[0])
            cls = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
            return cls.from_arrays(offsets, child, type=t, mask=arr.is_null() if arr.null_count else None)
        if scan and (pa.types.is_string(t) or pa.types.is_large_string(t)):
            return self._redact_strings(arr, rows, flagged)
        return arr

    def _redact_strings(self, arr: pa.Array, rows: np.ndarray, flagged: dict[int, set[str]]) -> pa.Array:
        """Vectorised: findings come from the distinct strings; each value is then located and replaced
        in the whole column by Arrow kernels (a longer value first, so a value inside it never splits it)."""
        for detector, value in self.find_many(self.candidates(pc.unique(arr).drop_null())):
            mask = pc.match_substring(arr, value).fill_null(False)
            idx = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
            if not len(idx):
                continue
            self.hits[detector] += len(idx)
            for r in rows[idx].tolist():
                flagged.setdefault(r, set()).add(detector)
            arr = pc.replace_substring(arr, value, mark(detector))
        return arr


_LOOKAROUND = ("(?<=", "(?<!", "(?=", "(?!")


def loosen(pattern: str) -> str:
    """`pattern` without its lookaround assertions and with bounded large repeats opened (`{50,1024}` ->
    `{50,}`): RE2 syntax, matching wherever the original matches (and more)."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith(_LOOKAROUND, i):
            depth, j, in_class = 0, i, False
            while j < len(pattern):
                c = pattern[j]
                if c == "\\":
                    j += 2
                    continue
                if in_class:
                    in_class = c != "]"
                elif c == "[":
                    in_class = True
                elif c == "(":
                    depth += 1
                elif c == ")":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            i = j + 1
            continue
        if pattern[i] == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        out.append(pattern[i])
        i += 1
    return re.sub(r"\{(\d+),(\d{4,})\}", r"{\1,}", "".join(out))


def _prefilter(plugins: list[Any]) -> str:
    """One RE2 alternation over every detector pattern (loosened), the keyword list and private-key markers."""
    from detect_secrets.plugins.keyword import DENYLIST_REGEX

    parts = ["PRIVATE KEY", "PuTTY-User-Key", f"(?i:{DENYLIST_REGEX})"]
    rxs = [rx for p in plugins if p.secret_type not in ("Secret Keyword", "Private Key")
           for rx in getattr(p, "denylist", ())] + list(TARGETED.values())
    for rx in rxs:
        text = rx.pattern.removeprefix("(?i)")
        parts.append(f"(?i:{loosen(text)})" if rx.flags & re.IGNORECASE else f"(?:{loosen(text)})")
    return "|".join(parts)


def _blobs(strings: pa.Array) -> Iterable[str]:
    """The strings joined by SEP, in pieces of about BLOB_CHARS characters."""
    piece: list[str] = []
    size = 0
    for text in strings.drop_null().to_pylist():
        piece.append(text)
        size += len(text)
        if size >= BLOB_CHARS:
            yield SEP.join(piece)
            piece, size = [], 0
    if piece:
        yield SEP.join(piece)


def marked_rows(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Per row of a nested column, whether one of its `TEXT_FIELDS` strings holds a redaction mark."""
    if isinstance(arr, pa.ChunkedArray):  # chunk by chunk (combining builds no JSON-typed child, even empty)
        return np.concatenate([marked_rows(c) for c in arr.chunks]) if arr.num_chunks else np.zeros(0, dtype=bool)
    out = np.zeros(len(arr), dtype=bool)

    def go(a: pa.Array, rows: np.ndarray, scan: bool) -> None:
        if isinstance(a, pa.ExtensionArray):  # JSON text: its storage
            a = a.storage
        t = a.type
        if pa.types.is_struct(t):
            for i, f in enumerate(t):
                go(pc.struct_field(a, [i]), rows, f.name in TEXT_FIELDS)
        elif (pa.types.is_list(t) or pa.types.is_large_list(t)) and _has_text(t.value_type):
            if not pc.sum(pc.list_value_length(a)).as_py():  # only null or empty lists: flattening them would
                return  # build an empty JSON-typed child, which pyarrow cannot ("MakeBuilder ... arrow.json")
            go(a.flatten(), rows[pc.list_parent_indices(a).to_numpy()], scan)
        elif scan and (pa.types.is_string(t) or pa.types.is_large_string(t)):
            hit = pc.match_substring(a, "[REDACTED:").fill_null(False).to_numpy(zero_copy_only=False)
            out[rows[hit]] = True
    go(arr, np.arange(len(arr)), pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type))
    return out


def _walk(obj: Any, out: list[str]) -> None:
    """Append the strings of a JSON-like value to `out`, depth first (the order `_rebuild` takes them back)."""
    if isinstance(obj, str):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _walk(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _walk(v, out)


def _rebuild(obj: Any, strings: Iterable[str]) -> Any:
    """`obj` with its strings replaced, in `_walk` order, by the next ones of `strings`."""
    it = iter(strings)

    def go(o: Any) -> Any:
        if isinstance(o, str):
            return next(it)
        if isinstance(o, dict):
            return {k: go(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [go(v) for v in o]
        return o
    return go(obj)


def _has_text(t: pa.DataType) -> bool:
    if isinstance(t, pa.ExtensionType):  # JSON text (exported tool-call arguments)
        t = t.storage_type
    if pa.types.is_struct(t):
        return any(_has_text(f.type) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_text(t.value_type)
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def scan_table(table: pa.Table, columns: Iterable[str], scanner: Scanner, action: str,
               key: str = "rollout_id") -> tuple[pa.Table, list[tuple[str, list[str]]], int]:
    """Redact `columns` of `table` (action `redact`) or drop their rows with a secret (`reject`); a `*_json`
    column is scanned decoded (`Scanner.redact_json_column`). Returns the table, the dropped rows as
    (key, detectors) and how many rows were redacted."""
    per_row: dict[int, set[str]] = {}
    for name in columns:
        redact = scanner.redact_json_column if name.endswith("_json") else scanner.redact_column
        col, hit = redact(table.column(name))
        table = table.set_column(table.schema.get_field_index(name), table.schema.field(name), col)
        for i, found in hit.items():
            per_row.setdefault(i, set()).update(found)
    if action == "redact" or not per_row:
        return table, [], len(per_row)
    keys = table.column(key).to_pylist()
    dropped = [(keys[i], sorted(per_row[i])) for i in sorted(per_row)]
    keep = np.ones(table.num_rows, dtype=bool)
    keep[sorted(per_row)] = False
    return table.filter(pa.array(keep)), dropped, 0


# -- settings ------------------------------------------------------------------------------------------
# A flag naming a secret, matched whole (`--api-key`, `--hf-token`, `--token`, `--db-password`): it ends in
# one of these words; not `--max-num-batched-tokens`, `--return-tokens-as-token-ids` or `--tokenizer`.
SECRET_FLAG = re.compile(r"(?i)^--?(?:[a-z0-9]+[-_])*(?:token|key|secret|password|passwd)$")


def redact_args(args: list[str]) -> list[str]:
    """Command-line arguments with the value of every secret-sounding flag (`--api-key X`, `--hf-token=X`)
    and every argument a detector flags replaced by `[REDACTED]`; other arguments are kept (they decide
    the data and stay reproducible)."""
    out, hide_next, scanner = [], False, _settings_scanner()
    for a in map(str, args):
        if hide_next and not a.startswith("-"):  # (a flag next: the secret flag had no value)
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        if a.startswith("-") and "=" in a and SECRET_FLAG.match(a.split("=", 1)[0]):
            out.append(a.split("=", 1)[0] + "=" + REDACTED)
        elif SECRET_FLAG.match(a):
            out.append(a)
            hide_next = True
        else:
            out.append(scanner.redact(a)[0])
    return out


def redact_settings(value: Any) -> Any:
    """A copy of a config (JSON-like) fit to store or log: the values of every `env` mapping redacted, every
    `extra_args` list through `redact_args`, and every other string through the scanner. The one helper
    build.json, the Prefect flow-run parameters and the vLLM log use."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "env" and isinstance(v, dict):
                out[k] = {name: REDACTED for name in v}
            elif k == "extra_args" and isinstance(v, list):
                out[k] = redact_args(v)
            else:
                out[k] = redact_settings(v)
        return out
    if isinstance(value, list):
        return [redact_settings(v) for v in value]
    if isinstance(value, str) and len(value) >= 16:
        return _settings_scanner().redact(value)[0]
    return value


_SETTINGS: list[Scanner] = []


def _settings_scanner() -> Scanner:
    if not _SETTINGS:
        _SETTINGS.append(Scanner([d for d in DEFAULT_DETECTORS if d != "KeywordDetector"]))
    return _SETTINGS[0]


# The real config of a build this process started, by the digest of what was shown for it: the Prefect flow
# is given the redacted config (its parameters are stored in Prefect's database) and takes the real one back.
_HELD: dict[str, dict[str, Any]] = {}


def _digest(config: dict[str, Any]) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def shown_config(config: dict[str, Any]) -> dict[str, Any]:
    """`redact_settings(config)`, remembered in this process so that `real_config` gives `config` back."""
    shown = redact_settings(config)
    if shown != config:
        _HELD[_digest(shown)] = config
    return shown


def real_config(config: dict[str, Any]) -> dict[str, Any]:
    """The config `shown_config` redacted in this process; any other config as it is (a deployment run
    elsewhere: redacted `env` values are then taken from that worker's environment, see vllm_server)."""
    return _HELD.get(_digest(config), config)
