//! A Hugging Face tokenizer directory: `tokenizer.json` (the `tokenizers` crate),
//! `tokenizer_config.json` (chat template, special tokens) and `generation_config.json` (EOS
//! ids). Chat templates are Jinja, rendered with minijinja as `transformers` renders them
//! (`trim_blocks`, `lstrip_blocks`, Python string methods, `raise_exception`).

use super::config::HfArch;
use crate::error::{Error, Result};
use serde::Serialize;
use std::path::Path;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// Token ids that end a generation.
    pub eos_ids: Vec<u32>,
}

/// A special token in `tokenizer_config.json`: a string or `{"content": …}`.
fn token_text(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(String::from),
        _ => None,
    }
}

fn read_json(path: &Path) -> Result<Option<serde_json::Value>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Model(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::Model(format!("{}: line {}: {e}", path.display(), e.line())))
}

impl HfTokenizer {
    /// Read the tokenizer files of a model directory.
    pub fn from_dir(dir: &Path, arch: &HfArch) -> Result<HfTokenizer> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(Error::Model(format!("{}: missing", path.display())));
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| Error::Model(format!("{}: {e}", path.display())))?;
        let cfg = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or_default();
        let chat_template = match cfg.get("chat_template") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            // A list of named templates: the one named "default".
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str())
                .map(String::from),
            _ => None,
        }
        .or_else(|| std::fs::read_to_string(dir.join("chat_template.jinja")).ok());
        let bos_token = token_text(cfg.get("bos_token"));
        let eos_token = token_text(cfg.get("eos_token"));
        let mut eos_ids = arch.eos.clone();
        if let Some(generation) = read_json(&dir.join("generation_config.json"))? {
            match generation.get("eos_token_id") {
                Some(serde_json::Value::Number(n)) => eos_ids.extend(n.as_u64().map(|n| n as u32)),
                Some(serde_json::Value::Array(a)) => {
                    eos_ids.extend(a.iter().filter_map(|x| x.as_u64()).map(|n| n as u32))
                }
                _ => {}
            }
        }
        if let Some(id) = eos_token.as_deref().and_then(|t| inner.token_to_id(t)) {
            eos_ids.push(id);
        }
        eos_ids.sort_unstable();
        eos_ids.dedup();
        Ok(HfTokenizer {
            inner,
            chat_template,
            bos_token,
            eos_token,
            eos_ids,
        })
    }

    /// Token ids of `text` (with the tokenizer's own special tokens, e.g. a BOS, when
    /// `special`).
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        self.inner
            .encode(text, special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| Error::Model(format!("tokenizing: {e}")))
    }

    /// Text of `ids` (special tokens dropped when `skip_special`).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| Error::Model(format!("decoding: {e}")))
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// The chat template applied to `messages` (text, not yet tokenized: templates write
    /// their own BOS, so encode it with `special = false`).
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let template = self.chat_template.as_deref().ok_or_else(|| {
            Error::Model(
                "the tokenizer has no chat template (tokenizer_config.json `chat_template`)".into(),
            )
        })?;
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template("chat", template)
            .map_err(|e| Error::Model(format!("chat template: {e}")))?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
        };
        env.get_template("chat")
            .and_then(|t| t.render(ctx))
            .map_err(|e| Error::Model(format!("chat template: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_chatml_template_as_transformers_does() {
        // SmolLM2 / Qwen's ChatML template (trim_blocks + lstrip_blocks matter here).
        let template = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'].strip() + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
        let dir = tempfile::tempdir().unwrap();
        let vocab = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,"model":{"type":"WordLevel","vocab":{"[UNK]":0,"hi":1},"unk_token":"[UNK]"}}"#;
        std::fs::write(dir.path().join("tokenizer.json"), vocab).unwrap();
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            serde_json::json!({"chat_template": template, "eos_token": "hi"}).to_string(),
        )
        .unwrap();
        let arch = super::super::config::HfArch::from_json(
            r#"{"architectures":["LlamaForCausalLM"],"vocab_size":2,"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2}"#,
        )
        .unwrap();
        let t = HfTokenizer::from_dir(dir.path(), &arch).unwrap();
        assert_eq!(t.eos_ids, vec![1]);
        let text = t
            .apply_chat_template(&[ChatMessage::new("user", "  Go north. ")], true)
            .unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nGo north.<|im_end|>\n<|im_start|>assistant\n"
        );
        let bad = "{{ raise_exception('roles must alternate') }}";
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            serde_json::json!({"chat_template": bad}).to_string(),
        )
        .unwrap();
        let t = HfTokenizer::from_dir(dir.path(), &arch).unwrap();
        let e = t.apply_chat_template(&[], true).unwrap_err().to_string();
        assert!(e.contains("roles must alternate"), "{e}");
    }
}
