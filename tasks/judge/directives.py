"""Tool configuration on the answer surface, judged by its parts (issue 53, class 2).

A configuration file that programs obey (a repository's git config, an ini/toml/yaml settings file, a `.pth`,
shell start-up files, ignore and attribute files) may be a change the reference solution makes too: then the file
is an expected change, but not every directive in it is. An answer that keeps the reference's keys and adds
`format.pretty` to `.git/config` changes what the tests' own `git log` prints without rewriting a commit.

So such a file is read as directives (`keys`): with the format's own parser (`git config --file F --list
--no-includes` on this host; `configparser`; `tomllib`; `yaml.safe_load`), else line by line. The validator records
the reference's keys (`PathChange.directives`); an episode's file at that path with keys the reference does not
set has unexpected parts, and the counterfactual puts the file back with only the reference's keys (`strip`,
written by the same parser's writer: git itself, configparser, tomli-w, yaml). Values are the agent's: they are
its answer, and the tests judge them. A file whose format does not parse falls back to lines.

Invariant: `strip(path, data, allowed)` holds no key outside `allowed` as `keys` reads it, or it is None (the
file cannot be rewritten by parts: the counterfactual reverts the whole file).
"""

from __future__ import annotations

import configparser
import io
import os
import re
import shutil
import subprocess
import tempfile
import tomllib

import tomli_w
import yaml

GIT = re.compile(r"(^|/)\.git/config$|(^|/)\.gitconfig$|^/etc/gitconfig$|(^|/)\.config/git/config$|(^|/)\.gitmodules$")
TOML = re.compile(r"\.toml$")
YAML = re.compile(r"\.ya?ml$")
INI = re.compile(r"\.(ini|cfg|conf)$|(^|/)\.(coveragerc|pylintrc|flake8|pypirc|editorconfig)$")
LINES = re.compile(r"\.pth$|(^|/)\.(bashrc|bash_profile|profile|bash_login|zshrc|gitignore|gitattributes|mailmap|env|"
                   r"npmrc|curlrc|wgetrc|inputrc|netrc)$|^/etc/(profile|bash\.bashrc|environment)$|^/etc/profile\.d/"
                   r"|(^|/)\.git/info/(exclude|attributes)$|(^|/)\.[A-Za-z0-9_-]+rc$")
MAX_BYTES = 1 << 20  # a larger "config" file is judged whole (reverted in a counterfactual), never parsed
MAX_GIT_RECORDS = 2_000  # a counterfactual copy written by git itself, one call per directive
MAX_KEYS = 10_000  # more directives than this (a YAML alias bomb, a padded file): judged whole
UNREAD = "(the whole file: not readable as its format)"


def format_of(path: str) -> str | None:
    """The directive format of a path (`git`, `toml`, `yaml`, `ini`, `lines`), None when it is no config file."""
    for name, pattern in (("git", GIT), ("toml", TOML), ("yaml", YAML), ("ini", INI), ("lines", LINES)):
        if pattern.search(path):
            return name
    return None


# a value the tool runs instead of reading (git's `!command` aliases, a `|command` pager or path, a `$(...)` or a
# backquote): the same key holding a command is another directive than the key holding a value
RUNS = re.compile(r"^\s*[|!]|\$\(|`")
COMMAND = " (runs a command)"


# git keys whose value git always runs through a shell (a pager, an editor, a diff or merge driver, a filter, a
# helper): there the value is the command, so only the reference's own value is the reference's directive
GIT_COMMANDS = re.compile(r"^(?:core\.(?:pager|editor|sshcommand|fsmonitor|askpass)|sequence\.editor|diff\.external"
                          r"|diff\..+\.(?:command|textconv)|filter\..+\.(?:clean|smudge|process)|merge\..+\.driver"
                          r"|credential(?:\..+)?\.helper|gpg(?:\..+)?\.program|pager\..+|interactive\.difffilter)$")


def part(fmt: str, key: str, value: object) -> str:
    """The directive a record sets: its key, marked `COMMAND` when a keyed format's value is a command line, and for
    a git key whose value git always runs as a command (`GIT_COMMANDS`), the key with that value. The reference
    setting `color.ui = auto` allows the agent's `never`; its `alias.l = !git log` allows another command there; its
    `core.pager = less` allows only `less` (never `cat /tests/expected.txt; less`)."""
    if isinstance(value, tuple) and value:  # (what a writer needs: the value is the record's last part)
        value = value[-1]
    if isinstance(value, bytes):  # (git's values)
        value = value.decode("utf-8", "surrogateescape")
    if fmt == "git" and GIT_COMMANDS.match(key):
        return f"{key}={value}" if isinstance(value, str) else key + COMMAND
    if fmt in ("git", "ini", "toml", "yaml") and isinstance(value, str) and RUNS.search(value):
        return key + COMMAND
    return key


def keys(path: str, data: bytes) -> list[str] | None:
    """The directives of a config file at `path` holding `data` (`part`), sorted (a key set by several lines counts
    once); None when `path` is no config file or `data` is too large."""
    parsed = _records(path, data)
    return None if parsed is None else sorted({part(parsed[0], k, v) for k, v in parsed[1]})


def records(path: str, data: bytes) -> list[tuple[str, object]] | None:
    """The (key, value) records of a config file as its own parser reads them (git: bytes or None); None when
    `path` is no config file or it cannot be read by parts."""
    parsed = _records(path, data)
    return None if parsed is None else parsed[1]


def unexpected_keys(path: str, data: bytes, allowed: list[str] | None) -> list[str]:
    """The directives of the episode's file that the reference's file (`allowed`) does not set."""
    if allowed is None:
        return []
    have = keys(path, data)
    if have is None:  # too large, or git cannot read it: judged whole (fail closed; `strip` then gives None too)
        return [UNREAD]
    return sorted(set(have) - set(allowed))


def strip(path: str, data: bytes, allowed: list[str]) -> bytes | None:
    """`data` with only the directives in `allowed` (the agent's values kept); None when it cannot be rewritten
    by parts (then the whole file is reverted)."""
    parsed = _records(path, data)
    if parsed is None:
        return None
    fmt, records = parsed
    keep = set(allowed)
    out = _WRITERS[fmt]([(k, v) for k, v in records if part(fmt, k, v) in keep])
    if out is None:
        return None
    check = _records(path, out)  # the invariant, read back with the same parser
    if check is None or not {part(check[0], k, v) for k, v in check[1]} <= keep:
        return None
    return out


# --- parsers: (format, [(key, value)]) in file order; value is what the writer needs to write that directive back

def _records(path: str, data: bytes) -> tuple[str, list[tuple[str, object]]] | None:
    """(format, records) of a config file; None when it is no config file or cannot be read by parts (too large,
    too many directives, git cannot read it)."""
    try:
        return _read(path, data)
    except _TooMany:
        return None


def _read(path: str, data: bytes) -> tuple[str, list[tuple[str, object]]] | None:
    fmt = format_of(path)
    if fmt is None or len(data) > MAX_BYTES:
        return None
    if fmt == "git":
        got = _git(data)
        return ("git", got) if got is not None else None
    text = data.decode("utf-8", "surrogateescape")
    if fmt == "toml":
        try:
            return "toml", _flat(tomllib.loads(text))
        except (tomllib.TOMLDecodeError, UnicodeError):
            return "lines", _lines(text)
        except RecursionError:
            return None
    if fmt == "yaml":
        try:
            doc = yaml.safe_load(text)
            if isinstance(doc, dict):
                return "yaml", _flat(doc)
        except (yaml.YAMLError, RecursionError):  # (an alias that holds itself; an alias bomb: _TooMany)
            return None
        return "lines", _lines(text)
    if fmt == "ini":
        got = _ini(text)
        return ("ini", got) if got is not None else ("lines", _lines(text))
    return "lines", _lines(text)


def _git_binary() -> str | None:
    return shutil.which("git")


def _git_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null", "LC_ALL": "C"}


def _git(data: bytes) -> list[tuple[str, object]] | None:
    """git's own reading of a config file (no include followed): [(name, value or None)]; None without git on this
    host or when git cannot read it (a file git refuses breaks every git command the tests run: judged whole)."""
    git = _git_binary()
    if git is None:
        return None
    with tempfile.NamedTemporaryFile(prefix="tf-gitconfig-") as f:
        f.write(data)
        f.flush()
        try:
            res = subprocess.run([git, "config", "--file", f.name, "--no-includes", "--list", "-z"],
                                 capture_output=True, env=_git_env(), timeout=30)
        except subprocess.TimeoutExpired:
            return None
    if res.returncode != 0:
        return None
    out: list[tuple[str, object]] = []
    for rec in res.stdout.split(b"\0"):
        if not rec:
            continue
        name, nl, value = rec.partition(b"\n")
        out.append((name.decode("utf-8", "surrogateescape"), value if nl else None))
    return out


def _git_write(records: list[tuple[str, object]]) -> bytes | None:
    git = _git_binary()
    if git is None or len(records) > MAX_GIT_RECORDS:  # (one git per record)
        return None
    with tempfile.TemporaryDirectory(prefix="tf-gitconfig-") as d:
        target = os.path.join(d, "config")
        open(target, "wb").close()
        for name, value in records:
            # (a key without a value is a boolean true)
            argv = [git, "config", "--file", target, "--add", name, "true" if value is None else value]
            try:
                if subprocess.run(argv, capture_output=True, env=_git_env(), timeout=30).returncode != 0:
                    return None
            except subprocess.TimeoutExpired:
                return None
        with open(target, "rb") as f:
            return f.read()


_NO_DEFAULT = "\0"  # (every section, `DEFAULT` included, is read as its own: no key is inherited into another)


def _ini_parser() -> configparser.ConfigParser:
    cp = configparser.ConfigParser(interpolation=None, strict=False, allow_no_value=True, default_section=_NO_DEFAULT)
    cp.optionxform = str  # (names written back as the agent wrote them; compared lowercased, as configparser does)
    return cp


def _ini(text: str) -> list[tuple[str, object]] | None:
    cp = _ini_parser()
    try:
        cp.read_string(text)
    except (configparser.Error, UnicodeError):
        return None
    return [(f"{section}.{k.lower()}", (section, k, v)) for section in cp.sections() for k, v in cp[section].items()]


def _ini_write(records: list[tuple[str, object]]) -> bytes:
    cp = _ini_parser()
    for _, (section, name, value) in records:
        if not cp.has_section(section):
            cp.add_section(section)
        cp.set(section, name, value)
    buf = io.StringIO()
    cp.write(buf)
    return buf.getvalue().encode("utf-8", "surrogateescape")


class _TooMany(Exception):
    pass


def _flat(doc: dict, parts: tuple = (), out: list | None = None) -> list[tuple[str, object]]:
    """A mapping's leaves as dotted keys, each with (its path, its value) (a list is a leaf: one directive); past
    MAX_KEYS leaves `_TooMany` (an alias bomb expands here)."""
    out = [] if out is None else out
    for k, v in doc.items():
        here = (*parts, k)
        if isinstance(v, dict) and v:
            _flat(v, here, out)
        else:
            out.append((".".join(map(str, here)), (here, v)))
            if len(out) > MAX_KEYS:
                raise _TooMany()
    return out


def _nest(records: list[tuple[str, object]]) -> dict:
    doc: dict = {}
    for _, (parts, value) in records:
        node = doc
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return doc


_ASSIGN = re.compile(r"^(?:export\s+|declare\s+(?:-\S+\s+)*|readonly\s+|local\s+)?([A-Za-z_][A-Za-z0-9_]*)\+?=")
_ALIAS = re.compile(r"^alias\s+([^=\s]+)=")
_FUNC = re.compile(r"^(?:function\s+([^\s(){}]+)|([^\s(){}=]+)\s*\(\s*\))")
_KEYVAL = re.compile(r"^([A-Za-z0-9_.@/:-]+)\s*[=:]")


def _line_key(line: str) -> str | None:
    s = line.strip()
    if not s or s.startswith(("#", ";")):
        return None
    for pattern, label in ((_ASSIGN, "var "), (_ALIAS, "alias "), (_FUNC, "function ")):
        m = pattern.match(s)
        if m:
            return label + next(g for g in m.groups() if g)
    m = _KEYVAL.match(s)
    return "key " + m[1] if m else "line " + s


def _lines(text: str) -> list[tuple[str, object]]:
    out = [(k, line) for line in text.split("\n") if (k := _line_key(line)) is not None]
    if len(out) > MAX_KEYS:
        raise _TooMany()
    return out


def _lines_write(records: list[tuple[str, object]]) -> bytes:
    return "".join(f"{line}\n" for _, line in records).encode("utf-8", "surrogateescape")


def _toml_write(records: list[tuple[str, object]]) -> bytes | None:
    try:
        return tomli_w.dumps(_nest(records)).encode()
    except (TypeError, ValueError):
        return None


def _yaml_write(records: list[tuple[str, object]]) -> bytes:
    return yaml.safe_dump(_nest(records), sort_keys=False).encode()


_WRITERS = {"git": _git_write, "ini": _ini_write, "toml": _toml_write, "yaml": _yaml_write, "lines": _lines_write}
