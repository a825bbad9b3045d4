//! rla-pipe: RLAnything-style reinforcement learning as a staged dataflow.
//!
//! The modules form one-way layers, and so do the files inside each (ARCHITECTURE.md; tests
//! check every `use crate::` and the file graph of every module):
//! - ground: [`determinism`] (seeds, Rng, canonical JSON), [`error`];
//! - data: [`schema`] (the Arrow schema of every table), [`store`] (object_store URLs, the layout,
//!   manifests, deterministic Parquet, the catalog of committed files, gc);
//! - components: [`env`] (environments), [`model`] (burn models), [`adapt`] (task adapters), each
//!   owning its config sections;
//! - [`config`]: aggregates the sections, loading, `--set`, hashing;
//! - [`sql`]: the read-only query session of `rla-pipe sql`;
//! - [`stage`]: the stage contract both the engine and the stages depend on;
//! - [`stages`] (one file per stage, SQL beside them) and [`engine`] (DAG runner, resume,
//!   replay), neither importing the other;
//! - [`pipeline`]: the registry that assembles a config's DAG;
//! - [`report`], [`cli`] (clap only).

pub mod adapt;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod determinism;
pub mod engine;
pub mod env;
pub mod error;
#[cfg(feature = "polars")]
pub mod frames;
pub mod model;
pub mod pipeline;
pub mod report;
pub mod sandbox;
pub mod schema;
pub mod sql;
pub mod stage;
pub mod stages;
pub mod store;

pub use error::{Error, Result};

#[cfg(test)]
mod architecture {
    //! ARCHITECTURE.md's layering, checked against the source.
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    /// module → (rank from the top, modules it may use), read from ARCHITECTURE.md's table.
    fn layers() -> BTreeMap<String, (usize, BTreeSet<String>)> {
        let text = include_str!("../ARCHITECTURE.md");
        let mut out = BTreeMap::new();
        for line in text.lines() {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            if cells.len() < 5 || !cells[1].starts_with('`') {
                continue;
            }
            let module = cells[1].trim_matches('`').to_string();
            let uses = cells[3]
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty() && *u != "—")
                .map(str::to_string)
                .collect();
            let rank = out.len();
            out.insert(module, (rank, uses));
        }
        out
    }

    fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                sources(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    type Layers = BTreeMap<String, (usize, BTreeSet<String>)>;

    /// The layering's own faults: a module missing from the table, or allowed to use one that
    /// is not below it.
    fn table_faults(layers: &Layers, top: &BTreeSet<String>) -> Vec<String> {
        let mut bad = Vec::new();
        for m in top {
            let Some((rank, uses)) = layers.get(m) else {
                bad.push(format!("ARCHITECTURE.md has no line for module `{m}`"));
                continue;
            };
            for u in uses {
                match layers.get(u) {
                    Some((below, _)) if below > rank => {}
                    _ => bad.push(format!("`{m}` may use `{u}`, which is not below it")),
                }
            }
        }
        bad
    }

    /// Every `crate::x` path (and `use crate::{x, ...}` group) of the given files (path under
    /// src/, text; test modules excepted) that the layering does not allow.
    fn import_faults(
        layers: &Layers,
        top: &BTreeSet<String>,
        files: &[(String, String)],
    ) -> Vec<String> {
        let mut bad = Vec::new();
        for (rel, text) in files {
            let own = rel.split('/').next().unwrap().trim_end_matches(".rs");
            if own == "lib" || own == "main" {
                continue;
            }
            let allowed = layers.get(own).map(|l| l.1.clone()).unwrap_or_default();
            let code = text.split("#[cfg(test)]").next().unwrap();
            for (n, line) in code.lines().enumerate() {
                let line = line.split("//").next().unwrap();
                let mut used: Vec<String> = line
                    .match_indices("crate::")
                    .map(|(i, _)| {
                        line[i + "crate::".len()..]
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect()
                    })
                    .collect();
                if let Some(group) = line.split("use crate::{").nth(1) {
                    used.extend(
                        group
                            .split([',', '}'])
                            .map(|s| s.trim().split("::").next().unwrap_or("").to_string()),
                    );
                }
                for u in used {
                    if top.contains(&u) && u != own && !allowed.contains(&u) {
                        bad.push(format!("src/{rel}:{}: `{own}` uses `{u}`", n + 1));
                    }
                }
            }
        }
        bad
    }

    /// Every source file under src/: (its path there, with `/`, and its text).
    fn source_files() -> Vec<(String, String)> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut paths = Vec::new();
        sources(&src, &mut paths);
        paths.sort();
        paths
            .iter()
            .map(|p| {
                let rel = p
                    .strip_prefix(&src)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                (rel, std::fs::read_to_string(p).unwrap())
            })
            .collect()
    }

    /// A file's code without its test module, comments and the insides of string and char
    /// literals (so that neither a doc line nor a message names a path).
    fn bare_code(text: &str) -> String {
        let code = text.split("#[cfg(test)]").next().unwrap();
        let b = code.as_bytes();
        let mut out = String::with_capacity(code.len());
        // Whether the byte before `i` continues a word.
        let word = |i: usize| i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            if c == b'/' && b.get(i + 1) == Some(&b'/') {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
                let end = code[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
                out.extend(code[i..end].chars().filter(|&c| c == '\n'));
                i = end;
            } else if c == b'r'
                && matches!(b.get(i + 1), Some(b'"' | b'#'))
                && (!word(i) || (b[i - 1] == b'b' && !word(i - 1)))
            {
                // A raw string: r"…", r#"…"#.
                let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
                if b.get(i + 1 + hashes) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                let close = format!("\"{}", "#".repeat(hashes));
                let start = i + 2 + hashes;
                let end = code[start..]
                    .find(&close)
                    .map_or(b.len(), |e| start + e + close.len());
                out.push_str("\"\"");
                out.extend(code[start..end].chars().filter(|&c| c == '\n'));
                i = end;
            } else if c == b'"' {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    } else if b[i] == b'\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
                out.push_str("\"\"");
                i += 1;
            } else if c == b'\'' {
                // A char literal ('x', '\n', '\''), or a lifetime ('a), left as it is.
                if b.get(i + 1) == Some(&b'\\') {
                    i += 2;
                    while i < b.len() && b[i] != b'\'' {
                        i += 1;
                    }
                    i += 1;
                    out.push_str("' '");
                } else if let Some(ch) = code[i + 1..].chars().next()
                    && code[i + 1 + ch.len_utf8()..].starts_with('\'')
                {
                    i += 2 + ch.len_utf8();
                    out.push_str("' '");
                } else {
                    out.push('\'');
                    i += 1;
                }
            } else {
                let ch = code[i..].chars().next().unwrap();
                out.push(ch);
                i += ch.len_utf8();
            }
        }
        out
    }

    /// A token of [`bare_code`]: an identifier, `::`, or one other character; with its line.
    fn tokens(code: &str) -> Vec<(String, usize)> {
        let mut out = Vec::new();
        let mut line = 1;
        let mut chars = code.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            if c == '\n' {
                line += 1;
            } else if c.is_alphanumeric() || c == '_' {
                let mut end = i + c.len_utf8();
                while let Some(&(j, d)) = chars.peek() {
                    if !(d.is_alphanumeric() || d == '_') {
                        break;
                    }
                    end = j + d.len_utf8();
                    chars.next();
                }
                out.push((code[i..end].trim_start_matches("r#").to_string(), line));
            } else if c == ':' && chars.peek().is_some_and(|&(_, d)| d == ':') {
                chars.next();
                out.push(("::".to_string(), line));
            } else if !c.is_whitespace() {
                out.push((c.to_string(), line));
            }
        }
        out
    }

    /// One leaf of a `use` tree: the name it binds (`*` for a glob) and its path.
    struct UseLeaf {
        name: String,
        path: Vec<String>,
        line: usize,
    }

    /// The leaves of the `use` tree starting at `t[*i]` (after `use`), up to its `;`.
    fn use_tree(t: &[(String, usize)], i: &mut usize, prefix: &[String], out: &mut Vec<UseLeaf>) {
        let mut path = prefix.to_vec();
        while *i < t.len() {
            let tok = t[*i].0.as_str();
            match tok {
                "::" => *i += 1,
                "{" => {
                    *i += 1;
                    while *i < t.len() && t[*i].0 != "}" {
                        use_tree(t, i, &path, out);
                        if *i < t.len() && t[*i].0 == "," {
                            *i += 1;
                        }
                    }
                    *i += 1;
                    return;
                }
                "*" => {
                    out.push(UseLeaf {
                        name: "*".into(),
                        path,
                        line: t[*i].1,
                    });
                    *i += 1;
                    return;
                }
                "," | "}" | ";" => {
                    if path.len() > prefix.len() {
                        if path.last().is_some_and(|l| l == "self") {
                            path.pop();
                        }
                        out.push(UseLeaf {
                            name: path.last().cloned().unwrap_or_default(),
                            path,
                            line: t[*i].1,
                        });
                    }
                    return;
                }
                "as" => {
                    let name = t.get(*i + 1).map(|x| x.0.clone()).unwrap_or_default();
                    if path.last().is_some_and(|l| l == "self") {
                        path.pop();
                    }
                    out.push(UseLeaf {
                        name,
                        path,
                        line: t[*i].1,
                    });
                    *i += 2;
                    return;
                }
                _ => {
                    path.push(tok.to_string());
                    *i += 1;
                }
            }
        }
    }

    /// What one source file declares and names.
    #[derive(Default)]
    struct FileFacts {
        /// Items defined here (fn, struct, enum, trait, type, const, static, inline mod, macro).
        defines: BTreeSet<String>,
        /// Names its `use` declarations bind, with their paths (globs under `*`).
        uses: Vec<UseLeaf>,
        /// Other paths of two or more segments (`a::b…`), with their lines.
        paths: Vec<(Vec<String>, usize)>,
    }

    fn facts(text: &str) -> FileFacts {
        let t = tokens(&bare_code(text));
        let mut f = FileFacts::default();
        let mut i = 0;
        while i < t.len() {
            let tok = t[i].0.as_str();
            let prev = if i > 0 { t[i - 1].0.as_str() } else { "" };
            let next = t.get(i + 1).map_or("", |x| x.0.as_str());
            if tok == "use" && prev != "::" {
                i += 1;
                use_tree(&t, &mut i, &[], &mut f.uses);
                continue;
            }
            if matches!(
                tok,
                "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union" | "mod"
            ) && next.starts_with(|c: char| c.is_alphabetic() || c == '_')
            {
                f.defines.insert(next.to_string());
            } else if tok == "macro_rules" && next == "!" {
                if let Some(name) = t.get(i + 2) {
                    f.defines.insert(name.0.clone());
                }
            } else if next == "::"
                && prev != "::"
                && tok.starts_with(|c: char| c.is_alphabetic() || c == '_')
            {
                let line = t[i].1;
                let mut path = vec![tok.to_string()];
                let mut j = i + 1;
                while j + 1 < t.len()
                    && t[j].0 == "::"
                    && t[j + 1]
                        .0
                        .starts_with(|c: char| c.is_alphabetic() || c == '_')
                {
                    path.push(t[j + 1].0.clone());
                    j += 2;
                }
                if path.len() > 1 {
                    f.paths.push((path, line));
                }
                i = j;
                continue;
            }
            i += 1;
        }
        f
    }

    /// The crate's files by module path (`engine/exec.rs` → `engine::exec`, `engine/mod.rs` →
    /// `engine`), with their facts.
    struct Crate {
        files: BTreeMap<Vec<String>, (String, FileFacts)>,
    }

    impl Crate {
        fn new(files: &[(String, String)]) -> Crate {
            let mut out = BTreeMap::new();
            for (rel, text) in files.iter().filter(|(rel, _)| rel != "main.rs") {
                let mut m: Vec<String> = rel
                    .trim_end_matches(".rs")
                    .split('/')
                    .map(str::to_string)
                    .collect();
                if matches!(m.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                    m.pop();
                }
                out.insert(m, (rel.clone(), facts(text)));
            }
            Crate { files: out }
        }

        /// Where the path `segs`, named in module `m`, starts: its first segment's module and
        /// the segments left; `None` for a path that leaves the crate or starts at a local name.
        fn start(&self, m: &[String], segs: &[String]) -> Option<(Vec<String>, usize)> {
            let mut at = m.to_vec();
            let mut k = 0;
            match segs.first()?.as_str() {
                "crate" => {
                    at.clear();
                    k = 1;
                }
                "self" => k = 1,
                "super" => {
                    while segs.get(k).is_some_and(|s| s == "super") {
                        at.pop()?;
                        k += 1;
                    }
                }
                first => {
                    let mut child = m.to_vec();
                    child.push(first.to_string());
                    if !self.files.contains_key(&child) {
                        // A module this file imported under a name of its own.
                        let (_, facts) = self.files.get(m)?;
                        let leaf = facts
                            .uses
                            .iter()
                            .find(|u| u.name == first && u.path[0] != first)?;
                        let (from, j) = self.start(m, &leaf.path)?;
                        let target = self.walk_modules(from, &leaf.path[j..])?;
                        if !self.files.contains_key(&target) {
                            return None;
                        }
                        return Some((target, 1));
                    }
                }
            }
            Some((at, k))
        }

        /// Follows `segs` through module files only; `None` if one is an item.
        fn walk_modules(&self, mut at: Vec<String>, segs: &[String]) -> Option<Vec<String>> {
            for s in segs {
                at.push(s.clone());
                if !self.files.contains_key(&at) {
                    return None;
                }
            }
            Some(at)
        }

        /// The file that defines what `segs` names, starting in module `at`: through child
        /// modules, then to the item's definition, following `use` re-exports. A path that ends
        /// at a module gives that module's file.
        fn resolve(&self, mut at: Vec<String>, segs: &[String], depth: usize) -> Option<String> {
            for s in segs {
                at.push(s.clone());
                if self.files.contains_key(&at) {
                    continue;
                }
                at.pop();
                let (rel, facts) = self.files.get(&at)?;
                if depth < 16 {
                    if let Some(leaf) = facts.uses.iter().find(|u| &u.name == s) {
                        // None: an item from outside the crate.
                        let (from, k) = self.start(&at, &leaf.path)?;
                        return self.resolve(from, &leaf.path[k..], depth + 1);
                    }
                    if !facts.defines.contains(s) {
                        for glob in facts.uses.iter().filter(|u| u.name == "*") {
                            let Some((from, k)) = self.start(&at, &glob.path) else {
                                continue;
                            };
                            let mut named = glob.path[k..].to_vec();
                            named.push(s.clone());
                            if let Some(found) = self.resolve(from, &named, depth + 1) {
                                return Some(found);
                            }
                        }
                    }
                }
                return Some(rel.clone());
            }
            self.files.get(&at).map(|(rel, _)| rel.clone())
        }

        /// Every file-level use inside one top-level module: (user, used) → the first place.
        fn edges(&self) -> BTreeMap<(String, String), String> {
            let mut out = BTreeMap::new();
            for (m, (rel, facts)) in &self.files {
                let Some(top) = m.first() else {
                    continue;
                };
                let mut named: Vec<(&[String], usize, bool)> = Vec::new();
                for u in &facts.uses {
                    named.push((&u.path, u.line, true));
                }
                for (p, line) in &facts.paths {
                    named.push((p, *line, false));
                }
                for (path, line, is_use) in named {
                    let Some((from, k)) = self.start(m, path) else {
                        continue;
                    };
                    if is_use && self.walk_modules(from.clone(), &path[k..]).is_some() {
                        // `use a::b;` of a module: its later paths (`b::x`) say what it uses.
                        continue;
                    }
                    let Some(used) = self.resolve(from, &path[k..], 0) else {
                        continue;
                    };
                    let within = used.split('/').next() == Some(top.as_str()) && used.contains('/');
                    if used != *rel && within {
                        out.entry((rel.clone(), used))
                            .or_insert_with(|| format!("src/{rel}:{line}: {}", path.join("::")));
                    }
                }
            }
            out
        }
    }

    /// The import cycles between the files of each top-level module: for every set of files that
    /// reach each other (a strongly connected component), its files and one shortest cycle
    /// through the first of them, each step with the line that makes it.
    fn file_cycles(files: &[(String, String)]) -> Vec<String> {
        let edges = Crate::new(files).edges();
        let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (a, b) in edges.keys() {
            next.entry(a).or_default().push(b);
        }
        // Breadth first from `start` through `allowed` files: each reached file's predecessor.
        let reach = |start: &str, allowed: &dyn Fn(&str) -> bool| {
            let mut back: BTreeMap<String, String> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([start.to_string()]);
            while let Some(a) = queue.pop_front() {
                for &b in next.get(a.as_str()).map(Vec::as_slice).unwrap_or(&[]) {
                    if allowed(b) && !back.contains_key(b) {
                        back.insert(b.to_string(), a.clone());
                        queue.push_back(b.to_string());
                    }
                }
            }
            back
        };
        let reached: BTreeMap<&str, BTreeMap<String, String>> =
            next.keys().map(|&a| (a, reach(a, &|_| true))).collect();
        let mut done: BTreeSet<String> = BTreeSet::new();
        let mut out = Vec::new();
        for (&start, from_start) in &reached {
            if done.contains(start) || !from_start.contains_key(start) {
                continue;
            }
            let scc: BTreeSet<String> = from_start
                .keys()
                .filter(|b| {
                    reached
                        .get(b.as_str())
                        .is_some_and(|r| r.contains_key(start))
                })
                .cloned()
                .collect();
            let back = reach(start, &|b| scc.contains(b));
            let mut cycle = vec![start.to_string()];
            let mut at = back[start].clone();
            while at != start {
                cycle.push(at.clone());
                at = back[&at].clone();
            }
            cycle[1..].reverse();
            let steps: Vec<String> = (0..cycle.len())
                .map(|i| {
                    let b = &cycle[(i + 1) % cycle.len()];
                    format!("    {}", edges[&(cycle[i].clone(), b.clone())])
                })
                .collect();
            let mut path: Vec<String> = cycle.iter().map(|f| format!("src/{f}")).collect();
            path.push(format!("src/{start}"));
            let members: Vec<String> = scc.iter().map(|f| format!("src/{f}")).collect();
            out.push(format!(
                "files that import each other: {}\n  a cycle: {}\n{}",
                members.join(", "),
                path.join(" → "),
                steps.join("\n")
            ));
            done.extend(scc);
        }
        out
    }

    #[test]
    fn architecture_is_one_way() {
        let layers = layers();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut top: BTreeSet<String> = BTreeSet::new();
        for e in std::fs::read_dir(&src).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_stem().unwrap().to_string_lossy().to_string();
            if name != "lib" && name != "main" {
                top.insert(name);
            }
        }
        let faults = table_faults(&layers, &top);
        assert!(faults.is_empty(), "{}", faults.join("\n"));
        let faults = import_faults(&layers, &top, &source_files());
        assert!(
            faults.is_empty(),
            "imports ARCHITECTURE.md does not allow:\n{}",
            faults.join("\n")
        );
    }

    #[test]
    fn upward_imports_are_caught() {
        let layers = layers();
        let top: BTreeSet<String> = layers.keys().cloned().collect();
        let files = vec![
            (
                "env/mod.rs".to_string(),
                "use crate::engine::Dag;\nuse crate::{error, stages};\n// crate::cli in a comment\n#[cfg(test)]\nuse crate::config;\n".to_string(),
            ),
            ("stages/x.rs".to_string(), "fn f() { crate::engine::runner::go() }".to_string()),
            ("engine/x.rs".to_string(), "use crate::stage::Stage;".to_string()),
        ];
        let faults = import_faults(&layers, &top, &files);
        assert_eq!(faults.len(), 3, "{faults:?}");
        assert!(faults[0].contains("`env` uses `engine`"));
        assert!(faults[1].contains("`env` uses `stages`"));
        assert!(faults[2].contains("`stages` uses `engine`"));
        let mut upside_down = layers.clone();
        upside_down
            .get_mut("store")
            .unwrap()
            .1
            .insert("engine".into());
        assert_eq!(table_faults(&upside_down, &top).len(), 1);
    }

    #[test]
    fn files_inside_modules_are_acyclic() {
        let cycles = file_cycles(&source_files());
        assert!(
            cycles.is_empty(),
            "import cycles between the files of a module (ARCHITECTURE.md: files inside a \
             module are one-way too):\n{}",
            cycles.join("\n")
        );
    }

    #[test]
    fn file_cycles_are_caught() {
        let file = |rel: &str, text: &str| (rel.to_string(), text.to_string());
        let files = vec![
            // a → b by path; b → a through the re-export in engine's mod.rs.
            file(
                "engine/mod.rs",
                "pub mod a;\npub mod b;\npub use a::Thing;\n",
            ),
            file(
                "engine/a.rs",
                "use super::b::{self, helper};\npub struct Thing;\nfn f() { b::other() }\n",
            ),
            file(
                "engine/b.rs",
                "pub fn helper() -> crate::engine::Thing { crate::engine::Thing }\npub fn other() {}\n",
            ),
            // A parent and a file two levels down: `hf::load` is defined in hf/w.rs.
            file(
                "model/mod.rs",
                "pub mod hf;\npub type Cpu = u8;\nfn load() { hf::load() }\n",
            ),
            file("model/hf/mod.rs", "pub mod w;\npub use w::load;\n"),
            file(
                "model/hf/w.rs",
                "pub fn load() { let _: super::super::Cpu = 0; }\n",
            ),
            // y → mod.rs only: mod.rs names y in a comment, a string and its tests alone.
            file(
                "store/mod.rs",
                "pub mod x;\npub mod y;\npub fn top() { x::f(); }\n// y::g()\nconst S: &str = \"y::g\";\n#[cfg(test)]\nmod tests { fn t() { super::y::g(); } }\n",
            ),
            file("store/x.rs", "pub fn f() {}\n"),
            file("store/y.rs", "pub fn g() { super::top() }\n"),
        ];
        let cycles = file_cycles(&files);
        assert_eq!(cycles.len(), 2, "{cycles:#?}");
        assert!(
            cycles[0].contains("src/engine/a.rs → src/engine/b.rs → src/engine/a.rs"),
            "{}",
            cycles[0]
        );
        assert!(cycles[0].contains("src/engine/a.rs:1: super::b::helper"));
        assert!(cycles[0].contains("src/engine/b.rs:1: crate::engine::Thing"));
        assert!(
            cycles[1].contains("src/model/hf/w.rs → src/model/mod.rs → src/model/hf/w.rs"),
            "{}",
            cycles[1]
        );
        assert!(cycles[1].contains("src/model/mod.rs:3: hf::load"));
    }
}
