"""Check a TextWorld run's committed steps against TextWorld itself (tests/it/textworld.rs).

Usage: textworld_check.py STEPS.csv DEMOS.csv CACHE_DIR
  STEPS.csv: spec, traj_id, step_idx, action, admissible, oracle_progress (every rollout step)
  DEMOS.csv: spec, purpose, episode, step_idx, action, planner, admissible, oracle_progress

Each game is made again here from its spec with TextWorld's own generator (a separate
directory, not rla-pipe's cache), and every episode is replayed action by action with TextWorld's
`EnvInfos`: the committed admissible actions must equal TextWorld's `admissible_commands` at that
state, and the committed oracle must equal TextWorld's plan rule (+1 when `policy_commands` got
shorter or the game was won, else -1). Planner-only episodes must end won. Every game made here
must equal, byte for byte, the one rla-pipe made (CACHE_DIR/games/*/, found by the `game`
digest of its spec): games are a function of their spec. Prints one JSON line of counts; exits 1
on the first mismatch.
"""
import csv
import json
import os
import sys
import tempfile
from collections import defaultdict

import textworld

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src", "env"))
import textworld_bridge as bridge  # noqa: E402  (the generator calls rla-pipe uses)

bridge.fixed_hash_seed()  # as the bridge runs

INFOS = textworld.EnvInfos(admissible_commands=True, policy_commands=True, won=True, lost=True)
games = {}
tmp = tempfile.mkdtemp(prefix="tw-check-")


made = {}  # rla-pipe's cached games by their digest


def game(spec_json):
    if spec_json not in games:
        d = os.path.join(tmp, str(len(games)))
        spec = json.loads(spec_json)
        bridge.make(spec, d)
        theirs = made.get(spec.get("game"))
        if theirs is None:
            sys.exit(f"no game in rla-pipe's cache has the digest of {spec_json}")
        for name in ("game.json", "game.z8"):
            with open(os.path.join(d, name), "rb") as a, open(os.path.join(theirs, name), "rb") as b:
                if a.read() != b.read():
                    sys.exit(f"{spec_json}: {name} made again differs from rla-pipe's {theirs}")
        games[spec_json] = os.path.join(d, "game.z8")
    return games[spec_json]


def replay(spec, steps, what):
    env = textworld.start(game(spec), request_infos=INFOS)
    state = env.reset()
    for s in steps:
        expected = sorted(set(state["admissible_commands"]))
        got = json.loads(s["admissible"])
        if got != expected:
            sys.exit(f"{what} step {s['step_idx']}: admissible {got} != TextWorld's {expected}")
        before = list(state["policy_commands"])
        state, _, _ = env.step(s["action"])
        oracle = 1 if state["won"] or len(state["policy_commands"]) < len(before) else -1
        if int(s["oracle_progress"]) != oracle:
            sys.exit(f"{what} step {s['step_idx']} ({s['action']!r}): oracle {s['oracle_progress']} != TextWorld's {oracle}")
    won = bool(state["won"])
    env.close()
    return won


def episodes(path, key):
    eps = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            eps[key(row)].append(row)
    for rows in eps.values():
        rows.sort(key=lambda r: int(r["step_idx"]))
    return eps


def main():
    steps_csv, demos_csv, cache = sys.argv[1], sys.argv[2], sys.argv[3]
    for d in os.listdir(os.path.join(cache, "games")):
        path = os.path.join(cache, "games", d)
        if os.path.exists(os.path.join(path, "digest")):
            with open(os.path.join(path, "digest")) as f:
                made[f.read().strip()] = path
    counts = {"trajectories": 0, "steps": 0, "won": 0, "planner_episodes": 0, "planner_won": 0,
              "demo_steps": 0}
    for (traj, spec), rows in sorted(episodes(steps_csv, lambda r: (r["traj_id"], r["spec"])).items()):
        counts["trajectories"] += 1
        counts["steps"] += len(rows)
        counts["won"] += replay(spec, rows, f"trajectory {traj}")
    for (purpose, ep, spec), rows in sorted(
            episodes(demos_csv, lambda r: (r["purpose"], r["episode"], r["spec"])).items()):
        counts["demo_steps"] += len(rows)
        won = replay(spec, rows, f"{purpose} demonstration {ep}")
        # The policy's demonstrations: the planner's whole episodes (the RM's last episode may be
        # all planner too, but is cut where its step budget ends).
        if purpose == "policy" and all(r["planner"] == "true" for r in rows):
            counts["planner_episodes"] += 1
            counts["planner_won"] += won
    counts["games"] = len(games)
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
