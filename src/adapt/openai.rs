//! An adapter backed by any OpenAI-compatible chat-completions endpoint (vLLM, llama.cpp's
//! server, a hosted API). The model gets the task's spec, the direction and the critic summary
//! and replies with a new spec; the environment validates it (parseable, solvable, new). An
//! invalid reply is answered with the validation error and the model tries again, up to
//! `adapt.openai.attempts` requests per task (8, as the reference's tries).
//!
//! With `adapt.openai.failure_summaries` (the default) the reference's two-call shape: the model
//! first writes a failure summary of at most two sentences for every failed rollout (from that
//! rollout's high-risk steps, the observations there and the RM's critique words), boxed as
//! `\boxed{...}`; the rewrite request then quotes them. The summaries are recorded in
//! `adaptations.critic`. Transport failures (unreachable endpoint, HTTP
//! errors, timeouts) fail the stage with a message naming the endpoint; the run resumes from
//! there once the endpoint is back.
//!
//! The API key is read from the environment variable `adapt.openai.api_key_env` names, sent
//! only in the `Authorization` header, and never written to manifests, tables or logs.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::OpenAiConfig;
use super::adapter::{Adapter, Proposal, Request, direction_name};
use crate::env::coding::curate;
use crate::env::{self, CriticSummary, FailedRollout};
use crate::error::{Error, Result};

pub struct OpenAi {
    cfg: OpenAiConfig,
    client: reqwest::Client,
}

impl OpenAi {
    pub fn new(cfg: OpenAiConfig) -> Result<OpenAi> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(cfg.timeout_secs))
            .build()
            .map_err(|e| Error::Adapt(format!("adapt.openai: cannot build an HTTP client: {e}")))?;
        Ok(OpenAi { cfg, client })
    }

    fn url(&self) -> String {
        format!(
            "{}/chat/completions",
            self.cfg.endpoint.trim_end_matches('/')
        )
    }

    /// The API key, if one is configured. A named variable that is unset is an error (a run
    /// that silently sends no key would only fail later, less clearly).
    fn api_key(&self) -> Result<Option<String>> {
        if self.cfg.api_key_env.is_empty() {
            return Ok(None);
        }
        match std::env::var(&self.cfg.api_key_env) {
            Ok(k) if !k.is_empty() => Ok(Some(k)),
            _ => Err(Error::Adapt(format!(
                "adapt.openai.api_key_env names the environment variable {:?}, which is not set; set it, or set api_key_env = \"\" for an endpoint without a key",
                self.cfg.api_key_env
            ))),
        }
    }

    /// One chat-completions request: the reply's text.
    async fn complete(&self, messages: &[Value], key: Option<&str>) -> Result<String> {
        let body = json!({
            "model": self.cfg.model,
            "messages": messages,
            "temperature": self.cfg.temperature,
            "max_tokens": self.cfg.max_tokens,
        });
        let mut req = self
            .client
            .post(self.url())
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).expect("request serializes"));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let endpoint = &self.cfg.endpoint;
        let resp = req.send().await.map_err(|e| {
            Error::Adapt(format!(
                "adapt.openai: request to {endpoint} failed: {}",
                describe(&e)
            ))
        })?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| {
            Error::Adapt(format!(
                "adapt.openai: reading the reply of {endpoint} failed: {}",
                describe(&e)
            ))
        })?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes);
            return Err(Error::Adapt(format!(
                "adapt.openai: {endpoint} answered HTTP {status}: {}",
                text.chars().take(300).collect::<String>()
            )));
        }
        let reply: Value = serde_json::from_slice(&bytes).map_err(|e| {
            Error::Adapt(format!(
                "adapt.openai: {endpoint} did not answer with JSON: {e}"
            ))
        })?;
        reply
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| {
                Error::Adapt(format!(
                    "adapt.openai: the reply of {endpoint} has no choices[0].message.content"
                ))
            })
    }
}

/// A transport error without the request's headers (reqwest's Display never prints them, but
/// keep the message short: kind and source).
fn describe(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "failed"
    };
    let mut msg = kind.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg = format!("{msg}: {s}");
        source = s.source();
    }
    msg
}

/// Characters kept of a failure summary.
const SUMMARY_CHARS: usize = 600;

/// The messages that ask for one failed rollout's failure summary (the reference's
/// `build_traj_failure_summary_prompt`, from what the critic knows about the rollout).
pub fn summary_prompt(r: &Request<'_>, f: &FailedRollout) -> Vec<Value> {
    let detail = serde_json::to_string_pretty(f).expect("rollout serializes");
    vec![
        json!({
            "role": "system",
            "content": format!(
                "You analyse a failed rollout of a policy in the reinforcement-learning environment `{}`.",
                r.env.name()
            ),
        }),
        json!({
            "role": "user",
            "content": format!(
                "Task:\n{}\n\nThe rollout did NOT finish the task within its step budget ({} steps taken). What the reward model said about it (high_risk_steps = steps where every verdict was bad, with the observation at each; critique_words = most frequent words of its reasoning):\n{detail}\n\nIn at most TWO sentences, explain the most likely reasons the policy failed. Be concrete (wrong exploration, looping, wrong target or location, ...). Put the summary in \\boxed{{}} and output nothing else.",
                crate::determinism::canonical(r.spec),
                f.steps,
            ),
        }),
    ]
}

/// The text of the last `\boxed{...}` of a reply (braces balanced), or the trimmed reply.
pub fn extract_boxed(text: &str) -> String {
    if let Some(at) = text.rfind("\\boxed{") {
        let inner = &text[at + "\\boxed{".len()..];
        let mut depth = 1usize;
        for (i, ch) in inner.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return inner[..i].trim().to_string();
                    }
                }
                _ => {}
            }
        }
    }
    text.trim().to_string()
}

/// The messages that ask for a rewrite.
pub fn prompt(r: &Request<'_>) -> Vec<Value> {
    prompt_with(r, r.critic)
}

/// The messages that ask for a rewrite, quoting `critic` (with any failure summaries).
pub fn prompt_with(r: &Request<'_>, critic: &CriticSummary) -> Vec<Value> {
    let goal = match r.direction {
        crate::env::Direction::Harder => {
            "The policy solves this task too often. Write a HARDER variant: it should still be solvable, but fail more often."
        }
        crate::env::Direction::Easier => {
            "The policy rarely solves this task. Write an EASIER variant: same kind of task, but solved more often."
        }
    };
    let summaries: String = critic
        .failed_rollouts
        .iter()
        .filter_map(|f| {
            f.summary
                .as_ref()
                .map(|s| format!("- Rollout {}: {s}\n", f.rollout_idx))
        })
        .collect();
    let summaries = if summaries.is_empty() {
        String::new()
    } else {
        format!("Failure summaries of recent rollouts (failed rollouts only):\n{summaries}\n")
    };
    let critic = serde_json::to_string_pretty(critic).expect("critic serializes");
    // Where the environment has a spec schema (web), the model sees it: a candidate outside
    // it is refused with the reason.
    let schema = r.env.spec_schema().map_or(String::new(), |s| {
        format!(" Every task satisfies this JSON Schema (a task outside it is refused):\n{s}")
    });
    vec![
        json!({
            "role": "system",
            "content": format!(
                "You rewrite tasks of the reinforcement-learning environment `{}`. A task is a JSON object; keep exactly the same format and keys. Reply with the new task's JSON object only, no explanation.{schema}",
                r.env.name()
            ),
        }),
        json!({
            "role": "user",
            "content": format!(
                "Task:\n{}\n\n{goal}\n\n{summaries}What the reward model said about the policy's rollouts of this task (accuracy = success rate; high-risk steps = steps where every verdict was bad; step_verdicts = share of good/bad verdicts per step; critique_words = most frequent words of its reasoning; failed_rollouts = the same per failed rollout):\n{critic}\n\nDirection: {}. Reply with the JSON object of the new task.",
                crate::determinism::canonical(r.spec),
                direction_name(r.direction),
            ),
        }),
    ]
}

/// The JSON object in a reply: the whole text, a fenced block, or the outermost `{...}`.
pub fn extract_json(text: &str) -> std::result::Result<Value, String> {
    let t = text.trim();
    if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(t) {
        return Ok(v);
    }
    let (Some(a), Some(b)) = (t.find('{'), t.rfind('}')) else {
        return Err("the reply contains no JSON object".into());
    };
    if b < a {
        return Err("the reply contains no JSON object".into());
    }
    match serde_json::from_str::<Value>(&t[a..=b]) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err("the reply's JSON is not an object".into()),
        Err(e) => Err(format!("the reply's JSON does not parse: {e}")),
    }
}

/// A candidate the environment accepts (valid, solvable), changed and not in the pool.
fn admit(r: &Request<'_>, spec: Value) -> std::result::Result<Value, String> {
    r.env.validate(&spec).map_err(|e| e.to_string())?;
    let id = env::task_id(r.env.name(), &spec);
    if spec == *r.spec || id == r.task_id {
        return Err("the task is unchanged".into());
    }
    if r.exclude.contains(&id) {
        return Err("that task is already in the pool".into());
    }
    Ok(spec)
}

impl OpenAi {
    /// The coding setting (the reference's `sample/llm_env_rollout.py`): the environment model
    /// gets the reference's curator prompt (root and current problem, the tests with the
    /// policy's pass rates) and answers with a JSON problem, read as the reference reads it
    /// ([`curate::read_rewrite`]: at least `min_tests` test pairs, time limit 4 s). Up to
    /// `adapt.openai.attempts` requests; after an unusable answer the model is told why and
    /// asked again (the reference draws fresh samples instead: a deliberate difference, as for
    /// the other environments).
    async fn propose_problem(
        &self,
        r: &Request<'_>,
        ev: &curate::Evidence,
    ) -> Result<Option<Proposal>> {
        let Some([system, user]) =
            curate::rewrite_messages(r.spec, direction_name(r.direction), ev)
        else {
            tracing::info!(
                task = r.task_id,
                "adapt.openai: a function-call problem is not rewritten"
            );
            return Ok(None);
        };
        let key = self.api_key()?;
        let messages = vec![
            json!({"role": "system", "content": system}),
            json!({"role": "user", "content": user}),
        ];
        let min = ev.min_tests;
        let read = |reply: &str| {
            curate::read_rewrite(reply, min).ok_or_else(|| {
                format!(
                    "the answer holds no JSON object with a non-empty question and at least {min} test_input/test_output pairs of equal length"
                )
            })
        };
        let spec = self
            .ask(
                r,
                messages,
                key.as_deref(),
                read,
                "That is not a valid problem",
            )
            .await?;
        Ok(spec.map(|spec| Proposal { spec, critic: None }))
    }

    /// Up to `adapt.openai.attempts` requests until an answer reads (`read`) as a candidate the
    /// environment admits; after each unusable one the model is told why (`refusal: why`).
    async fn ask(
        &self,
        r: &Request<'_>,
        mut messages: Vec<Value>,
        key: Option<&str>,
        read: impl Fn(&str) -> std::result::Result<Value, String>,
        refusal: &str,
    ) -> Result<Option<Value>> {
        for attempt in 1..=self.cfg.attempts {
            let reply = self.complete(&messages, key).await?;
            match read(&reply).and_then(|spec| admit(r, spec)) {
                Ok(spec) => return Ok(Some(spec)),
                Err(why) => {
                    tracing::warn!(
                        task = r.task_id,
                        attempt,
                        "adapt.openai: candidate rejected: {why}"
                    );
                    messages.push(json!({"role": "assistant", "content": reply}));
                    messages.push(json!({
                        "role": "user",
                        "content": format!("{refusal}: {why}. Reply with a corrected JSON object only."),
                    }));
                }
            }
        }
        Ok(None)
    }
}

#[async_trait]
impl Adapter for OpenAi {
    fn name(&self) -> &'static str {
        "openai"
    }

    fn concurrency(&self) -> usize {
        self.cfg.concurrency as usize
    }

    async fn propose(&self, r: &Request<'_>) -> Result<Option<Proposal>> {
        if let Some(ev) = r.evidence {
            return self.propose_problem(r, ev).await;
        }
        let key = self.api_key()?;
        let mut critic = r.critic.clone();
        if self.cfg.failure_summaries {
            for f in critic.failed_rollouts.iter_mut() {
                let reply = self.complete(&summary_prompt(r, f), key.as_deref()).await?;
                f.summary = Some(extract_boxed(&reply).chars().take(SUMMARY_CHARS).collect());
            }
        }
        let messages = prompt_with(r, &critic);
        let spec = self
            .ask(
                r,
                messages,
                key.as_deref(),
                extract_json,
                "That is not a valid task",
            )
            .await?;
        let critic = self.cfg.failure_summaries.then_some(critic);
        Ok(spec.map(|spec| Proposal { spec, critic }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxed_summaries_are_extracted() {
        assert_eq!(
            extract_boxed("Thinking... \\boxed{It looped {twice}.}"),
            "It looped {twice}."
        );
        assert_eq!(extract_boxed("\\boxed{a} then \\boxed{b}"), "b");
        assert_eq!(extract_boxed("  no box  "), "no box");
        assert_eq!(extract_boxed("\\boxed{unclosed"), "\\boxed{unclosed");
    }

    #[test]
    fn json_is_found_in_replies() {
        let want = json!({"a": 1});
        for text in [
            "{\"a\": 1}",
            "  {\"a\":1}\n",
            "```json\n{\"a\": 1}\n```",
            "Here is the task: {\"a\": 1} Hope it helps.",
        ] {
            assert_eq!(extract_json(text).unwrap(), want, "{text}");
        }
        assert!(
            extract_json("no json")
                .unwrap_err()
                .contains("no JSON object")
        );
        assert!(
            extract_json("{oops}")
                .unwrap_err()
                .contains("does not parse")
        );
        assert!(extract_json("} {").is_err());
    }
}
