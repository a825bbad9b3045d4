//! Web tasks: a spec (family, seed, knobs) made into a page (HTML + a small script that keeps
//! the page's state in `window.__rla`), an instruction, and the goal as an ordered list of
//! subgoals. The verifier (a JavaScript predicate over the page's state, evaluated in the page,
//! like OSWorld's evaluator files), the step oracle and the planner all read the goal.
//!
//! Families (MiniWoB-like): `click_button` (a named button among distractors), `fill_form` (text
//! fields, a select, a checkbox, then submit), `pick_row` (the row of a table that meets a
//! condition), `navigate` (a few pages deep to a target, then confirm), `login_setting` (sign
//! in, then change settings and save).
//!
//! Spec (JSON): `{"family": "fill_form", "seed": 7, "elements": 4, "fields": 2, "pages": 2,
//! "distractors": 1}`: every family reads the knobs it uses (`elements`: buttons, rows or links
//! per page; `fields`: fields to fill or settings to change; `pages`: navigation depth;
//! `distractors`: fields not asked for, or decoy values offered for typing) and ignores the
//! others; the same spec always makes the same page.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::determinism::{Rng, derive_seed};
use crate::error::{Error, Result};

pub fn err(msg: impl std::fmt::Display) -> Error {
    Error::Environment(format!("web: {msg}"))
}

/// The task families.
pub const FAMILIES: [&str; 5] = [
    "click_button",
    "fill_form",
    "pick_row",
    "navigate",
    "login_setting",
];

/// The bounds of each knob.
pub const MAX_ELEMENTS: u32 = 12;
pub const MAX_FIELDS: u32 = 5;
pub const MAX_PAGES: u32 = 4;
pub const MAX_DISTRACTORS: u32 = 4;

/// The knobs of a spec: name, bounds, default, meaning (what `Spec::check` enforces and
/// `schema` tells an environment model).
pub const KNOBS: [(&str, u32, u32, u32, &str); 4] = [
    (
        "elements",
        2,
        MAX_ELEMENTS,
        4,
        "buttons, rows or links per page",
    ),
    (
        "fields",
        1,
        MAX_FIELDS,
        1,
        "fields to fill or settings to change",
    ),
    ("pages", 1, MAX_PAGES, 1, "navigation depth (navigate)"),
    (
        "distractors",
        0,
        MAX_DISTRACTORS,
        0,
        "fields not asked for, decoy values offered for typing",
    ),
];

/// A knob's bounds ([`KNOBS`]).
pub fn bounds(knob: &str) -> (u32, u32) {
    let (_, lo, hi, _, _) = KNOBS
        .iter()
        .find(|k| k.0 == knob)
        .unwrap_or_else(|| panic!("{knob:?} is not a knob"));
    (*lo, *hi)
}

/// The spec's JSON Schema: the families, the seed and each knob's bounds, no other keys.
pub fn schema() -> Value {
    let mut props = serde_json::Map::new();
    props.insert(
        "family".into(),
        serde_json::json!({"enum": FAMILIES, "description": "the task family"}),
    );
    props.insert(
        "seed".into(),
        serde_json::json!({"type": "integer", "minimum": 0,
            "description": "draws the page's names, values and layout"}),
    );
    for (k, lo, hi, default, meaning) in KNOBS {
        props.insert(
            k.into(),
            serde_json::json!({"type": "integer", "minimum": lo, "maximum": hi,
                "default": default, "description": meaning}),
        );
    }
    serde_json::json!({
        "type": "object",
        "required": ["family", "seed"],
        "additionalProperties": false,
        "properties": props,
    })
}

const WORDS: [&str; 32] = [
    "maple", "cedar", "birch", "aspen", "willow", "spruce", "alder", "hazel", "olive", "pine",
    "rowan", "laurel", "amber", "coral", "ivory", "jade", "onyx", "pearl", "ruby", "slate",
    "topaz", "azure", "crimson", "indigo", "saffron", "teal", "violet", "scarlet", "cobalt",
    "ochre", "sage", "umber",
];
const LABELS: [&str; 10] = [
    "first name",
    "last name",
    "city",
    "company",
    "street",
    "team",
    "nickname",
    "country",
    "project",
    "pet",
];
const CHOICES: [(&str, [&str; 4]); 3] = [
    ("size", ["small", "medium", "large", "huge"]),
    ("color", ["red", "green", "blue", "black"]),
    ("plan", ["basic", "plus", "pro", "team"]),
];
const BOXES: [&str; 6] = [
    "newsletter",
    "terms",
    "reminders",
    "dark mode",
    "emails",
    "autosave",
];
const ITEMS: [&str; 12] = [
    "apple", "lamp", "chair", "kettle", "clock", "mirror", "pillow", "basket", "candle", "vase",
    "radio", "teapot",
];
const SECTIONS: [&str; 12] = [
    "settings", "account", "billing", "privacy", "profile", "security", "devices", "support",
    "reports", "history", "storage", "network",
];

/// A task's spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub family: String,
    pub seed: u64,
    #[serde(default = "four")]
    pub elements: u32,
    #[serde(default = "one")]
    pub fields: u32,
    #[serde(default = "one")]
    pub pages: u32,
    #[serde(default)]
    pub distractors: u32,
}

fn one() -> u32 {
    1
}

fn four() -> u32 {
    4
}

impl Spec {
    pub fn parse(spec: &Value) -> Result<Spec> {
        let s: Spec = serde_json::from_value(spec.clone())
            .map_err(|e| err(format!("task spec {spec}: {e}")))?;
        s.check()?;
        Ok(s)
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a spec serializes")
    }

    pub fn knobs(&self) -> Knobs {
        Knobs {
            elements: self.elements,
            fields: self.fields,
            pages: self.pages,
            distractors: self.distractors,
        }
    }

    /// The family is known and every knob within its bounds ([`schema`]).
    pub fn check(&self) -> Result<()> {
        if !FAMILIES.contains(&self.family.as_str()) {
            return Err(err(format!(
                "task spec: family {:?} is not one of {FAMILIES:?}",
                self.family
            )));
        }
        match self.knobs().outside().first() {
            Some((k, v, lo, hi)) => {
                Err(err(format!("task spec: {k} = {v} is outside {lo}..={hi}")))
            }
            None => Ok(()),
        }
    }
}

/// What one control holds: text (a text field or the selected option) or a checkbox's state.
#[derive(Debug, Clone, PartialEq)]
pub enum Want {
    Text(String),
    Checked(bool),
}

/// How the agent sets a control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    TextField,
    Select,
    Checkbox,
}

/// One subgoal, in the order the planner does them.
#[derive(Debug, Clone, PartialEq)]
pub enum Subgoal {
    /// The control `key` (its `data-rla`) holds `want`.
    Field {
        key: String,
        control: Control,
        want: Want,
    },
    /// Signed in (the `signin` button pressed with the right credentials).
    SignedIn,
    /// The page `view` is shown (navigation: the path of views from home).
    View { path: Vec<String> },
    /// The episode ended by pressing the control `key` (every `data-final` control ends it).
    Final { key: String },
}

/// A task made from its spec.
#[derive(Debug, Clone)]
pub struct Task {
    pub spec: Spec,
    pub instruction: String,
    pub html: String,
    pub goal: Vec<Subgoal>,
    /// The texts `type` may enter (the values asked for and decoys), sorted.
    pub typeable: Vec<String>,
    /// The step budget.
    pub budget: u32,
}

/// Picks `n` distinct items of `from` (in the order drawn).
fn pick<T: Copy>(rng: &mut Rng, from: &[T], n: usize) -> Vec<T> {
    let mut pool: Vec<T> = from.to_vec();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n.min(pool.len()) {
        let i = (rng.next_u64() % pool.len() as u64) as usize;
        out.push(pool.remove(i));
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn js(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// The page's script: state in `window.__rla`, read by `window.__rla.state()`.
const SCRIPT: &str = r#"
window.__rla = { view: null, done: false, final: null, signed_in: false, message: null };
window.__rla.state = function () {
  const f = {};
  document.querySelectorAll('[data-rla]').forEach(function (e) {
    const k = e.dataset.rla;
    if (e.type === 'checkbox') f[k] = e.checked;
    else if (e.tagName === 'SELECT') f[k] = e.selectedIndex < 0 ? '' : e.options[e.selectedIndex].text;
    else if (e.tagName === 'INPUT') f[k] = e.value;
  });
  return { view: window.__rla.view, done: window.__rla.done, final: window.__rla.final,
           signed_in: window.__rla.signed_in, fields: f };
};
function rlaShow(v) {
  document.querySelectorAll('[data-view]').forEach(function (e) {
    e.style.display = e.dataset.view === v ? '' : 'none';
  });
  window.__rla.view = v;
}
function rlaFinal(k) {
  if (window.__rla.done) return false;
  window.__rla.done = true;
  window.__rla.final = k;
  return false;
}
document.addEventListener('click', function (ev) {
  const t = ev.target.closest('[data-final]');
  if (t) { ev.preventDefault(); rlaFinal(t.dataset.rla); }
  const n = ev.target.closest('[data-go]');
  if (n) { ev.preventDefault(); rlaShow(n.dataset.go); }
});
document.addEventListener('submit', function (ev) { ev.preventDefault(); rlaFinal('submit'); });
"#;

fn page(title: &str, body: &str, first_view: Option<&str>, extra_script: &str) -> String {
    let show = first_view.map_or(String::new(), |v| format!("rlaShow({});", js(v)));
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\
         <style>body{{font-family:sans-serif;margin:16px}}button,input,select{{margin:4px}}\
         td,th{{padding:2px 8px}}</style></head><body>{body}<script>{SCRIPT}{extra_script}{show}</script>\
         </body></html>",
        esc(title)
    )
}

impl Task {
    pub fn parse(spec: &Value) -> Result<Task> {
        Task::make(Spec::parse(spec)?)
    }

    pub fn make(spec: Spec) -> Result<Task> {
        spec.check()?;
        let mut rng = Rng::new(derive_seed(spec.seed, &["web", &spec.family]));
        let mut task = match spec.family.as_str() {
            "click_button" => click_button(&spec, &mut rng),
            "fill_form" => fill_form(&spec, &mut rng),
            "pick_row" => pick_row(&spec, &mut rng),
            "navigate" => navigate(&spec, &mut rng),
            "login_setting" => login_setting(&spec, &mut rng),
            other => return Err(err(format!("no family {other:?}"))),
        };
        task.typeable.sort();
        task.typeable.dedup();
        Ok(task)
    }

    /// The verifier: a JavaScript predicate over `window.__rla.state()`.
    pub fn verifier(&self) -> String {
        let mut terms = vec!["s.done".to_string()];
        for g in &self.goal {
            terms.push(match g {
                Subgoal::Field { key, want, .. } => match want {
                    Want::Text(t) => format!("s.fields[{}] === {}", js(key), js(t)),
                    Want::Checked(b) => format!("s.fields[{}] === {b}", js(key)),
                },
                Subgoal::SignedIn => "s.signed_in === true".into(),
                // The view a final control was pressed on.
                Subgoal::View { path } => format!("s.view === {}", js(&path.join("/"))),
                Subgoal::Final { key } => format!("s.final === {}", js(key)),
            });
        }
        format!("(function (s) {{ return {}; }})", terms.join(" && "))
    }

    /// Subgoals not met in `state` (the page's `window.__rla.state()`), counting a navigation
    /// subgoal as the clicks it still needs: the planner's remaining plan length, less the
    /// final press.
    pub fn remaining(&self, state: &Value) -> u32 {
        let mut n = 0;
        for g in &self.goal {
            n += match g {
                Subgoal::Field { key, want, .. } => u32::from(!holds(state, key, want)),
                Subgoal::SignedIn => u32::from(state["signed_in"] != Value::Bool(true)),
                Subgoal::View { path } => {
                    let at = state["view"].as_str().unwrap_or("");
                    nav_distance(at, &path.join("/"))
                }
                Subgoal::Final { key } => u32::from(state["final"].as_str() != Some(key.as_str())),
            };
        }
        n
    }
}

pub fn holds(state: &Value, key: &str, want: &Want) -> bool {
    let v = &state["fields"][key];
    match want {
        Want::Text(t) => v.as_str() == Some(t.as_str()),
        Want::Checked(b) => v.as_bool() == Some(*b),
    }
}

/// Clicks from view `at` to view `to` in the navigation tree (views are paths from `home`):
/// up to the common ancestor (one `back` click each), then down.
pub fn nav_distance(at: &str, to: &str) -> u32 {
    let a: Vec<&str> = at.split('/').collect();
    let b: Vec<&str> = to.split('/').collect();
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    (a.len() - common + b.len() - common) as u32
}

fn final_goal(key: &str) -> Subgoal {
    Subgoal::Final { key: key.into() }
}

fn click_button(spec: &Spec, rng: &mut Rng) -> Task {
    let labels = pick(rng, &WORDS, spec.elements as usize);
    let target = labels[(rng.next_u64() % labels.len() as u64) as usize];
    let body: String = labels
        .iter()
        .map(|l| format!("<button data-rla=\"{0}\" data-final>{0}</button>", esc(l)))
        .collect();
    Task {
        spec: spec.clone(),
        instruction: format!("Click the button \"{target}\"."),
        html: page("Buttons", &body, None, ""),
        goal: vec![final_goal(target)],
        typeable: Vec::new(),
        budget: 3,
    }
}

fn fill_form(spec: &Spec, rng: &mut Rng) -> Task {
    let asked = spec.fields as usize;
    let n = asked + spec.distractors as usize;
    // Text fields first; one in three forms asks for a select and one for a checkbox too.
    let with_select = rng.range(0, 2) == 0;
    let with_box = rng.range(0, 2) == 0;
    let labels = pick(rng, &LABELS, n);
    let values = pick(rng, &WORDS, n + 2);
    let mut goal = Vec::new();
    let mut body = String::from("<form><h1>Details</h1>");
    let mut asks = Vec::new();
    // Which of the n fields are asked for: the first `asked` of a shuffled order.
    let order = pick(rng, &labels, n);
    for (i, label) in labels.iter().enumerate() {
        let key = format!("field{i}");
        body.push_str(&format!(
            "<p><label for=\"{key}\">{0}</label><input id=\"{key}\" type=\"text\" data-rla=\"{key}\"></p>",
            esc(label)
        ));
        if order[..asked].contains(label) {
            goal.push(Subgoal::Field {
                key: key.clone(),
                control: Control::TextField,
                want: Want::Text(values[i].into()),
            });
            asks.push(format!("{label} \"{}\"", values[i]));
        }
    }
    if with_select {
        let (name, options) = CHOICES[rng.range(0, CHOICES.len() as u32 - 1) as usize];
        let want = options[rng.range(1, 3) as usize];
        body.push_str(&format!(
            "<p><label for=\"choice\">{name}</label><select id=\"choice\" data-rla=\"choice\">{}</select></p>",
            options
                .iter()
                .map(|o| format!("<option>{o}</option>"))
                .collect::<String>()
        ));
        goal.push(Subgoal::Field {
            key: "choice".into(),
            control: Control::Select,
            want: Want::Text(want.into()),
        });
        asks.push(format!("{name} \"{want}\""));
    }
    if with_box {
        let name = BOXES[rng.range(0, BOXES.len() as u32 - 1) as usize];
        body.push_str(&format!(
            "<p><input id=\"box\" type=\"checkbox\" data-rla=\"box\"><label for=\"box\">{name}</label></p>"
        ));
        goal.push(Subgoal::Field {
            key: "box".into(),
            control: Control::Checkbox,
            want: Want::Checked(true),
        });
        asks.push(format!("tick \"{name}\""));
    }
    body.push_str("<button type=\"submit\" data-rla=\"submit\">Submit</button></form>");
    goal.push(final_goal("submit"));
    // Values offered for typing: the ones asked for, and `distractors` + 1 decoys.
    let mut typeable: Vec<String> = goal
        .iter()
        .filter_map(|g| match g {
            Subgoal::Field {
                control: Control::TextField,
                want: Want::Text(t),
                ..
            } => Some(t.clone()),
            _ => None,
        })
        .collect();
    typeable.extend(
        values[n..]
            .iter()
            .chain(values[asked..n].iter())
            .take(spec.distractors as usize + 1)
            .map(|s| s.to_string()),
    );
    let steps = goal.len() as u32;
    Task {
        spec: spec.clone(),
        instruction: format!("Fill in the form: {}; then submit it.", asks.join(", ")),
        html: page("Form", &body, None, ""),
        goal,
        typeable,
        budget: steps + 2,
    }
}

fn pick_row(spec: &Spec, rng: &mut Rng) -> Task {
    let items = pick(rng, &ITEMS, spec.elements as usize);
    // Distinct prices so that "cheapest" has one answer.
    let mut prices: Vec<u32> = Vec::new();
    while prices.len() < items.len() {
        let p = rng.range(2, 60);
        if !prices.contains(&p) {
            prices.push(p);
        }
    }
    let stock: Vec<bool> = (0..items.len()).map(|_| rng.range(0, 3) != 0).collect();
    let kind = rng.range(0, 3);
    let (instruction, answer) = match kind {
        0 => {
            let i = (rng.next_u64() % items.len() as u64) as usize;
            (format!("Choose the {}.", items[i]), i)
        }
        1 => {
            let i = (0..items.len()).min_by_key(|&i| prices[i]).unwrap();
            ("Choose the cheapest item.".into(), i)
        }
        2 => {
            let i = (0..items.len()).max_by_key(|&i| prices[i]).unwrap();
            ("Choose the most expensive item.".into(), i)
        }
        _ => match (0..items.len())
            .filter(|&i| stock[i])
            .min_by_key(|&i| prices[i])
        {
            Some(i) => ("Choose the cheapest item in stock.".into(), i),
            None => {
                let i = (0..items.len()).min_by_key(|&i| prices[i]).unwrap();
                ("Choose the cheapest item.".into(), i)
            }
        },
    };
    let mut body =
        String::from("<table><tr><th>item</th><th>price</th><th>in stock</th><th></th></tr>");
    for (i, item) in items.iter().enumerate() {
        body.push_str(&format!(
            "<tr><td>{item}</td><td>{} dollars</td><td>{}</td>\
             <td><button data-rla=\"row{i}\" data-final>choose</button></td></tr>",
            prices[i],
            if stock[i] { "yes" } else { "no" }
        ));
    }
    body.push_str("</table>");
    Task {
        spec: spec.clone(),
        instruction,
        html: page("Shop", &body, None, ""),
        goal: vec![final_goal(&format!("row{answer}"))],
        typeable: Vec::new(),
        budget: 3,
    }
}

fn navigate(spec: &Spec, rng: &mut Rng) -> Task {
    // A tree of views `pages` deep below home, `elements` links per view (at most the
    // sections there are); the target is one leaf path; every leaf has a confirm button.
    let fanout = spec.elements.min(4) as usize;
    let depth = spec.pages as usize;
    let mut views: Vec<Vec<String>> = vec![vec!["home".into()]];
    let mut body = String::new();
    let mut frontier = vec![vec!["home".to_string()]];
    for _ in 0..depth {
        let mut next = Vec::new();
        for v in &frontier {
            let names = pick(rng, &SECTIONS, fanout);
            for n in names {
                let mut c = v.clone();
                c.push(n.to_string());
                next.push(c);
            }
        }
        views.extend(next.iter().cloned());
        frontier = next;
    }
    let target = frontier[(rng.next_u64() % frontier.len() as u64) as usize].clone();
    for v in &views {
        let id = v.join("/");
        let title = v.last().unwrap();
        let mut inner = format!("<h1>{title}</h1>");
        if v.len() > 1 {
            inner.push_str(&format!(
                "<p><a href=\"#\" data-rla=\"back:{id}\" data-go=\"{}\">back</a></p>",
                v[..v.len() - 1].join("/")
            ));
        }
        let children: Vec<&Vec<String>> = views
            .iter()
            .filter(|c| c.len() == v.len() + 1 && c[..v.len()] == v[..])
            .collect();
        for c in &children {
            inner.push_str(&format!(
                "<p><a href=\"#\" data-rla=\"go:{0}\" data-go=\"{0}\">{1}</a></p>",
                c.join("/"),
                c.last().unwrap()
            ));
        }
        if children.is_empty() {
            inner.push_str(&format!(
                "<button data-rla=\"confirm:{id}\" data-final>confirm</button>"
            ));
        }
        body.push_str(&format!("<div data-view=\"{id}\">{inner}</div>"));
    }
    let key = format!("confirm:{}", target.join("/"));
    Task {
        spec: spec.clone(),
        instruction: format!("Go to {} and press confirm.", target[1..].join(" > ")),
        html: page("Site", &body, Some("home"), ""),
        goal: vec![
            Subgoal::View {
                path: target.clone(),
            },
            final_goal(&key),
        ],
        typeable: Vec::new(),
        budget: 2 * depth as u32 + 3,
    }
}

fn login_setting(spec: &Spec, rng: &mut Rng) -> Task {
    let words = pick(rng, &WORDS, 2 + spec.distractors as usize + 1);
    let (user, pass) = (words[0], format!("{}{}", words[1], rng.range(1, 9)));
    let n = (spec.fields as usize + 1).min(BOXES.len());
    let boxes = pick(rng, &BOXES, n);
    let start: Vec<bool> = (0..n).map(|_| rng.range(0, 1) == 1).collect();
    let changed = pick(rng, &(0..n).collect::<Vec<usize>>(), spec.fields as usize);
    let mut goal = vec![
        Subgoal::Field {
            key: "user".into(),
            control: Control::TextField,
            want: Want::Text(user.into()),
        },
        Subgoal::Field {
            key: "pass".into(),
            control: Control::TextField,
            want: Want::Text(pass.clone()),
        },
        Subgoal::SignedIn,
    ];
    let mut asks = Vec::new();
    let mut settings = String::new();
    for (i, name) in boxes.iter().enumerate() {
        let key = format!("set{i}");
        let checked = if start[i] { " checked" } else { "" };
        settings.push_str(&format!(
            "<p><input id=\"{key}\" type=\"checkbox\" data-rla=\"{key}\"{checked}><label for=\"{key}\">{name}</label></p>"
        ));
        if changed.contains(&i) {
            goal.push(Subgoal::Field {
                key: key.clone(),
                control: Control::Checkbox,
                want: Want::Checked(!start[i]),
            });
            asks.push(format!(
                "turn {} \"{name}\"",
                if start[i] { "off" } else { "on" }
            ));
        } else {
            goal.push(Subgoal::Field {
                key: key.clone(),
                control: Control::Checkbox,
                want: Want::Checked(start[i]),
            });
        }
    }
    goal.push(final_goal("save"));
    let body = format!(
        "<div data-view=\"login\"><h1>sign in</h1>\
         <p><label for=\"user\">username</label><input id=\"user\" type=\"text\" data-rla=\"user\"></p>\
         <p><label for=\"pass\">password</label><input id=\"pass\" type=\"text\" data-rla=\"pass\"></p>\
         <button data-rla=\"signin\" onclick=\"rlaSignIn()\">sign in</button><p id=\"msg\"></p></div>\
         <div data-view=\"settings\"><h1>settings</h1>{settings}\
         <button data-rla=\"save\" data-final>save</button></div>"
    );
    let script = format!(
        "function rlaSignIn() {{ if (document.getElementById('user').value === {} && \
         document.getElementById('pass').value === {}) {{ window.__rla.signed_in = true; rlaShow('settings'); }} \
         else {{ document.getElementById('msg').textContent = 'wrong username or password'; }} }}",
        js(user),
        js(&pass)
    );
    let mut typeable = vec![user.to_string(), pass.clone()];
    typeable.extend(words[2..].iter().map(|s| s.to_string()));
    let steps = 4 + spec.fields;
    Task {
        spec: spec.clone(),
        instruction: format!(
            "Sign in as \"{user}\" with password \"{pass}\", then {} and save.",
            asks.join(", ")
        ),
        html: page("Account", &body, Some("login"), &script),
        goal,
        typeable,
        budget: steps + 2,
    }
}

/// The words of observations and actions (for the built-in tokenizer).
pub fn vocabulary() -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for list in [
        &WORDS[..],
        &LABELS[..],
        &BOXES[..],
        &ITEMS[..],
        &SECTIONS[..],
    ] {
        for w in list {
            v.extend(w.split(' ').map(str::to_string));
        }
    }
    for (name, options) in CHOICES {
        v.push(name.to_string());
        v.extend(options.iter().map(|o| o.to_string()));
    }
    v.extend(
        [
            "task",
            "page",
            "text",
            "heading",
            "button",
            "link",
            "textbox",
            "combobox",
            "checkbox",
            "checked",
            "unchecked",
            "value",
            "options",
            "row",
            "cell",
            "columnheader",
            "click",
            "type",
            "select",
            "check",
            "submit",
            "choose",
            "confirm",
            "back",
            "home",
            "save",
            "sign",
            "in",
            "as",
            "with",
            "password",
            "username",
            "the",
            "and",
            "then",
            "fill",
            "form",
            "go",
            "to",
            "press",
            "turn",
            "on",
            "off",
            "tick",
            "item",
            "price",
            "dollars",
            "stock",
            "yes",
            "no",
            "cheapest",
            "most",
            "expensive",
            "details",
            "wrong",
            "or",
            "it",
            "buttons",
            "shop",
            "site",
            "account",
            "settings",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    v.extend((0..=99).map(|i| i.to_string()));
    // The punctuation of the tree and the actions (`[3] button "save"`, `type(1, "alder")`,
    // `value=""`, "Task:", "a > b"): the word tokenizer makes each a word of its own, and
    // unknown they would all be one `<unk>`.
    v.extend(
        [
            "\"", "(", ")", "[", "]", ",", ".", ":", ";", "=", ">", "'", "-", "/",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    // Passwords (`login_setting`): a word and a digit, one token each.
    v.extend(
        WORDS
            .iter()
            .flat_map(|w| (0..=9).map(move |d| format!("{w}{d}"))),
    );
    v.sort();
    v.dedup();
    v
}

/// `count` specs of the given families and knob ranges, from `seed`.
pub fn sample(rng: &mut Rng, families: &[String], knobs: &Knobs) -> Spec {
    let family = families[(rng.next_u64() % families.len() as u64) as usize].clone();
    Spec {
        family,
        seed: rng.next_u64() >> 16,
        elements: knobs.elements,
        fields: knobs.fields,
        pages: knobs.pages,
        distractors: knobs.distractors,
    }
}

/// The difficulty knobs of generated tasks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Knobs {
    pub elements: u32,
    pub fields: u32,
    pub pages: u32,
    pub distractors: u32,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            elements: 4,
            fields: 2,
            pages: 2,
            distractors: 1,
        }
    }
}

impl Knobs {
    /// The value of a knob by its name ([`KNOBS`]).
    pub fn get(&self, name: &str) -> u32 {
        match name {
            "elements" => self.elements,
            "fields" => self.fields,
            "pages" => self.pages,
            "distractors" => self.distractors,
            other => panic!("{other:?} is not a knob"),
        }
    }

    /// The knobs outside their bounds ([`KNOBS`]), in its order: (name, value, least, most).
    pub fn outside(&self) -> Vec<(&'static str, u32, u32, u32)> {
        KNOBS
            .iter()
            .map(|&(k, lo, hi, _, _)| (k, self.get(k), lo, hi))
            .filter(|&(_, v, lo, hi)| !(lo..=hi).contains(&v))
            .collect()
    }

    /// `level` steps harder (positive) or easier (negative), within the bounds.
    pub fn shifted(&self, level: i32) -> Knobs {
        let s = |k: &str| {
            let (lo, hi) = bounds(k);
            (self.get(k) as i32 + level).clamp(lo as i32, hi as i32) as u32
        };
        Knobs {
            elements: s("elements"),
            fields: s("fields"),
            pages: s("pages"),
            distractors: s("distractors"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(family: &str, seed: u64) -> Spec {
        let k = Knobs::default();
        Spec {
            family: family.into(),
            seed,
            elements: k.elements,
            fields: k.fields,
            pages: k.pages,
            distractors: k.distractors,
        }
    }

    /// The small transformer's word-level tokenizer knows every word a task's instruction,
    /// its typeable values and its page's visible text are made of (an unknown word, e.g. a
    /// password, is `<unk>` to it and cannot be told from the decoys).
    #[test]
    fn every_word_of_a_task_is_in_the_vocabulary() {
        let tok = crate::model::tokenizer::Tokenizer::words(&vocabulary());
        let unk = tok.special(crate::model::tokenizer::UNK);
        let words = |text: &str| -> Vec<String> {
            text.split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .map(str::to_lowercase)
                .collect()
        };
        for f in FAMILIES {
            for seed in 0..40 {
                let mut s = spec(f, seed);
                (s.elements, s.fields, s.pages, s.distractors) =
                    (MAX_ELEMENTS, MAX_FIELDS, MAX_PAGES, MAX_DISTRACTORS);
                let t = Task::make(s).unwrap();
                // The page's visible text: what is between the body's tags, less the script.
                let body = t.html.split("<body>").nth(1).unwrap();
                let body = body.split("<script>").next().unwrap();
                let visible: String = body
                    .split('<')
                    .filter_map(|x| x.split_once('>').map(|(_, text)| text))
                    .collect::<Vec<_>>()
                    .join(" ");
                let text = format!("{} {} {visible}", t.instruction, t.typeable.join(" "));
                for w in words(&text) {
                    assert_ne!(tok.encode(&w), vec![unk], "{f} {seed}: {w:?} in {text}");
                }
            }
        }
    }

    #[test]
    fn the_same_spec_makes_the_same_page_and_others_differ() {
        for f in FAMILIES {
            let a = Task::make(spec(f, 1)).unwrap();
            let b = Task::make(spec(f, 1)).unwrap();
            let c = Task::make(spec(f, 2)).unwrap();
            assert_eq!(a.html, b.html, "{f}");
            assert_eq!(a.instruction, b.instruction, "{f}");
            assert!(a.html != c.html || a.instruction != c.instruction, "{f}");
            assert!(matches!(a.goal.last(), Some(Subgoal::Final { .. })), "{f}");
            assert!(a.budget as usize >= a.goal.len(), "{f}");
        }
    }

    #[test]
    fn specs_out_of_bounds_are_refused_naming_the_knob() {
        let mut s = spec("navigate", 1);
        s.pages = 9;
        let e = Task::make(s).unwrap_err().to_string();
        assert!(e.contains("pages = 9"), "{e}");
        let e = Spec::parse(&serde_json::json!({"family": "dance", "seed": 1}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("dance"), "{e}");
        // Knobs left out take their defaults (4 elements, 1 field, 1 page, no distractors).
        let d = Spec::parse(&serde_json::json!({"family": "pick_row", "seed": 1})).unwrap();
        assert_eq!((d.elements, d.fields, d.pages, d.distractors), (4, 1, 1, 0));
        let e = Spec::parse(&serde_json::json!({"family": "navigate", "seed": 1, "x": 2}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field"), "{e}");
    }

    /// What the schema tells an environment model is what `Spec::parse` accepts: each knob's
    /// default is the one a spec without it gets, its bounds are accepted and one past them is
    /// refused naming the knob, and no other key is.
    #[test]
    fn the_schema_says_what_parse_accepts() {
        let schema = schema();
        assert_eq!(schema["additionalProperties"], false);
        let props = schema["properties"].as_object().unwrap();
        let bare = Spec::parse(&serde_json::json!({"family": "fill_form", "seed": 3})).unwrap();
        for (k, p) in props.iter().filter(|(_, p)| p["type"] == "integer") {
            if k == "seed" {
                continue;
            }
            let (lo, hi) = (
                p["minimum"].as_u64().unwrap(),
                p["maximum"].as_u64().unwrap(),
            );
            assert_eq!(
                u64::from(bare.knobs().get(k)),
                p["default"].as_u64().unwrap(),
                "{k}"
            );
            let with = |v: u64| {
                let mut x = bare.to_value();
                x[k.as_str()] = v.into();
                Spec::parse(&x)
            };
            assert!(with(lo).is_ok() && with(hi).is_ok(), "{k}");
            let e = with(hi + 1).unwrap_err().to_string();
            assert!(e.contains(&format!("{k} = {}", hi + 1)), "{e}");
            if lo > 0 {
                assert!(with(lo - 1).is_err(), "{k}");
            }
        }
        let keys: Vec<&String> = props.keys().collect();
        assert_eq!(
            keys,
            bare.to_value()
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>()
        );
        let families: Vec<&str> = props["family"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        assert_eq!(families, FAMILIES);
    }

    #[test]
    fn navigation_distance_goes_up_then_down() {
        assert_eq!(nav_distance("home", "home/a/b"), 2);
        assert_eq!(nav_distance("home/a/c", "home/a/b"), 2);
        assert_eq!(nav_distance("home/x", "home/a/b"), 3);
        assert_eq!(nav_distance("home/a/b", "home/a/b"), 0);
    }

    #[test]
    fn the_verifier_names_every_subgoal() {
        let t = Task::make(spec("login_setting", 3)).unwrap();
        let v = t.verifier();
        assert!(
            v.contains("s.signed_in === true") && v.contains("s.final === \"save\""),
            "{v}"
        );
        assert_eq!(v.matches("s.fields[").count(), 2 + 3, "{v}");
    }
}
