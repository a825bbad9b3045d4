//! Tokenizers: the built-in word-level vocabulary (the environment's words plus the specials
//! and the RM's critique words), or a Hugging Face `tokenizer.json` for user-supplied
//! vocabularies. Either way the specials below exist and have fixed meanings.

use std::collections::HashMap;

use crate::error::{Error, Result};

/// Structural tokens of prompts.
pub const PAD: &str = "<pad>";
pub const UNK: &str = "<unk>";
pub const BOS: &str = "<bos>";
pub const SEP: &str = "<sep>";
pub const ACT: &str = "<act>";
pub const NEXT: &str = "<next>";
pub const CRITIC: &str = "<critic>";
/// The RM's verdict tokens.
pub const GOOD: &str = "<good>";
pub const BAD: &str = "<bad>";
pub const SPECIALS: [&str; 9] = [PAD, UNK, BOS, SEP, ACT, NEXT, CRITIC, GOOD, BAD];

/// The reward model's critique vocabulary: the words its "reasoning" is made of.
pub const CRITIQUE: [&str; 12] = [
    "progress", "closer", "farther", "stuck", "blocked", "repeat", "useful", "wasted", "goal",
    "detour", "risky", "fine",
];

/// A tokenizer with the fixed specials.
pub enum Tokenizer {
    Words {
        ids: HashMap<String, u32>,
        words: Vec<String>,
    },
    Hf {
        inner: Box<tokenizers::Tokenizer>,
        specials: HashMap<&'static str, u32>,
        critique: Vec<u32>,
    },
}

impl Tokenizer {
    /// Word-level: specials, critique words, then the environment's words (duplicates dropped).
    pub fn words(env_words: &[String]) -> Tokenizer {
        let mut words: Vec<String> = Vec::new();
        let mut ids = HashMap::new();
        let all = SPECIALS
            .iter()
            .chain(CRITIQUE.iter())
            .map(|s| s.to_string())
            .chain(env_words.iter().flat_map(|w| split_words(w)));
        for w in all {
            if !ids.contains_key(&w) {
                ids.insert(w.clone(), words.len() as u32);
                words.push(w);
            }
        }
        Tokenizer::Words { ids, words }
    }

    /// A Hugging Face `tokenizer.json`; the specials and critique words are added as tokens
    /// when it lacks them.
    pub fn from_hf_file(path: &str) -> Result<Tokenizer> {
        let mut inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| Error::Config(format!("{path}: not a usable tokenizer.json: {e}")))?;
        let added: Vec<tokenizers::AddedToken> = SPECIALS
            .iter()
            .chain(CRITIQUE.iter())
            .map(|s| tokenizers::AddedToken::from(s.to_string(), true))
            .collect();
        inner.add_special_tokens(&added);
        let id = |s: &str| {
            inner
                .token_to_id(s)
                .ok_or_else(|| Error::Config(format!("{path}: token {s:?} could not be added")))
        };
        let mut specials = HashMap::new();
        for s in SPECIALS {
            specials.insert(s, id(s)?);
        }
        let critique = CRITIQUE.iter().map(|s| id(s)).collect::<Result<Vec<_>>>()?;
        Ok(Tokenizer::Hf {
            inner: Box::new(inner),
            specials,
            critique,
        })
    }

    /// The tokenizer a model config names: `tokenizer = ""` → word-level over `env_words`.
    pub fn for_config(path: &str, env_words: &[String]) -> Result<Tokenizer> {
        if path.is_empty() {
            Ok(Tokenizer::words(env_words))
        } else {
            Tokenizer::from_hf_file(path)
        }
    }

    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Words { words, .. } => words.len(),
            Tokenizer::Hf { inner, .. } => inner.get_vocab_size(true),
        }
    }

    /// The id of a special token.
    pub fn special(&self, s: &'static str) -> u32 {
        match self {
            Tokenizer::Words { ids, .. } => ids[s],
            Tokenizer::Hf { specials, .. } => specials[s],
        }
    }

    /// Ids of the critique words, in [`CRITIQUE`] order.
    pub fn critique_ids(&self) -> Vec<u32> {
        match self {
            Tokenizer::Words { ids, .. } => CRITIQUE.iter().map(|w| ids[*w]).collect(),
            Tokenizer::Hf { critique, .. } => critique.clone(),
        }
    }

    /// Token ids of a text (no specials added).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match self {
            Tokenizer::Words { ids, .. } => {
                let unk = ids[UNK];
                split_words(text)
                    .map(|w| ids.get(&w).copied().unwrap_or(unk))
                    .collect()
            }
            Tokenizer::Hf {
                inner, specials, ..
            } => match inner.encode(text, false) {
                Ok(enc) => enc.get_ids().to_vec(),
                Err(_) => vec![specials[UNK]],
            },
        }
    }

    /// The text of one token id.
    pub fn token(&self, id: u32) -> String {
        match self {
            Tokenizer::Words { words, .. } => words
                .get(id as usize)
                .cloned()
                .unwrap_or_else(|| UNK.into()),
            Tokenizer::Hf { inner, .. } => inner.id_to_token(id).unwrap_or_else(|| UNK.into()),
        }
    }
}

/// Lower-cased words; punctuation characters are words of their own.
fn split_words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split_whitespace().flat_map(|w| {
        if w.starts_with('<') && w.ends_with('>') && w.len() > 2 {
            return vec![w.to_string()];
        }
        let mut out = Vec::new();
        let mut cur = String::new();
        for ch in w.chars() {
            if ch.is_alphanumeric() || ch == '_' {
                cur.extend(ch.to_lowercase());
            } else {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                out.push(ch.to_string());
            }
        }
        if !cur.is_empty() {
            out.push(cur);
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_punctuation_and_map_unknowns() {
        let t = Tokenizer::words(&["go to".into(), "cabinet".into(), "1".into()]);
        let ids = t.encode("Go to cabinet 1, then XYZ.");
        let text: Vec<String> = ids.iter().map(|i| t.token(*i)).collect();
        assert_eq!(text, ["go", "to", "cabinet", "1", UNK, UNK, UNK, UNK]);
        assert_eq!(t.token(t.special(GOOD)), GOOD);
        assert_eq!(t.critique_ids().len(), CRITIQUE.len());
    }

    #[test]
    fn hf_tokenizer_json_is_loaded_and_gets_the_specials() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        let json = serde_json::json!({
            "version": "1.0",
            "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": {"type": "Lowercase"},
            "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "go": 1, "north": 2}, "unk_token": "[UNK]"}
        });
        std::fs::write(&path, json.to_string()).unwrap();
        let t = Tokenizer::from_hf_file(path.to_str().unwrap()).unwrap();
        assert_eq!(t.encode("Go north"), vec![1, 2]);
        assert!(t.vocab_size() >= 3 + SPECIALS.len() + CRITIQUE.len());
        assert_eq!(t.token(t.special(BAD)), BAD);
        let err = Tokenizer::from_hf_file("/nonexistent/tokenizer.json")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("/nonexistent/tokenizer.json"), "{err}");
    }
}
