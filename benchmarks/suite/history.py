"""The history file: one JSON record per suite run, appended, never rewritten."""

from __future__ import annotations

import json
from pathlib import Path


def portable(record: dict, repo: Path, home: Path) -> dict:
    """`record` with machine paths written relative: the repo as `.`, the home dir as `~`."""
    text = json.dumps(record)
    for path, short in ((str(repo) + "/", ""), (str(repo), "."), (str(home), "~")):
        text = text.replace(path, short)
    return json.loads(text)


def append_history(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def last_record(path: Path) -> dict:
    """The newest record of the history file; ValueError naming the file if there is none."""
    lines = [line for line in (path.read_text().splitlines() if path.exists() else [])
             if line.strip()]
    if not lines:
        raise ValueError(f"no run recorded in {path}")
    return json.loads(lines[-1])
