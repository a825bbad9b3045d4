//! The configuration reference (`docs/src/reference/config.md`), generated from the template
//! `rla-pipe init` writes ([`super::DEFAULT_TOML`], which a test holds to every key at its
//! default): one table per section, each key with its default and the template's comment. A
//! test compares the page with this function's output, so the page cannot drift from the code.

use std::fmt::Write as _;

/// Where the generated page lives, relative to the repository root.
pub const REFERENCE_PAGE: &str = "docs/src/reference/config.md";

struct Key {
    name: String,
    default: String,
    meaning: String,
}

struct Section {
    name: String,
    note: String,
    keys: Vec<Key>,
}

/// Split `text` at the first `#` outside a quoted string: (before, comment).
fn split_comment(line: &str) -> (&str, Option<&str>) {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' && q == '"' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                '"' | '\'' => quote = Some(c),
                '#' => return (&line[..i], Some(line[i + 1..].trim())),
                _ => {}
            },
        }
    }
    (line, None)
}

fn join(into: &mut String, more: &str) {
    if more.is_empty() {
        return;
    }
    if !into.is_empty() {
        into.push(' ');
    }
    into.push_str(more);
}

/// A markdown table cell: pipes escaped, never empty.
fn cell(text: &str) -> String {
    let t = text.replace('|', "\\|");
    if t.is_empty() { "–".into() } else { t }
}

/// The configuration reference as markdown, from the `init` template.
pub fn reference_markdown() -> String {
    let mut intro: Vec<String> = Vec::new();
    let mut sections: Vec<Section> = Vec::new();
    // Where a continuation comment (an indented `# ...` line) goes.
    let mut last_was_key = false;
    for line in super::DEFAULT_TOML.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            last_was_key = false;
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix('[') {
            let (head, comment) = split_comment(rest);
            let name = head.trim().trim_end_matches(']').to_string();
            sections.push(Section {
                name,
                note: comment.unwrap_or("").to_string(),
                keys: Vec::new(),
            });
            last_was_key = false;
            continue;
        }
        if trimmed.starts_with('#') {
            let text = trimmed.trim_start_matches('#').trim();
            match sections.last_mut() {
                None => intro.push(text.to_string()),
                Some(s) => match s.keys.last_mut() {
                    Some(k) if last_was_key => join(&mut k.meaning, text),
                    _ => join(&mut s.note, text),
                },
            }
            continue;
        }
        let (assignment, comment) = split_comment(line);
        let Some((name, value)) = assignment.split_once('=') else {
            continue;
        };
        if let Some(s) = sections.last_mut() {
            s.keys.push(Key {
                name: name.trim().to_string(),
                default: value.trim().to_string(),
                meaning: comment.unwrap_or("").to_string(),
            });
            last_was_key = true;
        }
    }
    let mut out = String::new();
    out.push_str("# Configuration reference\n\n");
    out.push_str(
        "<!-- Generated from the template `rla-pipe init` writes (pipelines/synthetic.toml); \
         do not edit by hand: `RLA_PIPE_BLESS=1 cargo test --lib config_reference` rewrites \
         it. -->\n\n",
    );
    out.push_str(
        "Every key of an iteration config, its default and what it does, section by section \
         (the template `rla-pipe init` writes, `pipelines/synthetic.toml` in the repository, \
         holds them all; a test holds both to the code's defaults). Keys are set in the file or \
         with `--set section.key=value`. How configs are loaded and checked: \
         [Configuration](../configuration.md).\n",
    );
    if !intro.is_empty() {
        out.push('\n');
        for l in &intro {
            let _ = writeln!(out, "> {l}");
        }
    }
    for s in &sections {
        let _ = write!(out, "\n## `[{}]`\n\n", s.name);
        if !s.note.is_empty() {
            let _ = write!(out, "{}\n\n", s.note);
        }
        out.push_str("| key | default | meaning |\n|---|---|---|\n");
        for k in &s.keys {
            let _ = writeln!(
                out,
                "| `{}.{}` | `{}` | {} |",
                s.name,
                k.name,
                k.default.replace('|', "\\|"),
                cell(&k.meaning)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_split_outside_strings_only() {
        assert_eq!(
            split_comment(r#"a = "x # y"  # z"#),
            (r#"a = "x # y"  "#, Some("z"))
        );
        assert_eq!(split_comment(r#"p = "\\boxed{" # v"#).1, Some("v"));
        assert_eq!(split_comment("a = 1").1, None);
    }

    #[test]
    fn every_template_key_is_in_the_reference() {
        let page = reference_markdown();
        let doc: toml::Table = toml::from_str(super::super::DEFAULT_TOML).unwrap();
        fn walk(prefix: &str, t: &toml::Table, page: &str) {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match v {
                    toml::Value::Table(inner) => walk(&key, inner, page),
                    _ => assert!(page.contains(&format!("| `{key}` |")), "{key}"),
                }
            }
        }
        walk("", &doc, &page);
        assert!(page.contains("| `reward.lambda` | `1.0` | R = O + lambda * mean_j S |"));
        // A continuation line joins its key's meaning.
        assert!(
            page.contains(
                "the reference's num_trial, 16 on AlfWorld). 0: every slot without one |"
            )
        );
    }

    /// The page in the book equals what the code generates (`RLA_PIPE_BLESS=1` rewrites it).
    #[test]
    fn config_reference_page_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(REFERENCE_PAGE);
        let want = reference_markdown();
        if std::env::var_os("RLA_PIPE_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{} is not what the code generates: rewrite it with \
             `RLA_PIPE_BLESS=1 cargo test --lib config_reference`",
            path.display()
        );
    }
}
