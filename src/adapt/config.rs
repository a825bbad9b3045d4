//! `[adapt]`: environment adaptation's settings, with their defaults and checks, and the
//! decisions it records.

use serde::{Deserialize, Serialize};

use crate::error::Checks;

/// Whether acceptance bounds of the adaptation rule are inclusive or strict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Bounds {
    Inclusive,
    Strict,
}

/// The adapter that writes candidate tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AdapterKind {
    Procedural,
    Openai,
}

impl AdapterKind {
    /// Whether the same request always gives the same candidate: only the procedural adapter
    /// (replay re-executes the `adapt` stage only then; otherwise it checks the committed files'
    /// integrity).
    pub fn is_deterministic(self) -> bool {
        self == AdapterKind::Procedural
    }
}

/// Which task a candidate is written from (`adapt.rewrite_from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RewriteFrom {
    /// The slot's original seed task (the reference implementation: a small edit of the seed,
    /// so difficulty cannot drift step after step).
    Seed,
    /// The slot's current occupant (rewrites compound).
    Current,
}

/// Which rollouts the critic summary describes (`adapt.critic_from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CriticFrom {
    /// Failed rollouts only (the reference implementation's failure summaries).
    Failed,
    /// Every rollout, successes included.
    All,
}

/// `adaptations.decision`: where a candidate stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// Written this iteration; rolled out and judged in the next.
    Pending,
    /// Judged: replaces its parent in the slot.
    Accepted,
    /// Judged: the parent stays.
    Rejected,
}

impl Decision {
    /// The spelling in `adaptations.decision`.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Pending => "pending",
            Decision::Accepted => "accepted",
            Decision::Rejected => "rejected",
        }
    }
}

/// `[adapt]`: environment adaptation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdaptConfig {
    pub enabled: bool,
    /// acc ≥ alpha_high → make harder.
    pub alpha_high: f64,
    /// acc ≤ alpha_low → make easier.
    pub alpha_low: f64,
    pub bounds: Bounds,
    /// Who writes candidates: `procedural` (the environment's mutation operators, chosen with
    /// the critic summary) or `openai` (an OpenAI-compatible chat-completions endpoint).
    pub adapter: AdapterKind,
    /// Most frequent critique words kept in a task's critic summary (and per failed rollout).
    pub critic_words: u32,
    /// What a candidate rewrites: `seed` (the slot's original seed task, as the reference) or
    /// `current` (the slot's occupant). acc(q) is the occupant's accuracy either way.
    pub rewrite_from: RewriteFrom,
    /// Which rollouts the critic summary's high-risk steps come from: `failed` (as the
    /// reference) or `all`.
    pub critic_from: CriticFrom,
    pub openai: OpenAiConfig,
}

impl Default for AdaptConfig {
    fn default() -> Self {
        AdaptConfig {
            enabled: true,
            alpha_high: 0.8,
            alpha_low: 0.2,
            bounds: Bounds::Inclusive,
            adapter: AdapterKind::Procedural,
            critic_words: 5,
            rewrite_from: RewriteFrom::Seed,
            critic_from: CriticFrom::Failed,
            openai: Default::default(),
        }
    }
}

/// `[adapt.openai]`: an OpenAI-compatible chat-completions endpoint (vLLM, llama.cpp's server,
/// ...). The API key is read from the environment variable named here; it never enters the
/// config, the manifests or the logs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpenAiConfig {
    /// Base URL; `/chat/completions` is appended.
    pub endpoint: String,
    pub model: String,
    /// Name of the environment variable holding the API key; empty: no Authorization header.
    pub api_key_env: String,
    pub temperature: f64,
    /// Rewrite requests per task (the reference makes 8); the first candidate the environment
    /// validates is kept.
    pub attempts: u32,
    /// Whether the model first writes a failure summary (at most two sentences) of every failed
    /// rollout, which the rewrite request then quotes (the reference's two-call shape).
    pub failure_summaries: bool,
    pub max_tokens: u32,
    /// Seconds one request may take.
    pub timeout_secs: u64,
    /// Requests in flight at once (tasks are asked in slot order, this many at a time).
    pub concurrency: u32,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        OpenAiConfig {
            endpoint: "http://127.0.0.1:8000/v1".into(),
            model: "default".into(),
            api_key_env: "OPENAI_API_KEY".into(),
            temperature: 0.8,
            attempts: 8,
            failure_summaries: true,
            max_tokens: 1024,
            timeout_secs: 120,
            concurrency: 4,
        }
    }
}

impl AdaptConfig {
    /// The section's own checks (keys `adapt.*`).
    pub fn validate(&self, c: &mut Checks) {
        let unit = |x: f64| (0.0..=1.0).contains(&x);
        c.check(
            unit(self.alpha_low) && unit(self.alpha_high),
            "adapt.alpha_low",
            "alphas must be in [0, 1]",
        );
        c.check(
            self.alpha_low < self.alpha_high,
            "adapt.alpha_high",
            "must be greater than adapt.alpha_low",
        );
        self.openai.validate(c);
    }
}

impl OpenAiConfig {
    /// The section's own checks (keys `adapt.openai.*`).
    pub fn validate(&self, c: &mut Checks) {
        c.check(
            self.endpoint.starts_with("http://") || self.endpoint.starts_with("https://"),
            "adapt.openai.endpoint",
            "must be an http:// or https:// URL",
        );
        c.check(
            self.temperature >= 0.0 && self.temperature.is_finite(),
            "adapt.openai.temperature",
            "must be ≥ 0",
        );
        c.check(
            self.attempts >= 1,
            "adapt.openai.attempts",
            "must be at least 1",
        );
        c.check(
            self.max_tokens >= 1,
            "adapt.openai.max_tokens",
            "must be at least 1",
        );
        c.check(
            self.timeout_secs >= 1,
            "adapt.openai.timeout_secs",
            "must be at least 1",
        );
        c.check(
            (1..=64).contains(&self.concurrency),
            "adapt.openai.concurrency",
            "must be in 1..=64",
        );
    }
}
