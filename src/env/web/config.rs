//! `[env.web]`: which families, how hard, and the browser.

use serde::{Deserialize, Serialize};

use super::task::{FAMILIES, Knobs};
use crate::error::Checks;

/// The web environment's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebConfig {
    /// Task families drawn uniformly: click_button, fill_form, pick_row, navigate,
    /// login_setting.
    pub families: Vec<String>,
    /// Buttons, rows or links per page (2..=12).
    pub elements: u32,
    /// Fields to fill or settings to change (1..=5).
    pub fields: u32,
    /// Navigation depth (1..=4).
    pub pages: u32,
    /// Fields not asked for, and decoy values offered for typing (0..=4).
    pub distractors: u32,
    /// The browser: a path, or empty for the first of chromium, chromium-browser,
    /// google-chrome on PATH.
    pub chromium: String,
    /// Seconds one browser command may take; past it the browser counts as hung, is killed,
    /// and the episode fails with that error.
    pub action_timeout_secs: f64,
    /// Admissible actions start with the name of their element (`"saffron" click(3)`,
    /// `"username" type(1, "alder")`), so a policy that scores actions as continuations reads
    /// the element's name before anything else and can match it against the instruction
    /// directly; false: bare ids, as BrowserGym's (`click(3)`).
    pub named_actions: bool,
    /// Also offer `scroll(up)` / `scroll(down)` (where the page can scroll that way) and
    /// `press("Enter")` (where a form's field has the focus: the form's implicit submission),
    /// the rest of BrowserGym's action set. Off by default: the accessibility tree lists every
    /// node on screen or not, so a scroll changes no observation in this mode, and Enter does
    /// what `submit` does; they matter to a policy that sees pixels.
    pub scroll_and_keys: bool,
    /// The browser window's height in pixels (its width is 1024): what a page shows before it
    /// scrolls (200..=4000).
    pub window_height: u32,
    /// Keep a PNG screenshot of the viewport (1024 wide; `window_height` less the frame
    /// headless Chromium keeps) at every step `rollout` and the warm start commit, and of the
    /// page each episode ended on, as artifacts
    /// (`screenshot-<traj_id>-<step_idx>`, `screenshot-demo-<purpose>-<episode>-<step_idx>`):
    /// pixels for a future vision model. Off by default: nothing is captured, nothing stored.
    /// `replay --verify` compares their names, not their pixels (fonts and renderers differ
    /// between machines).
    pub screenshots: bool,
}

impl Default for WebConfig {
    fn default() -> Self {
        let k = Knobs::default();
        WebConfig {
            families: FAMILIES.iter().map(|f| f.to_string()).collect(),
            elements: k.elements,
            fields: k.fields,
            pages: k.pages,
            distractors: k.distractors,
            chromium: String::new(),
            action_timeout_secs: 20.0,
            named_actions: true,
            scroll_and_keys: false,
            window_height: 768,
            screenshots: false,
        }
    }
}

impl WebConfig {
    pub fn knobs(&self) -> Knobs {
        Knobs {
            elements: self.elements,
            fields: self.fields,
            pages: self.pages,
            distractors: self.distractors,
        }
    }

    fn with(&self, k: Knobs) -> WebConfig {
        WebConfig {
            elements: k.elements,
            fields: k.fields,
            pages: k.pages,
            distractors: k.distractors,
            ..self.clone()
        }
    }

    /// One level harder (the out-of-distribution set): every knob one up, within its bounds.
    pub fn harder(&self) -> WebConfig {
        self.with(self.knobs().shifted(1))
    }

    /// One level easier (the warm start's demonstrations): every knob one down.
    pub fn easier(&self) -> WebConfig {
        self.with(self.knobs().shifted(-1))
    }

    pub fn validate(&self, c: &mut Checks) {
        c.check(
            !self.families.is_empty(),
            "env.web.families",
            "must name at least one family",
        );
        for f in &self.families {
            c.check(
                FAMILIES.contains(&f.as_str()),
                "env.web.families",
                format!("{f:?} is not one of {FAMILIES:?}"),
            );
        }
        for (k, v, lo, hi) in self.knobs().outside() {
            c.check(
                false,
                &format!("env.web.{k}"),
                format!("{v} is outside {lo}..={hi}"),
            );
        }
        c.check(
            (200..=4000).contains(&self.window_height),
            "env.web.window_height",
            format!("{} is outside 200..=4000", self.window_height),
        );
        c.check(
            self.action_timeout_secs > 0.0,
            "env.web.action_timeout_secs",
            "must be positive",
        );
    }
}
