#!/usr/bin/env python3
"""A tiny external environment for rla-pipe's protocol tests: walk right along a line to a target.

Speaks the JSON-lines protocol of src/env/external.rs on stdin/stdout. A task may ask for a fault
at a given step ("crash", "hang", "garbage", "error") so tests can check how the engine copes.
Standard library only.
"""
import json
import random
import sys
import time


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def observe(state):
    pos, target = state["pos"], state["task"]["target"]
    return f"at {pos} target {target}"


def main():
    state = None
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "generate":
            rng = random.Random(req["seed"])
            tasks = []
            for _ in range(req["count"]):
                start, target = rng.randint(0, 5), rng.randint(1, 4)
                tasks.append({"start": start, "target": start + target, "budget": 3 * target})
            reply({"tasks": tasks})
        elif op == "reset":
            state = {"task": req["task"], "pos": req["task"].get("start", 0), "steps": 0}
            reply({"observation": observe(state), "admissible": ["left", "right"], "max_steps": req["task"]["budget"]})
        elif op == "step":
            task = state["task"]
            state["steps"] += 1
            if task.get("fault") and state["steps"] == task.get("fault_step", 1):
                fault = task["fault"]
                if fault == "crash":
                    sys.stderr.write("line_env: simulated crash\n")
                    sys.stderr.flush()
                    sys.exit(3)
                if fault == "hang":
                    time.sleep(3600)
                if fault == "garbage":
                    sys.stdout.write("this is not json\n")
                    sys.stdout.flush()
                    continue
                if fault == "error":
                    reply({"error": "simulated failure"})
                    continue
                if fault == "huge":  # one 100 MB reply line
                    sys.stdout.write(json.dumps({"observation": "x" * 100_000_000}) + "\n")
                    sys.stdout.flush()
                    continue
                if fault == "endless":  # bytes without a newline, forever
                    while True:
                        sys.stdout.write("y" * 65536)
                        sys.stdout.flush()
                if fault == "flood":  # a reply, then lines nobody asked for, forever
                    reply({"observation": observe(state), "admissible": ["left", "right"], "done": False,
                           "won": False, "oracle_progress": None})
                    while True:
                        reply({"observation": "flood", "admissible": ["left"], "done": False, "won": False})
            before = task["target"] - state["pos"]
            state["pos"] += 1 if req["action"] == "right" else (-1 if state["pos"] > 0 else 0)
            after = task["target"] - state["pos"]
            won = state["pos"] == task["target"]
            done = won or state["steps"] >= task["budget"]
            reply({"observation": observe(state), "admissible": ["left", "right"], "done": done, "won": won,
                   "oracle_progress": 1 if after < before else -1})
        elif op == "mutate":
            t = dict(req["task"])
            t["target"] = t["target"] + (1 if req["direction"] == "harder" else -1)
            reply({"tasks": [t] if t["target"] > t.get("start", 0) else []})
        elif op == "vocabulary":
            reply({"words": ["at", "target", "left", "right"] + [str(i) for i in range(10)]})
        else:
            reply({"error": f"unknown op {op}"})


if __name__ == "__main__":
    main()
