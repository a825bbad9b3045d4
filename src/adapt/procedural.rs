//! The built-in adapter: the environment's mutation operators. The environment orders its
//! candidates by the critic summary (e.g. gridnav edits walls next to the cells where the RM
//! judged every sample bad; household picks operators by where in the episode the RM saw
//! trouble); the first candidate that is not already in the pool is kept.

use async_trait::async_trait;
use serde_json::Value;

use super::adapter::{Adapter, Proposal, Request};
use crate::env;
use crate::error::Result;

pub struct Procedural;

#[async_trait]
impl Adapter for Procedural {
    fn name(&self) -> &'static str {
        "procedural"
    }

    async fn propose(&self, r: &Request<'_>) -> Result<Option<Proposal>> {
        let candidates = r.env.mutate(r.spec, r.direction, r.critic, r.seed)?;
        Ok(candidates
            .into_iter()
            .find(|c: &Value| !r.exclude.contains(&env::task_id(r.env.name(), c)))
            .map(|spec| Proposal { spec, critic: None }))
    }
}
