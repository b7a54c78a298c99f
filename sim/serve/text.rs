//! Text in and out of a served model: the GGUF's own tokenizer and chat template when the
//! model has weights (`--backend cpu`, or a scenario with `model.gguf`), else a synthetic
//! one for the cost model (`--backend model` on a catalog model).
//!
//! The synthetic tokenizer counts about four characters a token (English text under the
//! Llama and GPT BPEs): each whitespace-separated word becomes `ceil(len / 4)` tokens whose
//! ids hash the word's pieces, so the same prompt gives the same ids (prefix caching sees
//! repeated prompts). Generated tokens decode to common English words (` the`, ` of`, ...),
//! each one token under those tokenizers, so that a benchmark client that counts output
//! tokens with its own tokenizer counts about what was sent.

use kernels::tokenizer::{Message, Tokenizer};

/// Words the synthetic model "generates", each a single token under common BPEs.
const WORDS: [&str; 16] = [
    " the", " of", " and", " to", " in", " a", " is", " that", " for", " it", " as", " was",
    " with", " be", " by", " on",
];

/// Vocabulary size of the synthetic tokenizer.
const SYNTHETIC_VOCAB: u32 = 32_000;

/// A served model's tokenizer.
pub enum Text {
    /// The GGUF file's tokenizer.
    Gguf(Box<Tokenizer>),
    /// About four characters a token, synthetic ids and words (cost-model serving).
    Synthetic,
}

impl Text {
    /// The ids of a prompt (BOS first when the model adds one).
    pub fn encode(&self, text: &str, add_special: bool) -> Vec<u32> {
        match self {
            Text::Gguf(t) => {
                let mut ids = Vec::new();
                if add_special && t.add_bos {
                    ids.extend(t.bos);
                }
                ids.extend(t.encode(text, true));
                ids
            }
            Text::Synthetic => {
                let mut ids = Vec::new();
                for word in text.split_whitespace() {
                    let chars: Vec<char> = word.chars().collect();
                    for piece in chars.chunks(4) {
                        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                        for c in piece {
                            h = (h ^ u64::from(*c as u32)).wrapping_mul(0x0100_0000_01b3);
                        }
                        ids.push((h % u64::from(SYNTHETIC_VOCAB)) as u32);
                    }
                }
                ids
            }
        }
    }

    /// The text of generated `ids` (control tokens left out). Synthetic ids decode to
    /// words by position (`offset` is the index of `ids[0]` in the completion), as the
    /// cost model samples no real tokens.
    pub fn decode(&self, ids: &[u32], offset: usize) -> String {
        match self {
            Text::Gguf(t) => t.decode(ids, false),
            Text::Synthetic => (0..ids.len())
                .map(|i| WORDS[(offset + i) % WORDS.len()])
                .collect(),
        }
    }

    /// One token as log-probabilities name it: its text (vLLM's `bytes:\xNN...` form when
    /// it holds part of a character) and its bytes. Control tokens are named by their text.
    pub fn token(&self, id: u32) -> (String, Vec<u8>) {
        let bytes = match self {
            Text::Gguf(t) => t.decode_bytes(&[id], true),
            Text::Synthetic => WORDS[id as usize % WORDS.len()].as_bytes().to_vec(),
        };
        let text = match std::str::from_utf8(&bytes) {
            Ok(s) => s.to_string(),
            Err(_) => {
                let hex: String = bytes.iter().map(|b| format!("\\x{b:02x}")).collect();
                format!("bytes:{hex}")
            }
        };
        (text, bytes)
    }

    /// The text of token ids a client sent to `/detokenize` (synthetic ids by id).
    pub fn detokenize(&self, ids: &[u32]) -> String {
        match self {
            Text::Gguf(t) => t.decode(ids, false),
            Text::Synthetic => ids
                .iter()
                .map(|&i| WORDS[i as usize % WORDS.len()])
                .collect(),
        }
    }

    /// The prompt text of a chat, through the model's chat template (synthetic: one
    /// `role: content` line per message).
    pub fn chat(&self, messages: &[Message]) -> Result<String, String> {
        match self {
            Text::Gguf(t) => t
                .apply_chat_template(messages, true)
                .map_err(|e| e.to_string()),
            Text::Synthetic => Ok(messages
                .iter()
                .map(|m| format!("{}: {}\n", m.role, m.content))
                .collect::<String>()
                + "assistant:"),
        }
    }

    /// The end-of-sequence id (none for the synthetic tokenizer: the cost model runs
    /// every request to its `max_tokens`).
    pub fn eos(&self) -> Option<u32> {
        match self {
            Text::Gguf(t) => t.eos,
            Text::Synthetic => None,
        }
    }

    /// Vocabulary size (ids a client may send).
    pub fn vocab_size(&self) -> usize {
        match self {
            Text::Gguf(t) => t.vocab_size(),
            Text::Synthetic => SYNTHETIC_VOCAB as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_text_counts_about_four_characters_a_token() {
        let t = Text::Synthetic;
        assert_eq!(t.encode("hello world", true).len(), 4);
        assert_eq!(t.encode("a bb ccc dddd", true).len(), 4);
        assert_eq!(t.encode("abcdefghi", true).len(), 3);
        assert_eq!(t.encode("same words", true), t.encode("same words", true));
        assert_ne!(t.encode("same words", true), t.encode("other words", true));
        assert_eq!(t.decode(&[0, 0, 0], 0), " the of and");
        assert_eq!(t.decode(&[0], 2), " and");
    }
}
