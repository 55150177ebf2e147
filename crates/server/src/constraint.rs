//! Restricting which token may come next: JSON (any object, or one that follows a JSON schema)
//! through llguidance, and forced text for the test-only scripted replies.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use tokenizer::{TokenType, Tokenizer};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// A rule over the next token, advanced by every token that is chosen.
pub trait Constraint: Send {
    /// Sets the logits of forbidden tokens to −∞.
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String>;
    /// Records the token that was chosen.
    fn commit(&mut self, id: u32) -> Result<(), String>;
}

/// Forces a fixed token sequence, then the end-of-turn token.
pub struct Forced {
    tokens: Vec<u32>,
    pos: usize,
    end: u32,
    delay: std::time::Duration,
}

impl Forced {
    pub fn new(tokens: Vec<u32>, end: u32, delay: std::time::Duration) -> Self {
        Forced {
            tokens,
            pos: 0,
            end,
            delay,
        }
    }
}

impl Constraint for Forced {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let want = self.tokens.get(self.pos).copied().unwrap_or(self.end) as usize;
        if want >= logits.len() {
            return Err(format!("forced token {want} is outside the vocabulary"));
        }
        for (i, l) in logits.iter_mut().enumerate() {
            if i != want {
                *l = f32::NEG_INFINITY;
            } else if !l.is_finite() {
                *l = 0.0;
            }
        }
        Ok(())
    }

    fn commit(&mut self, _id: u32) -> Result<(), String> {
        self.pos += 1;
        Ok(())
    }
}

/// The tokenizer as llguidance sees it: every token's bytes in a trie, control and padding
/// tokens marked special so that grammar text never matches them.
struct TokenizerBridge {
    tok: Arc<Tokenizer>,
    trie: TokTrie,
}

impl TokenizerEnv for TokenizerBridge {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        let text = String::from_utf8_lossy(s);
        self.tok.encode(&text, false).unwrap_or_default()
    }
}

/// Builds parsers for JSON grammars over one tokenizer. Building it walks the whole vocabulary
/// once; parsers made from it are cheap.
pub struct GrammarFactory {
    factory: ParserFactory,
}

impl GrammarFactory {
    pub fn new(tok: Arc<Tokenizer>, end_of_turn: u32) -> Result<Self, String> {
        let n = tok.vocab_size();
        let mut words = Vec::with_capacity(n);
        for id in 0..n as u32 {
            let bytes = tok.token_bytes(id).map_err(|e| e.to_string())?;
            let normal = matches!(tok.token_type(id), Some(TokenType::Normal) | None);
            if normal && !bytes.is_empty() {
                words.push(bytes.to_vec());
            } else {
                // Special tokens: the 0xFF marker keeps them out of text matching.
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(
                    if bytes.is_empty() {
                        format!("<[{id}]>").into_bytes()
                    } else {
                        bytes.to_vec()
                    }
                    .as_slice(),
                );
                words.push(w);
            }
        }
        let mut info = TokRxInfo::new(n as u32, end_of_turn);
        info.tok_end_of_turn = Some(end_of_turn);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(TokenizerBridge { tok, trie });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.set_stderr_log_level(0);
        Ok(GrammarFactory { factory })
    }

    /// A constraint for text that is one JSON value following `schema` (`{"type": "object"}`
    /// for any object).
    pub fn json(&self, mut schema: serde_json::Value) -> Result<Grammar, String> {
        // Compact JSON (no free whitespace a model could loop in); keywords llguidance does not
        // enforce are ignored rather than refused, as OpenAI's non-strict mode does.
        if let Some(obj) = schema.as_object_mut() {
            obj.entry("x-guidance").or_insert_with(
                || serde_json::json!({"whitespace_flexible": false, "lenient": true}),
            );
        }
        let grammar = TopLevelGrammar::from_json_schema(schema);
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| format!("the JSON schema cannot be used: {e}"))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(format!("the JSON schema cannot be used: {e}"));
        }
        Ok(Grammar { matcher })
    }
}

pub struct Grammar {
    matcher: Matcher,
}

impl Constraint for Grammar {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())?;
        for (i, l) in logits.iter_mut().enumerate() {
            if i >= allowed.len() || !allowed.is_allowed(i as TokenId) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn commit(&mut self, id: u32) -> Result<(), String> {
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.matcher.consume_token(id).map_err(|e| e.to_string())
    }
}
