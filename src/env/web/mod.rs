//! `web`: the seed's GUI setting in its accessibility-tree mode — web tasks in a real headless
//! Chromium (MiniWoB-like families, `task`), observed as the page's accessibility tree in text
//! with element ids (`axtree`), acted on by id, judged by a JavaScript predicate over the page's
//! state (`Task::verifier`).
//!
//! Actions: `click(N)` (a real mouse click: buttons, links), `type(N, "text")` (a text field;
//! the texts offered are the values the task asks for and decoys), `select(N, "option")`,
//! `check(N)` (toggle a checkbox), and `submit` (the visible form) where the page has one; with
//! `env.web.scroll_and_keys`, `scroll(up)` / `scroll(down)` and `press("Enter")` too. The
//! admissible set is what the current tree allows.
//!
//! The browser (`cdp`): one Chromium per environment (per process), shared by the episodes that
//! run at once, each in a fresh browser context; every command has a time limit; a browser that
//! crashed or hung fails its episode with an error that says so and is replaced for the next.
//!
//! Step oracle: +1 when a step leaves fewer unmet subgoals (navigation counts the clicks still
//! needed), −1 otherwise and on a losing end. Planner: the first unmet subgoal's action.

pub mod axtree;
pub mod cdp;
mod config;
pub mod task;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::contract::{CriticSummary, Direction, Environment, Episode, Observation, Step};
use crate::determinism::{Rng, derive_seed};
use crate::error::Result;

pub use config::WebConfig;
use task::{Control, Spec, Subgoal, Task, Want, err};

/// The web environment: its settings and the browser its episodes share.
pub struct Web {
    cfg: WebConfig,
    browser: Mutex<Option<Arc<cdp::Browser>>>,
}

impl Web {
    pub fn new(cfg: WebConfig) -> Web {
        Web {
            cfg,
            browser: Mutex::new(None),
        }
    }

    /// The running browser, started (again) when there is none or it died.
    fn browser(&self) -> Result<Arc<cdp::Browser>> {
        let mut b = self.browser.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(x) = b.as_ref()
            && x.alive()
        {
            return Ok(x.clone());
        }
        let chromium = cdp::find_chromium(&self.cfg.chromium)?;
        let fresh = Arc::new(cdp::Browser::launch(
            &chromium,
            Duration::from_secs_f64(self.cfg.action_timeout_secs),
            self.cfg.window_height,
        )?);
        *b = Some(fresh.clone());
        Ok(fresh)
    }

    /// The running browser's process id, if one runs.
    pub fn browser_pid(&self) -> Option<u32> {
        let b = self.browser.lock().unwrap_or_else(|e| e.into_inner());
        b.as_ref().filter(|b| b.alive()).map(|b| b.pid())
    }

    /// Start an episode (the concrete type; `reset` boxes it).
    pub fn start(&self, spec: &Value) -> Result<WebEpisode> {
        let task = Task::parse(spec)?;
        let page = cdp::Page::open(self.browser()?)?;
        page.load(&task.html)?;
        let mut ep = WebEpisode::new(task, page, self.cfg.named_actions, self.cfg.scroll_and_keys)?;
        ep.screenshots = self.cfg.screenshots;
        Ok(ep)
    }
}

impl Environment for Web {
    fn name(&self) -> &'static str {
        "web"
    }

    fn generate(&self, seed: u64, count: u32) -> Result<Vec<Value>> {
        let knobs = self.cfg.knobs();
        (0..count)
            .map(|i| {
                let mut rng = Rng::new(derive_seed(seed, &["web", &i.to_string()]));
                let spec = task::sample(&mut rng, &self.cfg.families, &knobs);
                spec.check()?;
                Ok(spec.to_value())
            })
            .collect()
    }

    fn reset(&self, spec: &Value) -> Result<Box<dyn Episode>> {
        Ok(Box::new(self.start(spec)?))
    }

    /// A spec is valid when it makes a page: every page is solvable by construction (its
    /// planner's plan), so no browser is needed to check one.
    fn validate(&self, spec: &Value) -> Result<()> {
        Task::parse(spec).map(|_| ())
    }

    /// Harder: one knob the family reads one up (each in turn), or the same knobs with a new
    /// seed (a different page of the same difficulty); easier: one down.
    fn mutate(
        &self,
        spec: &Value,
        direction: Direction,
        _critic: &CriticSummary,
        seed: u64,
    ) -> Result<Vec<Value>> {
        let s = Spec::parse(spec)?;
        let step: i64 = if direction == Direction::Harder {
            1
        } else {
            -1
        };
        let knobs: &[&str] = match s.family.as_str() {
            "click_button" | "pick_row" => &["elements"],
            "fill_form" => &["fields", "distractors"],
            "navigate" => &["pages", "elements"],
            _ => &["fields", "distractors"],
        };
        let mut rng = Rng::new(seed);
        let mut out = Vec::new();
        for k in knobs {
            let mut v = s.to_value();
            let now = v[*k].as_i64().unwrap_or(0);
            v[*k] = json!(now + step);
            if let Ok(m) = Spec::parse(&v) {
                out.push(m.to_value());
            }
        }
        let mut reseeded = s.clone();
        reseeded.seed = rng.next_u64() >> 16;
        out.push(reseeded.to_value());
        Ok(out)
    }

    fn vocabulary(&self) -> Vec<String> {
        let mut v = task::vocabulary();
        // Only with the actions that use them: a run without keeps its small models' shape.
        if self.cfg.scroll_and_keys {
            v.extend(["scroll", "up", "down", "enter"].map(String::from));
        }
        v
    }

    fn spec_schema(&self) -> Option<Value> {
        Some(task::schema())
    }

    /// A task's page is its asset: the run keeps the exact HTML its episodes played, named by
    /// its blake3 (pages are made from the spec again when played; `replay --verify` fails if
    /// the page a spec makes ever differs from the committed one).
    fn asset_id(&self, spec: &Value) -> Option<String> {
        Task::parse(spec)
            .ok()
            .map(|t| blake3::hash(t.html.as_bytes()).to_hex().to_string())
    }

    fn asset(&self, spec: &Value) -> Result<Vec<u8>> {
        Ok(Task::parse(spec)?.html.into_bytes())
    }
}

/// A running web episode: its page in the browser and the last read of its tree.
pub struct WebEpisode {
    task: Task,
    page: cdp::Page,
    obs: Observation,
    tree: axtree::Tree,
    /// The `data-rla` key of each actionable node (by DOM node), for the planner.
    keys: HashMap<i64, String>,
    /// The actions admissible now, in the order of `obs.admissible` (their texts).
    actions: Vec<Action>,
    /// Whether an action's text names its element (`env.web.named_actions`).
    named: bool,
    /// The page's `window.__rla.state()` after the last step.
    state: Value,
    /// Whether scrolling and keys are offered (`env.web.scroll_and_keys`).
    more: bool,
    /// The script [`WebEpisode::read_state`] runs (the task's verifier is part of it).
    state_script: String,
    /// Whether [`Episode::screenshot`] captures the window (`env.web.screenshots`).
    screenshots: bool,
    steps: u32,
    done: bool,
}

/// One action, parsed from its text.
#[derive(Debug, Clone, PartialEq)]
enum Action {
    Click(u32),
    Check(u32),
    Type(u32, String),
    Select(u32, String),
    Submit,
    /// Scroll the page by most of a window: `true` down.
    Scroll(bool),
    /// Press a key on the focused element.
    Press(&'static str),
}

impl Action {
    fn text(&self) -> String {
        match self {
            Action::Click(n) => format!("click({n})"),
            Action::Check(n) => format!("check({n})"),
            Action::Type(n, t) => format!("type({n}, \"{t}\")"),
            Action::Select(n, t) => format!("select({n}, \"{t}\")"),
            Action::Submit => "submit".into(),
            Action::Scroll(down) => format!("scroll({})", if *down { "down" } else { "up" }),
            Action::Press(k) => format!("press(\"{k}\")"),
        }
    }
}

const STATE: &str = "window.__rla.state()";

impl WebEpisode {
    fn new(task: Task, page: cdp::Page, named: bool, more: bool) -> Result<WebEpisode> {
        let state_script = format!(
            "(() => {{ const s = {STATE}; return {{ state: s, \
             form: [...document.forms].some(f => f.offsetParent !== null), \
             up: window.scrollY > 0, \
             down: window.scrollY + window.innerHeight < document.documentElement.scrollHeight, \
             focus: !!(document.activeElement && document.activeElement.form), \
             won: s.done === true && ({})(s) === true }}; }})()",
            task.verifier()
        );
        let mut ep = WebEpisode {
            task,
            page,
            obs: Observation {
                text: String::new(),
                admissible: Vec::new(),
            },
            tree: axtree::Tree {
                text: String::new(),
                actionable: Vec::new(),
            },
            keys: HashMap::new(),
            actions: Vec::new(),
            named,
            state: Value::Null,
            more,
            state_script,
            screenshots: false,
            steps: 0,
            done: false,
        };
        let (_, page_actions) = ep.read_state()?;
        ep.observe(page_actions)?;
        Ok(ep)
    }

    /// The page's state, in one round trip with what the tree does not tell: whether the
    /// task's verifier holds (evaluated only on a state that ended), and the actions on the
    /// page as a whole that are admissible now (`submit` where a form is visible; with
    /// `more`, the scrolls the page allows and Enter where a form's field has the focus).
    fn read_state(&mut self) -> Result<(bool, Vec<Action>)> {
        let mut r = self.page.eval(&self.state_script)?;
        self.state = r["state"].take();
        let yes = |k: &str| r[k] == Value::Bool(true);
        let mut actions = Vec::new();
        if yes("form") {
            actions.push(Action::Submit);
        }
        if self.more {
            if yes("up") {
                actions.push(Action::Scroll(false));
            }
            if yes("down") {
                actions.push(Action::Scroll(true));
            }
            if yes("focus") {
                actions.push(Action::Press("Enter"));
            }
        }
        Ok((yes("won"), actions))
    }

    /// Read the tree again: the observation, the admissible actions (the tree's, then
    /// `page_actions`) and the planner's keys (read with the tree, so that the planner
    /// answers from the last observation without the browser: a browser that died since is
    /// reported by the next step, not as "no plan").
    fn observe(&mut self, page_actions: Vec<Action>) -> Result<()> {
        self.tree = axtree::render(&self.page.ax_tree()?);
        self.keys = dom_keys(&self.page.call("DOM.getDocument", json!({ "depth": -1 }))?);
        let mut actions = Vec::new();
        for a in &self.tree.actionable {
            match a.role.as_str() {
                "button" | "link" => actions.push(Action::Click(a.id)),
                "checkbox" | "radio" | "switch" => actions.push(Action::Check(a.id)),
                "textbox" | "searchbox" => actions.extend(
                    self.task
                        .typeable
                        .iter()
                        .map(|t| Action::Type(a.id, t.clone())),
                ),
                "combobox" => {
                    actions.extend(a.options.iter().map(|o| Action::Select(a.id, o.clone())))
                }
                _ => {}
            }
        }
        actions.extend(page_actions);
        self.obs = Observation {
            text: format!("Task: {}\n{}", self.task.instruction, self.tree.text),
            admissible: actions.iter().map(|a| self.shown(a)).collect(),
        };
        self.actions = actions;
        Ok(())
    }

    /// An action's text: (`named`) the name of the element it acts on, then its call.
    fn shown(&self, action: &Action) -> String {
        let call = action.text();
        let id = match action {
            Action::Click(n) | Action::Check(n) | Action::Type(n, _) | Action::Select(n, _) => *n,
            Action::Submit | Action::Scroll(_) | Action::Press(_) => return call,
        };
        match self.node(id) {
            Ok(node) if self.named && !node.name.is_empty() => {
                format!("\"{}\" {call}", node.name.replace('"', "'"))
            }
            _ => call,
        }
    }

    fn node(&self, id: u32) -> Result<&axtree::Actionable> {
        self.tree
            .actionable
            .iter()
            .find(|a| a.id == id)
            .ok_or_else(|| err(format!("no element [{id}]")))
    }

    fn act(&self, action: &Action) -> Result<()> {
        match action {
            Action::Click(n) | Action::Check(n) => self.page.click(self.node(*n)?.backend),
            Action::Type(n, t) => {
                let b = self.node(*n)?.backend;
                self.page.call("DOM.focus", json!({ "backendNodeId": b }))?;
                self.page
                    .call_on(b, "function () { this.value = ''; }", vec![])?;
                self.page.call("Input.insertText", json!({ "text": t }))?;
                Ok(())
            }
            Action::Select(n, t) => {
                let b = self.node(*n)?.backend;
                self.page.call_on(
                    b,
                    "function (v) { const i = [...this.options].findIndex(o => o.text === v); \
                     this.selectedIndex = i; \
                     this.dispatchEvent(new Event('change', { bubbles: true })); }",
                    vec![json!(t)],
                )?;
                Ok(())
            }
            Action::Submit => {
                self.page.eval(
                    "(() => { const f = [...document.forms].find(f => f.offsetParent !== null); \
                     if (f) f.requestSubmit(); })()",
                )?;
                Ok(())
            }
            Action::Scroll(down) => {
                let sign = if *down { "" } else { "-" };
                self.page.eval(&format!(
                    "window.scrollBy(0, {sign}0.8 * window.innerHeight)"
                ))?;
                Ok(())
            }
            Action::Press(key) => self.page.press(key),
        }
    }

    /// The page's viewport in CSS pixels (`innerWidth` × `innerHeight`): what the window shows
    /// of the page, the size of its screenshots. Chromium's headless window keeps part of its
    /// height (`env.web.window_height`) for a browser frame it does not draw, so the viewport
    /// is that much shorter (87 pixels with Chromium 156).
    pub fn viewport(&self) -> Result<(u32, u32)> {
        let v = self.page.eval("[window.innerWidth, window.innerHeight]")?;
        let n = |i: usize| v[i].as_u64().and_then(|x| u32::try_from(x).ok());
        match (n(0), n(1)) {
            (Some(w), Some(h)) => Ok((w, h)),
            _ => Err(err(format!("the viewport's size is not two numbers: {v}"))),
        }
    }

    /// The node id of the control whose `data-rla` is `key` in the current tree.
    fn id_of(&self, key: &str) -> Option<u32> {
        self.tree
            .actionable
            .iter()
            .find(|a| self.keys.get(&a.backend).map(String::as_str) == Some(key))
            .map(|a| a.id)
    }
}

/// Tests only, before the process's N-th web step: `RLA_PIPE_WEB_CRASH_AFTER=N` sends SIGKILL
/// to the browser (a browser crash at a known point; the step then fails as a real crash
/// does); `RLA_PIPE_WEB_ABORT_AFTER=N` aborts rla-pipe itself, as `kill -9` would, its browser
/// running.
fn crash_hook(page: &cdp::Page) {
    static STEPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let at = |var: &str| std::env::var(var).ok().and_then(|v| v.parse::<u64>().ok());
    let (crash, abort) = (
        at("RLA_PIPE_WEB_CRASH_AFTER"),
        at("RLA_PIPE_WEB_ABORT_AFTER"),
    );
    if crash.is_none() && abort.is_none() {
        return;
    }
    let step = STEPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
    if abort == Some(step) {
        eprintln!("RLA_PIPE_WEB_ABORT_AFTER={step}: aborting");
        std::process::abort();
    }
    if crash == Some(step) {
        // SAFETY: kill(2) on the browser this process started.
        unsafe { libc::kill(page.browser_pid() as i32, libc::SIGKILL) };
        // Let the reader thread see the pipe close, as it would after a real crash.
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `data-rla` of every DOM node that has one, by backend node id (`DOM.getDocument`'s tree).
fn dom_keys(doc: &Value) -> HashMap<i64, String> {
    let mut out = HashMap::new();
    let mut stack = vec![&doc["root"]];
    while let Some(n) = stack.pop() {
        if let Some(attrs) = n["attributes"].as_array() {
            for pair in attrs.chunks(2) {
                if pair[0] == "data-rla"
                    && let (Some(b), Some(k)) = (n["backendNodeId"].as_i64(), pair[1].as_str())
                {
                    out.insert(b, k.to_string());
                }
            }
        }
        if let Some(kids) = n["children"].as_array() {
            stack.extend(kids);
        }
    }
    out
}

impl Episode for WebEpisode {
    fn observation(&self) -> &Observation {
        &self.obs
    }

    fn step(&mut self, action: &str) -> Result<Step> {
        if self.done {
            return Err(err("the episode has ended"));
        }
        let Some(k) = self.obs.admissible.iter().position(|a| a == action) else {
            return Err(err(format!("{action:?} is not admissible here")));
        };
        let parsed = self.actions[k].clone();
        crash_hook(&self.page);
        let before = self.task.remaining(&self.state);
        self.act(&parsed)?;
        self.steps += 1;
        let (won, page_actions) = self.read_state()?;
        let ended = self.state["done"] == Value::Bool(true);
        let after = self.task.remaining(&self.state);
        self.done = ended || self.steps >= self.task.budget;
        let progress = if won || (!ended && after < before) {
            1
        } else {
            -1
        };
        if !self.done {
            self.observe(page_actions)?;
        }
        Ok(Step {
            done: self.done,
            won,
            oracle_progress: Some(progress),
        })
    }

    fn max_steps(&self) -> u32 {
        self.task.budget
    }

    /// With `env.web.screenshots`: the window as a PNG (`Page.captureScreenshot`, under the
    /// command time limit; a browser that is gone is the same clean error as in a step).
    /// Without it: `None`, and no command is sent.
    fn screenshot(&mut self) -> Result<Option<Vec<u8>>> {
        if !self.screenshots {
            return Ok(None);
        }
        self.page.screenshot().map(Some)
    }

    fn oracle_action(&self) -> Option<String> {
        if self.done {
            return None;
        }
        for g in &self.task.goal {
            let action = match g {
                Subgoal::Field { key, control, want } => {
                    if task::holds(&self.state, key, want) {
                        continue;
                    }
                    let id = self.id_of(key)?;
                    match (control, want) {
                        (Control::TextField, Want::Text(t)) => Action::Type(id, t.clone()),
                        (Control::Select, Want::Text(t)) => Action::Select(id, t.clone()),
                        _ => Action::Check(id),
                    }
                }
                Subgoal::SignedIn => {
                    if self.state["signed_in"] == Value::Bool(true) {
                        continue;
                    }
                    Action::Click(self.id_of("signin")?)
                }
                Subgoal::View { path } => {
                    let at = self.state["view"].as_str().unwrap_or("home").to_string();
                    let to = path.join("/");
                    if at == to {
                        continue;
                    }
                    let next = if to.starts_with(&format!("{at}/")) {
                        let depth = at.split('/').count();
                        format!("go:{}", path[..=depth].join("/"))
                    } else {
                        format!("back:{at}")
                    };
                    Action::Click(self.id_of(&next)?)
                }
                Subgoal::Final { key } => Action::Click(self.id_of(key)?),
            };
            return Some(self.shown(&action));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_move_the_familys_knobs_and_stay_valid() {
        let web = Web::new(WebConfig::default());
        let spec = json!({"family": "navigate", "seed": 5, "elements": 3, "fields": 1,
                          "pages": 2, "distractors": 0});
        let harder = web
            .mutate(&spec, Direction::Harder, &CriticSummary::default(), 1)
            .unwrap();
        assert!(harder.iter().any(|s| s["pages"] == 3));
        assert!(harder.iter().any(|s| s["elements"] == 4));
        let easier = web
            .mutate(&spec, Direction::Easier, &CriticSummary::default(), 1)
            .unwrap();
        assert!(easier.iter().any(|s| s["pages"] == 1));
        for s in harder.iter().chain(&easier) {
            web.validate(s).unwrap();
        }
        // At a bound the knob does not move past it.
        let low = json!({"family": "click_button", "seed": 5, "elements": 2});
        let e = web
            .mutate(&low, Direction::Easier, &CriticSummary::default(), 1)
            .unwrap();
        assert!(e.iter().all(|s| s["elements"] == 2));
    }
}
