"""rla-pipe's TextWorld bridge: JSON lines on stdin/stdout (src/env/external.rs's protocol plus
`make` and the `planner` field). rla-pipe starts and owns this process (src/env/textworld.rs
writes it next to its game cache and runs it with `env.textworld.python`).

| request | reply |
|---|---|
| `{"op":"make","spec":SPEC,"dir":DIR}` | `{"files":[...],"walkthrough":[...]}`: the game of SPEC written to DIR |
| `{"op":"reset","episode":E,"task":{"game":PATH,"max_steps":N,"budget_factor":F}}` | observation, admissible, max_steps, planner |
| `{"op":"step","episode":E,"action":A}` | observation, admissible, done, won, oracle_progress, planner |
| `{"op":"close","episode":E}` | `{}` |
| `{"op":"vocabulary"}` | `{"words":[...]}` |

One process serves many episodes at once (`episode`: an id rla-pipe picks; without one, episode
0), so a stage starts a few bridges, not one Python per running episode. Loaded games are kept
(the last GAMES_KEPT) and reset in place: loading a game costs ~0.2 s, a reset ~5 ms.

SPEC: `{"family":"custom","world_size":W,"nb_objects":O,"quest_length":Q,"seed":S}` or
`{"family":"cooking","recipe":R,"take":T,"go":G,"open":B,"cook":B,"cut":B,"drop":B,"seed":S}`.
The oracle is TextWorld's own: `policy_commands` (the remaining optimal plan) before and after a
step; +1 when the plan got shorter or the game was won, -1 otherwise. `planner` is the plan's
first command. Observations are cleaned as AlfWorld's wrappers do: no banner, no status bar or
prompt, no score messages.
"""
import itertools
import json
import os
import re
import sys

import textworld
import textworld.challenges
from textworld.generator import QuestGenerationError

INFOS = textworld.EnvInfos(admissible_commands=True, policy_commands=True, won=True, lost=True,
                           feedback=True, extras=["walkthrough"])

DROP = [
    re.compile(r"^\s*Your score has just gone (up|down) by .*$"),
    re.compile(r"^\s*\*\*\* The End \*\*\*\s*$"),
    re.compile(r"^\s*\*\*\* You lost! \*\*\*\s*$"),
    re.compile(r"^\s*You scored \d+ out of a possible \d+.*$"),
    re.compile(r"^\s*Would you like to RESTART.*$"),
    re.compile(r"^\s*>.*$"),  # the prompt, with the status bar after it
]

# The intro's ASCII-art "TEXT WORLD" banner: lines of nothing but these characters.
BANNER = re.compile(r"^[\s_|\\/$<>]+$")


def clean(text):
    """The feedback without TextWorld's banner, prompt, status bar and score messages."""
    lines = [ln.rstrip() for ln in text.split("\n")]
    lines = [ln for ln in lines if not any(p.match(ln) for p in DROP) and not BANNER.match(ln)]
    text = re.sub(r"\n{2,}", "\n", "\n".join(lines)).strip()
    return re.sub(r"[ \t]{2,}", " ", text)


def make(spec, out_dir):
    options = textworld.GameOptions()
    options.seeds = int(spec["seed"])
    os.makedirs(out_dir, exist_ok=True)
    options.path = os.path.join(os.path.abspath(out_dir), "game.z8")
    options.file_ext = ".z8"
    options.force_recompile = True
    family = spec.get("family")
    if family == "custom":
        options.nb_rooms = int(spec["world_size"])
        options.nb_objects = int(spec["nb_objects"])
        q = int(spec["quest_length"])
        options.chaining.min_length = q
        options.chaining.max_length = q
        options.chaining.max_depth = q
        _, game = textworld.make(options)
    elif family == "cooking":
        settings = {k: spec[k] for k in ("recipe", "take", "go", "open", "cook", "cut", "drop")}
        settings.update(recipe_seed=0, split="train")
        _, make_game, _ = textworld.challenges.CHALLENGES["tw-cooking"]
        game = make_game(settings=settings, options=options)
        textworld.generator.compile_game(game, options)
    else:
        raise ValueError(f"unknown game family {family!r} (custom or cooking)")
    # The story file's serial number (header bytes 0x12-0x17) is the compile date: a constant
    # instead makes the game's bytes a function of its spec and TextWorld's version alone (the
    # header is outside the checksummed part; nothing in play reads it).
    with open(options.path, "r+b") as f:
        f.seek(0x12)
        f.write(b"000000")
    files = sorted(f for f in os.listdir(out_dir) if f in ("game.z8", "game.json"))
    return {"files": files, "walkthrough": list(game.metadata.get("walkthrough") or [])}


GAMES_KEPT = 16
loaded = {}  # (game path, load number) -> [TextWorld environment, the episode using it or None], oldest first
LOADS = itertools.count()


def game_env(path, episode):
    """A loaded environment of the game at `path` that no other episode is using."""
    for key, (env, user) in list(loaded.items()):
        if key[0] == path and user is None:
            loaded[key][1] = episode
            return key
    if len(loaded) >= GAMES_KEPT:
        for key, (env, user) in list(loaded.items()):
            if user is None:
                env.close()
                del loaded[key]
                break
    key = (path, next(LOADS))
    loaded[key] = [textworld.start(path, request_infos=INFOS), episode]
    return key


class Session:
    def __init__(self, episode):
        self.episode = episode
        self.key = None
        self.env = None
        self.plan = []

    def close(self):
        if self.key is not None and self.key in loaded:
            loaded[self.key][1] = None
        self.key = self.env = None

    def reply(self, state, extra):
        admissible = sorted(set(state["admissible_commands"] or []))
        plan = list(state["policy_commands"] or [])
        out = {"observation": clean(state.feedback or ""), "admissible": admissible,
               "planner": plan[0] if plan and plan[0] in admissible else None}
        out.update(extra)
        return out

    def reset(self, task):
        self.close()
        path = task["game"]
        if not os.path.exists(os.path.splitext(path)[0] + ".json"):
            raise ValueError(f"{path}: the game's .json is not beside it (admissible commands would be missing)")
        self.key = game_env(path, self.episode)
        self.env = loaded[self.key][0]
        state = self.env.reset()
        if state["admissible_commands"] is None or state["policy_commands"] is None:
            raise ValueError(f"{path}: TextWorld gave no admissible commands or plan")
        self.plan = list(state["policy_commands"])
        walk = len(state["extra.walkthrough"] or self.plan)
        budget = int(task.get("max_steps", 50))
        factor = float(task.get("budget_factor", 0) or 0)
        if factor > 0:
            budget = max(1, min(budget, int(-(-factor * max(walk, 1) // 1))))
        return self.reply(state, {"max_steps": budget})

    def step(self, action):
        if self.env is None:
            raise ValueError("step before reset")
        before = self.plan
        state, _score, done = self.env.step(action)
        self.plan = list(state["policy_commands"] or [])
        won = bool(state["won"])
        progress = 1 if won or len(self.plan) < len(before) else -1
        return self.reply(state, {"done": bool(done or won or state["lost"]), "won": won,
                                  "oracle_progress": progress})


def vocabulary():
    words = set()
    data = os.path.join(os.path.dirname(textworld.__file__), "challenges", "tw_cooking", "data")
    roots = [os.path.join(os.path.dirname(textworld.__file__), "generator", "data"), data]
    for root in roots:
        for base, _, files in os.walk(root):
            for f in files:
                if f.endswith((".twg", ".json", ".txt")):
                    try:
                        text = open(os.path.join(base, f), encoding="utf-8").read()
                    except (OSError, UnicodeDecodeError):
                        continue
                    words.update(w.lower() for w in re.findall(r"[A-Za-z]+", text) if len(w) <= 20)
    words.update(["north", "south", "east", "west", "take", "drop", "put", "open", "close",
                  "insert", "examine", "look", "inventory", "go", "eat", "cook", "slice", "dice",
                  "chop", "unlock", "lock", "from", "into", "on", "with", "prepare", "meal"])
    return sorted(words)


def fixed_hash_seed():
    """Run this process again with Python's string hashing seeded 0, unless it already is.

    TextWorld's cooking generator iterates over sets of strings, so with Python's per-process
    hash seed one spec made twice gave two different games. A fixed seed makes every game a
    function of its spec alone (tests/envs/textworld_check.py makes each game of a run again in
    another process and compares the bytes). The seed is read only when the interpreter starts,
    hence the re-exec; call this before anything else.
    """
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable] + sys.argv)


def main():
    sessions = {}

    def session(req):
        e = req.get("episode", 0)
        if e not in sessions:
            sessions[e] = Session(e)
        return sessions[e]

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "make":
                out = make(req["spec"], req["dir"])
            elif op == "reset":
                out = session(req).reset(req["task"])
            elif op == "step":
                out = session(req).step(req["action"])
            elif op == "close":
                s = sessions.pop(req.get("episode", 0), None)
                if s is not None:
                    s.close()
                out = {}
            elif op == "vocabulary":
                out = {"words": vocabulary()}
            else:
                out = {"error": f"unknown op {op!r}"}
        except QuestGenerationError as e:
            out = {"error": f"no quest can be generated for this spec: {e}"}
        except Exception as e:  # noqa: BLE001 - every failure is a reply, never a dead process
            out = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    fixed_hash_seed()
    main()
