"""Recover something from git history: `settings.env` once held an `API_TOKEN` that was rotated a few
times and then removed; the agent must write the last value it had (on a given branch) to
`recovered.txt`. The history is created at image build time by a setup script that deletes itself.

Knobs by level: commits (5 / 15 / 40), rotations of the token (1 / 3 / 5), distractor keys
(`API_TOKEN_OLD`, a token in another file), and at level 3 the token lives on a non-default branch
that was never merged (named in the instruction).
"""

from __future__ import annotations

import random
import string

from ....schemas.common import FileSpec
from .base import Draft, Family, tests_module

SOLUTION = r"""python3 - <<'PY'
import subprocess
branch = open('.task-branch').read().strip()
def git(*a):
    return subprocess.run(['git', *a], capture_output=True, text=True).stdout
value = None
for commit in git('rev-list', branch, '--', 'settings.env').split():
    for line in git('show', f'{commit}:settings.env').splitlines():
        if line.startswith('API_TOKEN='):
            value = line.split('=', 1)[1].strip()
            break
    if value:
        break
open('recovered.txt', 'w').write(value + '\n')
PY"""

TESTS = """
def test_recovered_file_exists():
    assert (W / "recovered.txt").is_file()

def test_recovered_value():
    assert (W / "recovered.txt").read_text().strip() == EXPECTED["token"]

def test_history_intact():
    # git runs as the agent: a repository the agent controlled is never read by a root git
    r = run_as_agent(["git", "rev-list", "--all", "--count"])
    assert r.stdout.strip().isdigit() and int(r.stdout) >= EXPECTED["commits"], r.stdout + r.stderr
"""


HOSTS = ["internal", "prod.lan", "svc.local", "corp.net", "dc2.example"]
FEATURES = ["beta-ui", "new-billing", "fast-search", "audit-log", "dark-mode", "sso", "exports"]
NOTES = ["bump pool size", "tighten timeouts", "switch region", "rotate certs", "enable tracing", "fix typo",
         "update hosts", "feature toggles", "cleanup", "review comments", "incident follow-up", "load test"]


def _token(rng: random.Random) -> str:
    return "tk_" + "".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(20))


class GitRecover(Family):
    name = "git_recover"
    description = "recover the last value of a token that was removed from a file, from the git history"

    def draft(self, level: int, rng: random.Random) -> Draft:
        n_commits, rotations = {1: (5, 1), 2: (15, 3), 3: (40, 5)}[level]
        branch = "main" if level < 3 else rng.choice(["release/2.4", "hotfix-billing", "ops/rotate"])
        script = ["set -e", "git init -q -b main .", "git config user.email ops@example.com",
                  "git config user.name ops", "export GIT_AUTHOR_DATE='2026-01-01T00:00:00Z'",
                  "export GIT_COMMITTER_DATE='2026-01-01T00:00:00Z'"]
        settings = {"APP_ENV": "production", "LOG_LEVEL": "info", "REGION": rng.choice(["eu-west-1", "us-east-2"])}

        def commit(msg: str, n: int) -> None:
            settings["DB_HOST"] = f"db-{rng.randint(1, 9)}.{rng.choice(HOSTS)}"
            settings["FEATURES"] = ",".join(sorted(rng.sample(FEATURES, rng.randint(1, 4))))
            body = "".join(f"{k}={v}\n" for k, v in settings.items())
            script.append(f"cat > settings.env <<'EOF'\n{body}EOF")
            script.append(f"echo '- {rng.choice(NOTES)} ({rng.randint(100, 999)})' >> NOTES.md")
            msg = f"{msg}: {rng.choice(NOTES)}"
            script.append(f"git add -A && GIT_AUTHOR_DATE='2026-01-01T00:{n // 60:02d}:{n % 60:02d}Z' "
                          f"GIT_COMMITTER_DATE='2026-01-01T00:{n // 60:02d}:{n % 60:02d}Z' git commit -q -m '{msg}'")

        # positions (commit numbers) where the token is set or rotated, then where it is removed
        main_len = n_commits if level < 3 else n_commits // 2
        sets = sorted(rng.sample(range(1, main_len - 2), rotations))
        removal = rng.randint(sets[-1] + 1, main_len - 1)
        token = None
        for n in range(main_len):
            if n in sets:
                token = _token(rng)
                settings["API_TOKEN"] = token
                if level >= 2 and rng.random() < 0.5:
                    settings["API_TOKEN_OLD"] = _token(rng)
                commit(f"rotate credentials ({n})", n)
            elif n == removal:
                settings.pop("API_TOKEN", None)
                commit("remove token from settings (moved to vault)", n)
            else:
                settings["LOG_LEVEL"] = rng.choice(["info", "debug", "warn"])
                commit(f"tune settings ({n})", n)
        expected = token
        if level == 3:  # the token on a side branch that was never merged; main's own token is a decoy
            script.append(f"git checkout -q -b '{branch}' HEAD~{rng.randint(1, 3)}")
            for n in range(main_len, n_commits):
                if n == main_len + 1 or rng.random() < 0.15:
                    expected = _token(rng)
                    settings["API_TOKEN"] = expected
                else:
                    settings["REGION"] = rng.choice(["eu-west-1", "us-east-2", "ap-south-1"])
                commit(f"branch work ({n})", n)
            script.append("git checkout -q main")
        if level >= 2:
            script.append(f"echo 'API_TOKEN={_token(rng)}' > legacy.env.example && git add -A && "
                          "git commit -q -m 'add example env'")
        script.append("git gc -q --prune=now")
        where = "on the default branch" if level < 3 else f"on the branch `{branch}` (it was never merged)"
        instruction = (
            f"`settings.env` in this git repository used to contain an `API_TOKEN` setting; it was rotated "
            f"and later removed. Find the last value `API_TOKEN` had in `settings.env` {where}, i.e. in the "
            "newest commit of that branch whose `settings.env` still sets it, and write just that value to "
            "`recovered.txt` in the work directory. Do not rewrite the history."
        )
        files = [FileSpec(path=".task-branch", content=branch + "\n")]
        return Draft(instruction, files, tests_module({"token": expected, "commits": n_commits}, TESTS), [SOLUTION],
                     {"commits": n_commits, "rotations": rotations, "branch": branch}, setup=script,
                     protected=[".task-branch"])
