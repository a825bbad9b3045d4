//! The accessibility tree as the agent's text: `Accessibility.getFullAXTree`'s nodes pruned to
//! what a user reads and acts on (BrowserGym's and OSWorld's accessibility-tree mode), each
//! actionable node with an id `[N]` numbered in tree order, and the actions the tree allows.
//!
//! Printed: headings, text, table rows and cells, and the controls (buttons, links, text fields,
//! selects with their options, checkboxes) with their labels, values and states; a control's
//! own children (its label text, a select's option list) are folded into its line. Hidden parts
//! (another view of the page) are not in the tree at all.

use std::collections::HashMap;

use serde_json::Value;

/// An actionable node of one observation.
#[derive(Debug, Clone, PartialEq)]
pub struct Actionable {
    /// Its number in the observation (`[N]`).
    pub id: u32,
    pub role: String,
    pub name: String,
    /// The DOM node behind it (what the actions act on).
    pub backend: i64,
    /// A select's options (in order).
    pub options: Vec<String>,
}

/// One read of the tree: the text and the nodes the agent may act on.
#[derive(Debug, Clone, PartialEq)]
pub struct Tree {
    pub text: String,
    pub actionable: Vec<Actionable>,
}

const CONTROLS: [&str; 8] = [
    "button",
    "link",
    "textbox",
    "searchbox",
    "combobox",
    "checkbox",
    "radio",
    "switch",
];
const NAMED: [&str; 5] = ["heading", "cell", "columnheader", "rowheader", "gridcell"];

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k]["value"].as_str().unwrap_or("")
}

fn prop<'a>(node: &'a Value, name: &str) -> Option<&'a Value> {
    node["properties"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)
        .map(|p| &p["value"]["value"])
}

fn quote(t: &str) -> String {
    format!("\"{}\"", t.replace('"', "'"))
}

/// Prune and number the tree (`nodes` as `Accessibility.getFullAXTree` returns them).
pub fn render(nodes: &[Value]) -> Tree {
    let by_id: HashMap<&str, &Value> = nodes
        .iter()
        .filter_map(|n| n["nodeId"].as_str().map(|id| (id, n)))
        .collect();
    let root = nodes
        .iter()
        .find(|n| n.get("parentId").is_none())
        .or_else(|| nodes.first());
    let mut tree = Tree {
        text: String::new(),
        actionable: Vec::new(),
    };
    if let Some(root) = root {
        walk(root, &by_id, 0, &mut tree);
    }
    tree
}

fn children<'a>(node: &Value, by_id: &HashMap<&str, &'a Value>) -> Vec<&'a Value> {
    node["childIds"]
        .as_array()
        .map(|ids| {
            ids.iter()
                .filter_map(|i| i.as_str().and_then(|i| by_id.get(i).copied()))
                .collect()
        })
        .unwrap_or_default()
}

fn descendants<'a>(node: &Value, by_id: &HashMap<&str, &'a Value>, out: &mut Vec<&'a Value>) {
    for c in children(node, by_id) {
        out.push(c);
        descendants(c, by_id, out);
    }
}

fn walk(node: &Value, by_id: &HashMap<&str, &Value>, depth: usize, tree: &mut Tree) {
    let ignored = node["ignored"].as_bool().unwrap_or(false);
    let role = s(node, "role");
    let name = s(node, "name").trim();
    let pad = "  ".repeat(depth);
    if !ignored && CONTROLS.contains(&role) {
        let id = tree.actionable.len() as u32 + 1;
        let mut line = format!("{pad}[{id}] {role} {}", quote(name));
        let mut options = Vec::new();
        match role {
            "textbox" | "searchbox" => {
                line.push_str(&format!(" value={}", quote(s(node, "value"))));
            }
            "combobox" => {
                let mut all = Vec::new();
                descendants(node, by_id, &mut all);
                options = all
                    .iter()
                    .filter(|n| s(n, "role") == "option")
                    .map(|n| s(n, "name").trim().to_string())
                    .collect();
                line.push_str(&format!(
                    " value={} options: {}",
                    quote(s(node, "value")),
                    options.join(", ")
                ));
            }
            "checkbox" | "radio" | "switch" => {
                let on = prop(node, "checked").and_then(Value::as_str) == Some("true");
                line.push_str(if on { " checked" } else { " unchecked" });
            }
            _ => {}
        }
        tree.text.push_str(&line);
        tree.text.push('\n');
        tree.actionable.push(Actionable {
            id,
            role: role.to_string(),
            name: name.to_string(),
            backend: node["backendDOMNodeId"].as_i64().unwrap_or(-1),
            options,
        });
        return;
    }
    let mut next = depth;
    if !ignored {
        if NAMED.contains(&role) && !name.is_empty() {
            // A heading or cell: its name says it; a control inside a cell still counts.
            let mut inner = Vec::new();
            descendants(node, by_id, &mut inner);
            let has_control = inner.iter().any(|n| {
                !n["ignored"].as_bool().unwrap_or(false) && CONTROLS.contains(&s(n, "role"))
            });
            if !has_control {
                tree.text
                    .push_str(&format!("{pad}{role} {}\n", quote(name)));
                return;
            }
        }
        if role == "StaticText" && !name.is_empty() {
            tree.text.push_str(&format!("{pad}text {}\n", quote(name)));
            return;
        }
        if role == "row" {
            tree.text.push_str(&format!("{pad}row\n"));
            next = depth + 1;
        }
        if role == "RootWebArea" {
            tree.text.push_str(&format!("page {}\n", quote(name)));
            next = depth + 1;
        }
    }
    for c in children(node, by_id) {
        walk(c, by_id, next, tree);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(id: &str, role: &str, name: &str, kids: &[&str], backend: i64) -> Value {
        json!({"nodeId": id, "ignored": false, "role": {"type": "role", "value": role},
               "name": {"type": "computedString", "value": name},
               "childIds": kids, "backendDOMNodeId": backend})
    }

    #[test]
    fn controls_are_numbered_in_tree_order_with_values_and_states() {
        let mut nodes = vec![
            node("1", "RootWebArea", "Form", &["2", "3", "4", "5", "8"], 1),
            node("2", "heading", "details", &["9"], 2),
            node("3", "textbox", "city", &[], 3),
            node("4", "checkbox", "terms", &[], 4),
            node("5", "combobox", "size", &["6"], 5),
            node("6", "MenuListPopup", "", &["7", "10"], 6),
            node("7", "option", "small", &[], 7),
            node("8", "button", "Submit", &["11"], 8),
            node("9", "StaticText", "details", &[], 9),
            node("10", "option", "large", &[], 10),
            node("11", "StaticText", "Submit", &[], 11),
        ];
        nodes[2]["value"] = json!({"type": "string", "value": "oslo"});
        nodes[3]["properties"] =
            json!([{"name": "checked", "value": {"type": "tristate", "value": "true"}}]);
        nodes[4]["value"] = json!({"type": "string", "value": "small"});
        for n in nodes.iter_mut().skip(1) {
            n["parentId"] = json!("x");
        }
        let t = render(&nodes);
        assert_eq!(
            t.text,
            "page \"Form\"\n  heading \"details\"\n  [1] textbox \"city\" value=\"oslo\"\n  \
             [2] checkbox \"terms\" checked\n  [3] combobox \"size\" value=\"small\" options: small, large\n  \
             [4] button \"Submit\"\n"
        );
        assert_eq!(t.actionable.len(), 4);
        assert_eq!(t.actionable[2].options, ["small", "large"]);
        assert_eq!(t.actionable[3].backend, 8);
    }

    #[test]
    fn ignored_nodes_are_transparent_and_hidden_text_is_not_printed() {
        let mut nodes = vec![
            node("1", "RootWebArea", "P", &["2"], 1),
            node("2", "generic", "", &["3", "4"], 2),
            node("3", "StaticText", "hello", &[], 3),
            node("4", "link", "back", &[], 4),
        ];
        nodes[1]["ignored"] = json!(true);
        for n in nodes.iter_mut().skip(1) {
            n["parentId"] = json!("x");
        }
        let t = render(&nodes);
        assert_eq!(
            t.text,
            "page \"P\"\n  text \"hello\"\n  [1] link \"back\"\n"
        );
    }
}
