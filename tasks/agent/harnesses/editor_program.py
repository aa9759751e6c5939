"""The `str_replace_editor` tool's program, run INSIDE the sandbox as the agent (`python3 -I - ARGS`, its text
on stdin; tasks/agent/harnesses/swe.py): the host never touches the sandbox's files.

argv: `str_replace_editor COMMAND B64...`: the call's arguments as JSON, base64 in chunks (no model-supplied
byte reaches a shell or an argv unencoded), plus the host's `root` (the only tree it may touch) and, for
`undo_edit`, the content to restore (`restore`, base64; null: remove the file the undone edit created).
Prints one JSON object {"outcome", "text", "old", "path"} and exits with the outcome's code (`OUTCOMES`):
`old` is the file's content before a successful edit (base64; null: it did not exist), which the host keeps
as the undo history. Commands, argument names and answer texts are those of the widely used SWE scaffolds'
`str_replace_editor` (Anthropic's text editor tool, SWE-agent, OpenHands). Standard library only, Python 3.6+.
"""

import base64
import json
import os
import stat
import sys

OUTCOMES = {"ok": 0, "invalid_arguments": 2, "no_match": 3, "not_unique": 4, "missing_path": 5, "outside": 6,
            "binary": 7, "exists": 8, "no_history": 9, "is_directory": 10, "invalid_range": 11, "too_large": 12,
            "not_regular": 13, "os_error": 14}
COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")
MAX_RESPONSE_LEN = 16000
SNIPPET_LINES = 4
MAX_FILE_BYTES = 2 << 20
TRUNCATED = ("<response clipped><NOTE>To save on context only part of this file has been shown to you. You should "
             "retry this tool after you have searched inside the file with `grep -n` in order to find the line "
             "numbers of what you are looking for.</NOTE>")


class Refused(Exception):
    def __init__(self, outcome, text):
        Exception.__init__(self, text)
        self.outcome, self.text = outcome, text


def numbered(text, what, init_line=1):
    """`cat -n` of `text` (clipped), as the scaffolds show a file or a snippet."""
    if len(text) > MAX_RESPONSE_LEN:
        text = text[:MAX_RESPONSE_LEN] + TRUNCATED
    body = "\n".join("%6d\t%s" % (i + init_line, line) for i, line in enumerate(text.expandtabs().split("\n")))
    return "Here's the result of running `cat -n` on %s:\n%s\n" % (what, body)


def inside(real, root):
    return real == root or real.startswith(root.rstrip("/") + "/")


def checked(path, command, root):
    """The real path of `path`, refused the way the scaffolds refuse it (plus `outside` the root)."""
    if not path.startswith("/"):
        raise Refused("invalid_arguments", "The path %s is not an absolute path, it should start with `/`. Maybe "
                                           "you meant %s?" % (path, os.path.join(root, path)))
    real = os.path.realpath(path)
    if not inside(real, os.path.realpath(root)):
        raise Refused("outside", "The path %s is outside %s, the files this editor may touch. Use bash for "
                                 "anything else." % (path, root))
    exists = os.path.lexists(real)
    if not exists and command != "create":
        raise Refused("missing_path", "The path %s does not exist. Please provide a valid path." % path)
    if exists and command == "create":
        raise Refused("exists", "File already exists at: %s. Cannot overwrite files using command `create`." % path)
    if exists and os.path.isdir(real) and command != "view":
        raise Refused("is_directory", "The path %s is a directory and only the `view` command can be used on "
                                      "directories" % path)
    return real


def read_text(real, path):
    st = os.stat(real)
    if not stat.S_ISREG(st.st_mode):
        raise Refused("not_regular", "The path %s is not a regular file (a pipe, socket or device); the editor "
                                     "only reads regular text files." % path)
    if st.st_size > MAX_FILE_BYTES:
        raise Refused("too_large", "The file %s has %d bytes, more than the %d this editor handles. Use bash "
                                   "(e.g. `grep -n`, `sed -n`) instead." % (path, st.st_size, MAX_FILE_BYTES))
    with open(real, "rb") as f:
        data = f.read()
    try:
        if b"\0" in data[:8192]:
            raise ValueError
        return data, data.decode("utf-8")
    except ValueError:
        raise Refused("binary", "The path %s is a binary file; str_replace_editor only views and edits text "
                                "files. Use bash to inspect it." % path) from None


def write_text(real, text):
    with open(real, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def view_dir(real, path, view_range):
    if view_range:
        raise Refused("invalid_arguments", "The `view_range` parameter is not allowed when `path` points to a "
                                           "directory.")
    lines = [path]
    for name in sorted(os.listdir(real)):
        if name.startswith("."):
            continue
        lines.append(os.path.join(path, name))
        sub = os.path.join(real, name)
        if os.path.isdir(sub) and not os.path.islink(sub):
            lines += [os.path.join(path, name, n) for n in sorted(os.listdir(sub)) if not n.startswith(".")]
    return ("Here's the files and directories up to 2 levels deep in %s, excluding hidden items:\n%s\n"
            % (path, "\n".join(lines)))


def view(real, path, view_range):
    if os.path.isdir(real):
        return view_dir(real, path, view_range)
    _, text = read_text(real, path)
    init_line = 1
    if view_range is not None:
        if not (isinstance(view_range, list) and len(view_range) == 2
                and all(isinstance(i, int) and not isinstance(i, bool) for i in view_range)):
            raise Refused("invalid_range", "Invalid `view_range`. It should be a list of two integers.")
        lines = text.split("\n")
        n = len(lines)
        init_line, final_line = view_range
        if init_line < 1 or init_line > n:
            raise Refused("invalid_range", "Invalid `view_range`: %s. Its first element `%d` should be within the "
                                           "range of lines of the file: %s" % (view_range, init_line, [1, n]))
        if final_line > n:
            raise Refused("invalid_range", "Invalid `view_range`: %s. Its second element `%d` should be smaller than "
                                           "the number of lines in the file: `%d`" % (view_range, final_line, n))
        if final_line != -1 and final_line < init_line:
            raise Refused("invalid_range", "Invalid `view_range`: %s. Its second element `%d` should be larger or "
                                           "equal than its first `%d`" % (view_range, final_line, init_line))
        text = "\n".join(lines[init_line - 1:] if final_line == -1 else lines[init_line - 1:final_line])
    return numbered(text, path, init_line)


def str_replace(real, path, old_str, new_str):
    data, text = read_text(real, path)
    count = text.count(old_str) if old_str else 0
    if count == 0:
        raise Refused("no_match", "No replacement was performed, old_str `%s` did not appear verbatim in %s."
                                  % (old_str, path))
    if count > 1:
        starts, at = [], text.find(old_str)
        while at != -1:
            starts.append(text.count("\n", 0, at) + 1)
            at = text.find(old_str, at + 1)
        raise Refused("not_unique", "No replacement was performed. Multiple occurrences of old_str `%s` in lines "
                                    "%s. Please ensure it is unique" % (old_str, sorted(set(starts))))
    at = text.index(old_str)
    edited = text[:at] + new_str + text[at + len(old_str):]
    write_text(real, edited)
    line = text.count("\n", 0, at)
    start = max(0, line - SNIPPET_LINES)
    snippet = "\n".join(edited.split("\n")[start:line + SNIPPET_LINES + new_str.count("\n") + 1])
    return data, ("The file %s has been edited. " % path + numbered(snippet, "a snippet of %s" % path, start + 1)
                  + "Review the changes and make sure they are as expected. Edit the file again if necessary.")


def insert(real, path, insert_line, new_str):
    data, text = read_text(real, path)
    lines = text.split("\n")
    if not isinstance(insert_line, int) or isinstance(insert_line, bool) or not 0 <= insert_line <= len(lines):
        raise Refused("invalid_range", "Invalid `insert_line` parameter: %s. It should be within the range of lines "
                                       "of the file: %s" % (insert_line, [0, len(lines)]))
    new_lines = new_str.split("\n")
    write_text(real, "\n".join(lines[:insert_line] + new_lines + lines[insert_line:]))
    snippet = "\n".join(lines[max(0, insert_line - SNIPPET_LINES):insert_line] + new_lines
                        + lines[insert_line:insert_line + SNIPPET_LINES])
    return data, ("The file %s has been edited. " % path
                  + numbered(snippet, "a snippet of the edited file", max(1, insert_line - SNIPPET_LINES + 1))
                  + "Review the changes and make sure they are as expected (correct indentation, no duplicate "
                    "lines, etc). Edit the file again if necessary.")


def run(command, args):
    """(outcome, text, content before the edit or None, real path)."""
    root, path = args["root"], args["path"]
    real = checked(path, command, root)
    if command == "view":
        return "ok", view(real, path, args.get("view_range")), None, real
    if command == "create":
        os.makedirs(os.path.dirname(real), exist_ok=True)
        write_text(real, args["file_text"])
        return "ok", "File created successfully at: %s" % path, None, real
    if command == "str_replace":
        old, text = str_replace(real, path, args["old_str"], args.get("new_str") or "")
        return "ok", text, old, real
    if command == "insert":
        old, text = insert(real, path, args["insert_line"], args["new_str"])
        return "ok", text, old, real
    if "restore" not in args:  # undo_edit: the host's history says what to restore (null: remove), else nothing
        raise Refused("no_history", "No edit history found for %s." % path)
    restore = args["restore"]
    if restore is None:
        os.remove(real)
        return "ok", "Last edit to %s undone successfully. The file no longer exists." % path, None, real
    content = base64.b64decode(restore)
    with open(real, "wb") as f:
        f.write(content)
    return "ok", "Last edit to %s undone successfully. %s" % (
        path, numbered(content.decode("utf-8", "replace"), path)), None, real


def main(argv):
    command, args = argv[1], json.loads(base64.b64decode("".join(argv[2:])).decode("utf-8"))
    try:
        outcome, text, old, real = run(command, args)
    except Refused as why:
        outcome, text, old, real = why.outcome, why.text, None, None
    except OSError as err:
        outcome, text, old, real = "os_error", "Error: %s" % err, None, None
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")  # names that are not UTF-8: shown escaped
    print(json.dumps({"outcome": outcome, "text": text, "path": real,
                      "old": base64.b64encode(old).decode("ascii") if old is not None else None}))
    return OUTCOMES[outcome]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]) if sys.argv[1:2] == ["str_replace_editor"] else 2)
