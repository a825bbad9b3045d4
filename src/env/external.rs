//! External environments: a subprocess speaking JSON lines on stdin/stdout.
//!
//! One request per line, one reply per line (UTF-8 JSON objects):
//!
//! | request | reply |
//! |---|---|
//! | `{"op":"generate","seed":S,"count":N}` | `{"tasks":[SPEC, ...]}` |
//! | `{"op":"reset","task":SPEC}` | `{"observation":"...","admissible":["..."],"max_steps":N}` |
//! | `{"op":"step","action":"..."}` | `{"observation":"...","admissible":[...],"done":B,"won":B,"oracle_progress":1\|-1\|null}` |
//! | `{"op":"mutate","task":SPEC,"direction":"harder"\|"easier","high_risk_steps":[...],"critic":{...},"seed":S}` | `{"tasks":[SPEC, ...]}` |
//! | `{"op":"vocabulary"}` | `{"words":["..."]}` |
//!
//! A `reset` or `step` reply may also carry `"planner":"..."|null`: the environment's planner,
//! an admissible action on an optimal plan from the new state (what `pretrain` imitates).
//!
//! Any reply may instead be `{"error":"message"}`. A process serves one episode at a time
//! (`reset`, then `step`s) and is reused for the next one; processes are started on demand, one
//! per concurrent episode. Every call has a timeout (`env.external.timeout_secs`): a process that
//! crashes, hangs, or prints something that is not a JSON object is killed and the call fails
//! with an error naming what was asked (the rollout stage adds the task, rollout and step).
//! `oracle_progress` is optional; without it `rm_process_acc` stays null.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::contract::{CriticSummary, Direction, Environment, Episode, Observation, Step};
use crate::error::{Checks, Error, Result};

/// `[env.external]`: an environment served by a subprocess speaking JSON lines.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExternalConfig {
    /// Name of the environment (part of every task id).
    pub name: String,
    /// Program and arguments, e.g. ["python3", "envs/textworld_env.py"].
    pub command: Vec<String>,
    /// Seconds each call may take before the process is killed and the call fails.
    pub timeout_secs: f64,
    /// Longest reply line accepted (bytes); a longer one kills the process and fails the call.
    pub max_line_bytes: u64,
}

impl Default for ExternalConfig {
    fn default() -> Self {
        ExternalConfig {
            name: "external".into(),
            command: Vec::new(),
            timeout_secs: 10.0,
            max_line_bytes: 16 << 20,
        }
    }
}

impl ExternalConfig {
    /// The section's own checks; `selected`: the config runs this environment.
    pub fn validate(&self, selected: bool, c: &mut Checks) {
        c.check(
            !selected || !self.command.is_empty(),
            "env.external.command",
            "must name the program to run, e.g. [\"python3\", \"my_env.py\"]",
        );
        c.check(
            self.timeout_secs > 0.0 && self.timeout_secs <= 3600.0,
            "env.external.timeout_secs",
            "must be in (0, 3600]",
        );
        c.check(
            (1 << 10..=1 << 30).contains(&self.max_line_bytes),
            "env.external.max_line_bytes",
            "must be in [1024, 2^30]",
        );
    }
}

/// A running environment process (the textworld bridge multiplexes episodes over a few).
pub(crate) struct Process {
    child: Child,
    stdin: ChildStdin,
    /// Reply lines, one at a time (a bounded channel: a process that floods stdout blocks on its
    /// full pipe instead of filling memory), or why reading stopped.
    lines: Receiver<std::result::Result<String, String>>,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Process {
    pub(crate) fn spawn(cfg: &ExternalConfig) -> Result<Process> {
        let (program, args) = cfg
            .command
            .split_first()
            .ok_or_else(|| Error::config("key `env.external.command`: empty command"))?;
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                Error::Environment(format!("cannot start {:?}: {e}", cfg.command.join(" ")))
            })?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stderr_pipe = child.stderr.take().expect("piped stderr");
        let (tx, lines) = sync_channel(1);
        let max = cfg.max_line_bytes;
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let mut buf = Vec::new();
                let line = match (&mut reader).take(max + 1).read_until(b'\n', &mut buf) {
                    Ok(0) => break,
                    Ok(_) if buf.len() as u64 > max => Err(format!(
                        "the environment wrote a line longer than {max} bytes (env.external.max_line_bytes)"
                    )),
                    Ok(_) => {
                        while matches!(buf.last(), Some(b'\n' | b'\r')) {
                            buf.pop();
                        }
                        String::from_utf8(buf).map_err(|e| {
                            format!("the environment wrote a line that is not UTF-8 ({e})")
                        })
                    }
                    Err(e) => Err(format!("cannot read the environment's reply: {e}")),
                };
                let stop = line.is_err();
                if tx.send(line).is_err() || stop {
                    break;
                }
            }
        });
        // Keep the last 2 KiB of stderr for error messages.
        let stderr = Arc::new(Mutex::new(String::new()));
        let tail = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 1024];
            while let Ok(n) = stderr_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut t = tail.lock().expect("stderr lock");
                t.push_str(&String::from_utf8_lossy(&buf[..n]));
                if t.len() > 2048 {
                    let cut = t.len() - 2048;
                    let cut = (cut..t.len())
                        .find(|i| t.is_char_boundary(*i))
                        .unwrap_or(t.len());
                    t.drain(..cut);
                }
            }
        });
        Ok(Process {
            child,
            stdin,
            lines,
            stderr,
        })
    }

    /// Whether the process still runs (an error reply leaves it running; a protocol error
    /// killed it).
    pub(crate) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn stderr_tail(&self) -> String {
        let t = self.stderr.lock().expect("stderr lock");
        stderr_summary(t.trim())
    }

    /// Send one request and wait for its reply.
    pub(crate) fn call(&mut self, request: &Value, timeout: Duration) -> Result<Value> {
        let op = request["op"].as_str().unwrap_or("?").to_string();
        // One reply per request: anything already waiting was never asked for.
        match self.lines.try_recv() {
            Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => {}
            Ok(extra) => {
                let _ = self.child.kill();
                let shown: String = extra.unwrap_or_else(|e| e).chars().take(200).collect();
                return Err(Error::Environment(format!(
                    "`{op}`: before this request the environment wrote a line nobody asked for (one reply per request; process killed): {shown:?}"
                )));
            }
        }
        let sent = writeln!(self.stdin, "{request}").and_then(|_| self.stdin.flush());
        if sent.is_err() {
            return Err(self.died(&op));
        }
        match self.lines.recv_timeout(timeout) {
            Ok(Ok(line)) => {
                let reply: Value = serde_json::from_str(&line).map_err(|e| {
                    let shown: String = line.chars().take(200).collect();
                    Error::Environment(format!("`{op}`: the environment replied with something that is not JSON ({e}): {shown:?}"))
                })?;
                if !reply.is_object() {
                    return Err(Error::Environment(format!(
                        "`{op}`: the reply is not a JSON object: {reply}"
                    )));
                }
                if let Some(msg) = reply.get("error") {
                    return Err(Error::Environment(format!(
                        "`{op}`: the environment reported an error: {}",
                        msg.as_str().map_or_else(|| msg.to_string(), str::to_string)
                    )));
                }
                Ok(reply)
            }
            Ok(Err(e)) => {
                let _ = self.child.kill();
                Err(Error::Environment(format!("`{op}`: {e} (process killed)")))
            }
            Err(RecvTimeoutError::Timeout) => {
                let _ = self.child.kill();
                Err(Error::Environment(format!(
                    "`{op}`: the environment did not reply within {:.1} s (process killed){}",
                    timeout.as_secs_f64(),
                    self.stderr_tail()
                )))
            }
            Err(RecvTimeoutError::Disconnected) => Err(self.died(&op)),
        }
    }

    fn died(&mut self, op: &str) -> Error {
        // Give the stderr reader a moment to collect the last words.
        std::thread::sleep(Duration::from_millis(50));
        let status = self
            .child
            .wait()
            .map(|s| s.to_string())
            .unwrap_or_else(|e| e.to_string());
        Error::Environment(format!(
            "`{op}`: the environment process exited ({status}){}",
            self.stderr_tail()
        ))
    }
}

/// What an error says of a process's last stderr: the text, or of a Python traceback only its
/// last line (the exception) and the frame that raised it. The whole text goes to the log
/// (`-v`), for whoever asks for it.
fn stderr_summary(t: &str) -> String {
    if t.is_empty() {
        return String::new();
    }
    let Some(start) = t.rfind("Traceback (most recent call last):") else {
        return format!("; its stderr ends with: {t}");
    };
    tracing::info!(stderr = t, "the environment process's stderr");
    let trace: Vec<&str> = t[start..].lines().collect();
    let frame = trace
        .iter()
        .rev()
        .find(|l| l.trim_start().starts_with("File "))
        .map(|l| format!(" ({})", l.trim()))
        .unwrap_or_default();
    let exception = trace
        .iter()
        .rev()
        .find(|l| !l.trim().is_empty() && !l.starts_with(' '))
        .map_or("", |l| l.trim());
    format!("; it raised {exception}{frame} (the whole traceback: -v)")
}

/// Idle processes, shared with the episodes that borrow them.
type Pool = Arc<Mutex<Vec<Process>>>;

/// An environment served by a subprocess.
pub struct External {
    cfg: ExternalConfig,
    pool: Pool,
}

impl External {
    pub fn new(cfg: ExternalConfig) -> External {
        External {
            cfg,
            pool: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.cfg.timeout_secs)
    }

    fn take(&self) -> Result<Process> {
        match self.pool.lock().expect("pool lock").pop() {
            Some(p) => Ok(p),
            None => Process::spawn(&self.cfg),
        }
    }

    /// A call on a pooled process; the process goes back to the pool only if the call succeeded.
    fn call(&self, request: Value) -> Result<Value> {
        let mut p = self.take()?;
        let reply = p.call(&request, self.timeout())?;
        self.pool.lock().expect("pool lock").push(p);
        Ok(reply)
    }
}

fn field<'a>(reply: &'a Value, key: &str, op: &str) -> Result<&'a Value> {
    reply
        .get(key)
        .ok_or_else(|| Error::Environment(format!("`{op}`: the reply has no `{key}`: {reply}")))
}

fn specs(reply: &Value, op: &str) -> Result<Vec<Value>> {
    field(reply, "tasks", op)?
        .as_array()
        .cloned()
        .ok_or_else(|| Error::Environment(format!("`{op}`: `tasks` is not an array")))
}

fn observation(reply: &Value, op: &str) -> Result<Observation> {
    let text = field(reply, "observation", op)?
        .as_str()
        .ok_or_else(|| Error::Environment(format!("`{op}`: `observation` is not a string")))?
        .to_string();
    let admissible = field(reply, "admissible", op)?
        .as_array()
        .and_then(|a| {
            a.iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
        })
        .ok_or_else(|| {
            Error::Environment(format!("`{op}`: `admissible` is not an array of strings"))
        })?;
    Ok(Observation { text, admissible })
}

impl Environment for External {
    fn name(&self) -> &str {
        &self.cfg.name
    }

    fn generate(&self, seed: u64, count: u32) -> Result<Vec<Value>> {
        let tasks = specs(
            &self.call(json!({"op": "generate", "seed": seed, "count": count}))?,
            "generate",
        )?;
        if tasks.len() != count as usize {
            return Err(Error::Environment(format!(
                "`generate`: asked for {count} tasks, got {}",
                tasks.len()
            )));
        }
        Ok(tasks)
    }

    fn reset(&self, spec: &Value) -> Result<Box<dyn Episode>> {
        let mut process = self.take()?;
        let reply = process.call(&json!({"op": "reset", "task": spec}), self.timeout())?;
        Ok(Box::new(ExternalEpisode {
            process: Some(process),
            pool: self.pool.clone(),
            timeout: self.timeout(),
            shown: Shown::from_reset(&reply)?,
        }))
    }

    fn mutate(
        &self,
        spec: &Value,
        direction: Direction,
        critic: &CriticSummary,
        seed: u64,
    ) -> Result<Vec<Value>> {
        let direction = match direction {
            Direction::Harder => "harder",
            Direction::Easier => "easier",
        };
        let request = json!({"op": "mutate", "task": spec, "direction": direction, "high_risk_steps": critic.high_risk_steps, "critic": critic, "seed": seed});
        specs(&self.call(request)?, "mutate")
    }

    fn vocabulary(&self) -> Vec<String> {
        self.call(json!({"op": "vocabulary"}))
            .ok()
            .and_then(|r| r.get("words").and_then(Value::as_array).cloned())
            .map(|w| {
                w.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }
}

struct ExternalEpisode {
    process: Option<Process>,
    pool: Pool,
    timeout: Duration,
    shown: Shown,
}

/// What an episode of a JSON-lines environment shows, as its last `reset` / `step` reply said:
/// the observation, the step budget and the planner's next action (when it has a planner).
pub(crate) struct Shown {
    pub(crate) obs: Observation,
    pub(crate) max_steps: u32,
    pub(crate) planner: Option<String>,
}

impl Shown {
    /// A `reset` reply.
    pub(crate) fn from_reset(reply: &Value) -> Result<Shown> {
        let max_steps = field(reply, "max_steps", "reset")?
            .as_u64()
            .filter(|n| *n >= 1)
            .ok_or_else(|| {
                Error::Environment("`reset`: `max_steps` must be a positive integer".into())
            })?;
        Ok(Shown {
            obs: observation(reply, "reset")?,
            max_steps: max_steps.min(u64::from(u32::MAX)) as u32,
            planner: planner(reply, "reset")?,
        })
    }

    /// An action outside the observation's admissible set is an error.
    pub(crate) fn admissible(&self, action: &str) -> Result<()> {
        if self.obs.admissible.iter().any(|a| a == action) {
            Ok(())
        } else {
            Err(Error::Environment(format!(
                "inadmissible action {action:?}"
            )))
        }
    }

    /// A `step` reply: the new observation and planner are shown, the step returned.
    pub(crate) fn apply_step(&mut self, reply: &Value) -> Result<Step> {
        let flag = |k: &str| -> Result<bool> {
            field(reply, k, "step")?
                .as_bool()
                .ok_or_else(|| Error::Environment(format!("`step`: `{k}` is not a boolean")))
        };
        let (done, won) = (flag("done")?, flag("won")?);
        let oracle_progress = match reply.get("oracle_progress") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_i64() {
                Some(1) => Some(1),
                Some(-1) => Some(-1),
                _ => {
                    return Err(Error::Environment(format!(
                        "`step`: `oracle_progress` must be 1, -1 or null, not {v}"
                    )));
                }
            },
        };
        let (obs, next) = (observation(reply, "step")?, planner(reply, "step")?);
        self.obs = obs;
        self.planner = next;
        Ok(Step {
            done,
            won,
            oracle_progress,
        })
    }
}

/// A reply's optional `planner`: an admissible action, or null.
fn planner(reply: &Value, op: &str) -> Result<Option<String>> {
    match reply.get("planner") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(a)) => Ok(Some(a.clone())),
        Some(v) => Err(Error::Environment(format!(
            "`{op}`: `planner` must be a string or null, not {v}"
        ))),
    }
}

impl Drop for ExternalEpisode {
    /// A process that answered every call serves the next episode (its `reset` starts over); one
    /// that failed was dropped (killed) already.
    fn drop(&mut self) {
        if let Some(p) = self.process.take() {
            self.pool.lock().expect("pool lock").push(p);
        }
    }
}

impl Episode for ExternalEpisode {
    fn observation(&self) -> &Observation {
        &self.shown.obs
    }

    fn max_steps(&self) -> u32 {
        self.shown.max_steps
    }

    fn oracle_action(&self) -> Option<String> {
        self.shown.planner.clone()
    }

    fn step(&mut self, action: &str) -> Result<Step> {
        self.shown.admissible(action)?;
        let process = self
            .process
            .as_mut()
            .ok_or_else(|| Error::Environment("the episode's process is gone".into()))?;
        let reply = match process.call(&json!({"op": "step", "action": action}), self.timeout) {
            Ok(r) => r,
            Err(e) => {
                self.process = None;
                return Err(e);
            }
        };
        self.shown.apply_step(&reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_python_traceback_is_summed_up_by_its_exception_and_frame() {
        let t = "warming up\nTraceback (most recent call last):\n  File \"/x/bridge.py\", line 30, in <module>\n    import textworld\nModuleNotFoundError: No module named 'textworld'";
        assert_eq!(
            stderr_summary(t),
            "; it raised ModuleNotFoundError: No module named 'textworld' (File \"/x/bridge.py\", \
             line 30, in <module>) (the whole traceback: -v)"
        );
        assert_eq!(
            stderr_summary("plain words"),
            "; its stderr ends with: plain words"
        );
        assert_eq!(stderr_summary(""), "");
    }

    fn line_env(timeout_secs: f64) -> External {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/envs/line_env.py");
        External::new(ExternalConfig {
            name: "line".into(),
            command: vec!["python3".into(), script.into()],
            timeout_secs,
            max_line_bytes: 1 << 20,
        })
    }

    #[test]
    fn protocol_round_trip_and_process_reuse() {
        let env = line_env(10.0);
        let tasks = env.generate(1, 3).unwrap();
        assert_eq!(tasks, env.generate(1, 3).unwrap());
        assert!(env.vocabulary().contains(&"right".to_string()));
        let mut ep = env.reset(&tasks[0]).unwrap();
        assert_eq!(ep.observation().admissible, vec!["left", "right"]);
        // An action outside the admissible set never reaches the process.
        let e = ep.step("fly").unwrap_err().to_string();
        assert!(e.contains("inadmissible action \"fly\""), "{e}");
        let st = ep.step("right").unwrap();
        assert_eq!(st.oracle_progress, Some(1));
        drop(ep);
        // The healthy process went back to the pool and serves the next episode.
        assert_eq!(env.pool.lock().unwrap().len(), 1);
        let mut ep = env.reset(&tasks[1]).unwrap();
        assert!(!ep.step("left").unwrap().won);
        let easier = env.mutate(&tasks[0], Direction::Easier, &CriticSummary::default(), 0);
        assert!(easier.is_ok());
    }

    /// A process that writes a 100 MB line, bytes without end, or lines nobody asked for: a
    /// clear error naming what was asked, the process killed, and at most `max_line_bytes`
    /// (here 1 MiB) read into memory per line.
    #[test]
    fn flooding_and_huge_lines_are_clear_errors_with_bounded_reads() {
        let env = line_env(10.0);
        let tasks = env.generate(1, 1).unwrap();
        for (fault, needles) in [
            (
                "huge",
                &["`step`", "longer than 1048576 bytes", "max_line_bytes"][..],
            ),
            ("endless", &["`step`", "longer than 1048576 bytes"][..]),
            (
                "flood",
                &["`step`", "nobody asked for", "one reply per request"][..],
            ),
        ] {
            let mut task = tasks[0].clone();
            task["fault"] = fault.into();
            task["budget"] = 10.into();
            let mut ep = env.reset(&task).unwrap();
            let t0 = std::time::Instant::now();
            // The flood's first reply is well-formed; the lines after it, waiting when the next
            // request is sent, were not asked for.
            let e = match ep.step("right") {
                Ok(_) => {
                    std::thread::sleep(Duration::from_millis(300));
                    ep.step("right").unwrap_err()
                }
                Err(e) => e,
            }
            .to_string();
            for n in needles {
                assert!(e.contains(n), "{fault}: {e}");
            }
            assert!(
                t0.elapsed() < Duration::from_secs(8),
                "{fault}: {:?}",
                t0.elapsed()
            );
        }
    }

    #[test]
    fn missing_program_is_a_clear_error() {
        let env = External::new(ExternalConfig {
            name: "x".into(),
            command: vec!["/nonexistent/env-binary".into()],
            timeout_secs: 1.0,
            ..ExternalConfig::default()
        });
        let e = env.generate(0, 1).unwrap_err().to_string();
        assert!(
            e.contains("cannot start") && e.contains("/nonexistent/env-binary"),
            "{e}"
        );
    }
}
