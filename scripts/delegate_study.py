#!/usr/bin/env python3
"""The delegation study's second table: what `hacpo study` leaves in each run's metrics.jsonl
that its results.md does not show (the team's calls, trajectory alignment, format failures).

    python3 scripts/delegate_study.py runs/tiny-delegate-study > docs/tiny-delegate-study/team.md

Per variant, mean ± std over seeds: held-out greedy F1 / EM / calls per question after training
(the last validation), and over the first and the last five steps of sampled episodes: F1, calls
per episode, the main agent's and the sub-agent's format failures, aligned sub-agent copies
duplicated and dropped, and masked slots (episodes that never delegated), per question group.
Standard library only.
"""

import json
import statistics
import sys
from pathlib import Path


def records(run):
    """The main agent's records (the team's metrics are written on every policy's record): the
    agent whose name ends in "main" (a study's `-per-role` copy, a `[[roles]]` name), else the
    run's one agent."""
    with open(run / "metrics.jsonl") as f:
        rs = [json.loads(line) for line in f if line.strip()]
    agents = list(dict.fromkeys(r.get("agent") for r in rs))
    main = next((a for a in agents if a and a.endswith("main")), agents[0] if agents else None)
    return [r for r in rs if r.get("agent") == main]


def window(rs, key, first):
    values = [r["data"][key] for r in rs if key in r["data"] and "timing_s/step" in r["data"]]
    part = values[:5] if first else values[-5:]
    return statistics.mean(part) if part else None


def last(rs, key):
    values = [r["data"][key] for r in rs if key in r["data"]]
    return values[-1] if values else None


def fmt(values, scale=1.0, digits=1):
    values = [v * scale for v in values if v is not None]
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def main():
    study = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/study")
    variants = sorted(p for p in study.iterdir() if p.is_dir())
    sampled = [
        ("F1 %", "delegate/f1", 100.0),
        ("calls", "delegate/calls_per_episode", 1.0),
        ("main format fail %", "delegate/main_format_fail", 100.0),
        ("sub format fail %", "delegate/sub_format_fail", 100.0),
        ("duplicated", "delegate/align_duplicates", 1.0),
        ("dropped", "delegate/align_dropped", 1.0),
        ("masked", "delegate/align_masked", 1.0),
    ]
    print("Held-out (greedy, after training) and sampled (first 5 steps → last 5 steps), mean ± std over seeds.")
    print()
    print("| variant | val F1 % | val EM % | val calls | " + " | ".join(n for n, _, _ in sampled) + " |")
    print("|---" * (4 + len(sampled)) + "|")
    for v in variants:
        runs = sorted(p for p in v.iterdir() if (p / "metrics.jsonl").exists())
        if not runs:
            continue
        rs = [records(r) for r in runs]
        row = [
            v.name,
            fmt([last(r, "val/f1") for r in rs], 100.0),
            fmt([last(r, "val/em") for r in rs], 100.0),
            fmt([last(r, "val/calls") for r in rs], 1.0, 2),
        ]
        for _, key, scale in sampled:
            digits = 1 if scale == 100.0 else 2
            row.append(
                f"{fmt([window(r, key, True) for r in rs], scale, digits)} → "
                f"{fmt([window(r, key, False) for r in rs], scale, digits)}"
            )
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
