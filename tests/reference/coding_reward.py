"""Run the reference's coding reward code on an iteration rla-pipe committed.

    python3 coding_reward.py RLA_PIPE_BIN STORE RUN ITER WORKDIR

Reads the iteration's tables with `rla-pipe sql`, writes them in the format the reference's
`reward/llm_rl_reward.py` reads (the `temp_data/outputs-*.json` that its `reward/execute.py` and
`sample/llm_env_rollout.py` leave: per task the programs, the ground-truth and written tests and
the pass/fail matrices of every program against them), runs the vendored, unmodified script
(`open-agentrl/reward/llm_rl_reward.py`) as the reference runs it, and prints as JSON what it
computed:

- `policy`: every program of every task (task_id, traj_id, raw_reward: the pass fraction,
  reward: the z-scored advantage, trained: the reference put the task in its policy data);
- `rm`: every record of the reference's reward-model data (task_id, sample_idx, raw_reward,
  reward);
- `acc`: each task's pass-all share;
- `metrics`: the line it logs (GT-pass-all acc, syn_ut_acc, perfect_ut_rate and their
  denominators).

The task id is passed as the reference's `prompt` (which it carries through untouched) so that
its records can be traced back to rla-pipe's rows.
"""

import hashlib
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "open-agentrl", "reward", "llm_rl_reward.py")
# The git blob of reward/llm_rl_reward.py at Gen-Verse/Open-AgentRL 1fe5dbd (README.md there).
BLOB = "e0d599331f46a8277f7f29b04882c5cf58271fa9"


def unmodified():
    data = open(SCRIPT, "rb").read()
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    if blob != BLOB:
        sys.exit(f"{SCRIPT} is not the reference's file (git blob {blob}, expected {BLOB})")


def sql(bin_, store, run, query):
    out = subprocess.run(
        [bin_, "sql", "--quiet", "--store", store, "--run", run, "--format", "json", query],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        sys.exit(f"rla-pipe sql failed: {query}\n{out.stderr}")
    text = out.stdout.strip()
    return json.loads(text) if text else []


def outputs(bin_, store, run, it):
    """The reference's outputs file (one dict per task rolled out this iteration), the traj ids
    of each task's programs and the sample ids of its written tests, in the file's order."""
    q = lambda s: sql(bin_, store, run, s.replace("$ITER", str(it)))
    tasks = {r["task_id"]: r for r in q("SELECT task_id, status, spec FROM tasks WHERE iter = $ITER")}
    trajs = {}
    for r in q("SELECT task_id, traj_id, rollout_idx FROM trajectories WHERE iter = $ITER ORDER BY task_id, rollout_idx"):
        trajs.setdefault(r["task_id"], []).append(r["traj_id"])
    steps = {r["traj_id"]: r for r in q("SELECT traj_id, action, response FROM steps WHERE iter = $ITER")}
    runs = {
        (r["traj_id"], r["test_kind"], r["test_idx"]): r["passed"]
        for r in q("SELECT traj_id, test_kind, test_idx, passed FROM executions WHERE iter = $ITER")
    }
    truth = {}
    for r in q("SELECT DISTINCT task_id, test_idx FROM executions WHERE iter = $ITER AND test_kind = 'truth'"):
        truth.setdefault(r["task_id"], set()).add(r["test_idx"])
    tests = {}
    for r in q("SELECT task_id, sample_idx, valid, input, output FROM unit_tests WHERE iter = $ITER ORDER BY task_id, sample_idx"):
        tests.setdefault(r["task_id"], []).append(r)
    replies = {
        (r["task_id"], r["sample_idx"]): r["reasoning"]
        for r in q("SELECT task_id, sample_idx, reasoning FROM rm_samples WHERE iter = $ITER")
    }
    accepted = {r["task_id"]: r["decision"] == "accepted" for r in q("SELECT task_id, decision FROM judgements WHERE iter = $ITER")}

    data, samples = [], {}
    for task_id in sorted(trajs):
        task, ids = tasks[task_id], trajs[task_id]
        spec = json.loads(task["spec"])
        n_truth = len(spec["test_input"]) if "test_input" in spec else len(truth.get(task_id, ()))
        if truth.get(task_id, set()) - set(range(n_truth)):
            sys.exit(f"task {task_id}: ground-truth runs of tests it does not have")

        def passed(traj, kind, k):
            key = (traj, kind, k)
            if key not in runs:
                sys.exit(f"task {task_id}: no execution of {key}")
            return bool(runs[key])

        written = tests.get(task_id, [])
        samples[task_id] = [t["sample_idx"] for t in written]
        item = {
            "question": spec.get("question", spec.get("prompt", "")),
            "prompt": task_id,
            "full_output": [steps[t]["response"] or steps[t]["action"] for t in ids],
            "extracted_output": [steps[t]["action"] for t in ids],
            # reward/execute.py: [code][test] booleans; a test without input or output is the
            # reference's "Invalid Test" (False, not run: rla-pipe has no run of it either).
            "correctness": [[passed(t, "truth", k) for k in range(n_truth)] for t in ids],
            "syn_input": [u["input"] if u["valid"] else "" for u in written],
            "syn_output": [u["output"] if u["valid"] else "" for u in written],
            "syn_full_output": [replies.get((task_id, u["sample_idx"]), "") for u in written],
            "syn_prompt": ["" for _ in written],
            "syn_correctness": [
                [passed(t, "generated", u["sample_idx"]) if u["valid"] else False for u in written]
                for t in ids
            ],
            "source": "dataset",
        }
        if task["status"] == "pending":
            # A candidate judged this iteration: the reference's "temp" task with its verdict.
            item["source"] = "temp"
            item["temp_accept"] = accepted.get(task_id, False)
        data.append(item)
    return data, trajs, samples


def main():
    bin_, store, run, it, work = sys.argv[1:6]
    unmodified()
    data, trajs, samples = outputs(bin_, store, run, int(it))
    # The reference's layout: it runs from a directory beside ../<project>/temp_data.
    project, code = os.path.join(work, "proj"), os.path.join(work, "code")
    os.makedirs(os.path.join(project, "temp_data"), exist_ok=True)
    os.makedirs(code, exist_ok=True)
    name = "rl-rla-pipe-store"  # "rl-" + policy_model + "-" + train_dataset (llm_rl_reward.py:64)
    file = os.path.join(project, "temp_data", f"outputs-{name}.json")
    with open(file, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
    config = os.path.join(work, "config.yaml")
    with open(config, "w", encoding="utf-8") as f:
        f.write(
            "experiment:\n  project: proj\n  function: train\n  current_epoch: 1\n  num_node: 1\n  node_index: 0\n"
            "model:\n  policy_model: rla-pipe\n  optimized_name: optimized\n"
            "dataset:\n  train_dataset: store\n  optimization_data: rl_data\n  reward_optimization_data: reward_rl_data\n"
        )
    ran = subprocess.run([sys.executable, SCRIPT, f"config={config}"], cwd=code, capture_output=True, text=True)
    if ran.returncode != 0:
        sys.exit(f"the reference's llm_rl_reward.py failed:\n{ran.stdout}\n{ran.stderr}")

    read = lambda *p: json.load(open(os.path.join(project, *p), encoding="utf-8"))
    scored, policy_data, rm_data = read("temp_data", f"outputs-{name}.json"), read("temp_data", "rl_data.json"), read("temp_data", "reward_rl_data.json")
    trained = {}
    for r in policy_data:
        trained[r["prompt"]] = trained.get(r["prompt"], 0) + 1
    policy = []
    for item in scored:
        task_id = item["prompt"]
        if "rewards" not in item:
            continue  # a rejected candidate: the reference scores nothing of it
        if trained.get(task_id, 0) not in (0, len(item["rewards"])):
            sys.exit(f"task {task_id}: {trained[task_id]} of {len(item['rewards'])} programs in the policy data")
        for traj, raw, reward in zip(trajs[task_id], item["raw_policy_reward"], item["rewards"]):
            policy.append({"task_id": task_id, "traj_id": traj, "raw_reward": raw, "reward": reward, "trained": task_id in trained})
    rm = [
        {
            "task_id": r["evaluated_task_prompt"],
            "sample_idx": samples[r["evaluated_task_prompt"]][r["meta"]["k"]],
            "raw_reward": r["raw_reward"],
            "reward": r["reward"],
        }
        for r in rm_data
    ]
    line = open(os.path.join(project, "results", f"results-{name}.txt"), encoding="utf-8").read().splitlines()[-1]
    m = re.search(
        r"GT-pass-all acc: (\S+) .*syn_ut_acc: (\S+)  perfect_ut_rate: (\S+)  \(syn_ut_den_gt=(\d+), syn_ut_den_gt_ngt=(\d+)\)",
        line,
    )
    if not m:
        sys.exit(f"unexpected metrics line: {line}")
    metrics = {
        "acc": float(m[1]),
        "syn_ut_acc": float(m[2]),
        "perfect_ut_rate": float(m[3]),
        "syn_ut_den_gt": int(m[4]),
        "syn_ut_den_gt_ngt": int(m[5]),
    }
    acc = {item["prompt"]: item["acc"] for item in scored}
    json.dump({"policy": policy, "rm": rm, "acc": acc, "metrics": metrics}, sys.stdout)


if __name__ == "__main__":
    main()
