//! The byte-level BPE tokenizer of a GGUF model (`tokenizer.ggml.model = gpt2`), as
//! llama.cpp and Hugging Face `tokenizers` run it: special tokens matched first, then the
//! pre-tokenizer's splits (for SmolLM2 every digit alone, then GPT-2's pattern), then the
//! merges by rank over the bytes of each piece in GPT-2's byte-to-character alphabet. The
//! chat template of the file is rendered with minijinja (as `transformers` does with
//! Jinja2, `trim_blocks` and `lstrip_blocks` on).

use std::collections::HashMap;

use fancy_regex::Regex;

use crate::gguf::{Gguf, Value};

/// Errors of the tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A metadata key is missing or has the wrong type.
    #[error("{path}: tokenizer metadata `{key}`: {what}")]
    Metadata {
        /// The GGUF file.
        path: String,
        /// The key.
        key: String,
        /// What is wrong.
        what: String,
    },
    /// The file's tokenizer is of a kind this one does not run.
    #[error("{path}: {what}")]
    Unsupported {
        /// The GGUF file.
        path: String,
        /// What is unsupported.
        what: String,
    },
    /// The chat template failed to render.
    #[error("chat template: {0}")]
    Template(String),
}

/// GPT-2's pre-tokenizer pattern (contractions, letters, numbers, other symbols, and
/// whitespace that does not precede a word).
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// GGUF token types (`tokenizer.ggml.token_type`).
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;

/// A chat message for [`Tokenizer::apply_chat_template`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// A byte-level BPE tokenizer read from a GGUF file.
#[derive(Debug)]
pub struct Tokenizer {
    tokens: Vec<String>,
    ids: HashMap<String, u32>,
    /// Merge rank of each (left, right) pair of token ids, and the merged id.
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Control and user-defined tokens, longest first (matched literally in text), with
    /// whether each is a control token (user-defined ones match even without `special`,
    /// as in llama.cpp).
    specials: Vec<(String, u32, bool)>,
    /// Control tokens (not text: left out of decoded output unless asked for).
    control: Vec<bool>,
    split_digits: bool,
    pattern: Regex,
    byte_char: [char; 256],
    char_byte: HashMap<char, u8>,
    /// Beginning and end of sequence ids.
    pub bos: Option<u32>,
    /// End of sequence id (generation stops there).
    pub eos: Option<u32>,
    /// Whether prompts start with BOS (`tokenizer.ggml.add_bos_token`).
    pub add_bos: bool,
    chat_template: Option<String>,
}

/// GPT-2's reversible map of bytes to printable characters: printable Latin-1 bytes map to
/// themselves, the rest to U+0100 onwards.
fn byte_alphabet() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or('?');
            next += 1;
            c
        };
    }
    table
}

impl Tokenizer {
    /// Reads the tokenizer of a GGUF file.
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer, TokenizerError> {
        let path = g.path().display().to_string();
        let meta_err = |key: &str, what: &str| TokenizerError::Metadata {
            path: path.clone(),
            key: key.into(),
            what: what.into(),
        };
        let get = |key: &str| g.metadata.get(key);
        let model = get("tokenizer.ggml.model")
            .and_then(Value::as_str)
            .ok_or_else(|| meta_err("tokenizer.ggml.model", "missing or not a string"))?;
        if model != "gpt2" {
            return Err(TokenizerError::Unsupported {
                path,
                what: format!(
                    "tokenizer.ggml.model = {model:?}: only byte-level BPE (\"gpt2\") is supported"
                ),
            });
        }
        let pre = get("tokenizer.ggml.pre")
            .and_then(Value::as_str)
            .unwrap_or("default");
        // llama.cpp's pre-tokenizer types that are GPT-2's pattern, with or without
        // single digits split off first.
        let split_digits = match pre {
            "smollm" | "starcoder" | "refact" | "codeshell" | "command-r" | "exaone" => true,
            "gpt2" | "gpt-2" => false,
            // llama.cpp's default (also for a missing key) chains four other patterns.
            other => {
                return Err(TokenizerError::Unsupported {
                    path,
                    what: format!(
                        "tokenizer.ggml.pre = {other:?}: supported are smollm, starcoder, refact, codeshell, command-r, exaone and gpt2"
                    ),
                })
            }
        };
        let strings = |key: &str| -> Result<Vec<String>, TokenizerError> {
            match get(key) {
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|v| {
                        v.as_str()
                            .map(str::to_owned)
                            .ok_or_else(|| meta_err(key, "an element is not a string"))
                    })
                    .collect(),
                _ => Err(meta_err(key, "missing or not an array")),
            }
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let types: Vec<i64> = match get("tokenizer.ggml.token_type") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::I32(x) => i64::from(*x),
                    other => other.as_u64().map_or(1, |x| x as i64),
                })
                .collect(),
            _ => vec![1; tokens.len()],
        };
        if types.len() != tokens.len() {
            return Err(meta_err(
                "tokenizer.ggml.token_type",
                &format!("{} types for {} tokens", types.len(), tokens.len()),
            ));
        }
        let ids: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let mut merges = HashMap::new();
        for (rank, m) in strings("tokenizer.ggml.merges")?.iter().enumerate() {
            let Some((a, b)) = m.split_once(' ') else {
                return Err(meta_err(
                    "tokenizer.ggml.merges",
                    &format!("merge {rank} ({m:?}) is not two tokens"),
                ));
            };
            let (Some(&l), Some(&r), Some(&out)) =
                (ids.get(a), ids.get(b), ids.get(&format!("{a}{b}")))
            else {
                return Err(meta_err(
                    "tokenizer.ggml.merges",
                    &format!("merge {rank} ({m:?}) names a token outside the vocabulary"),
                ));
            };
            merges.entry((l, r)).or_insert((rank as u32, out));
        }
        let mut specials: Vec<(String, u32, bool)> = tokens
            .iter()
            .zip(&types)
            .enumerate()
            .filter(|(_, (t, &ty))| {
                (ty == TOKEN_CONTROL || ty == TOKEN_USER_DEFINED) && !t.is_empty()
            })
            .map(|(i, (t, &ty))| (t.clone(), i as u32, ty == TOKEN_CONTROL))
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let control = types.iter().map(|&t| t == TOKEN_CONTROL).collect();
        let id = |key: &str| {
            get(key)
                .and_then(Value::as_u64)
                .map(|v| v as u32)
                .filter(|&v| (v as usize) < tokens.len())
        };
        let byte_char = byte_alphabet();
        let char_byte = byte_char
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        let pattern = Regex::new(GPT2_PATTERN).map_err(|e| TokenizerError::Unsupported {
            path: path.clone(),
            what: e.to_string(),
        })?;
        Ok(Tokenizer {
            bos: id("tokenizer.ggml.bos_token_id"),
            eos: id("tokenizer.ggml.eos_token_id"),
            add_bos: matches!(get("tokenizer.ggml.add_bos_token"), Some(Value::Bool(true))),
            chat_template: get("tokenizer.chat_template")
                .and_then(Value::as_str)
                .map(str::to_owned),
            tokens,
            ids,
            merges,
            specials,
            control,
            split_digits,
            pattern,
            byte_char,
            char_byte,
        })
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The token ids of `text`. With `special`, control tokens written in the text
    /// (`<|im_start|>`) become their ids; otherwise they are ordinary text. User-defined
    /// tokens always do (as in llama.cpp). BOS is not added (see [`Tokenizer::add_bos`]).
    pub fn encode(&self, text: &str, special: bool) -> Vec<u32> {
        let mut out = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            // The earliest special token in the rest (the longest at equal positions).
            let next = self
                .specials
                .iter()
                .filter(|(_, _, control)| special || !control)
                .filter_map(|(s, id, _)| rest.find(s.as_str()).map(|at| (at, s.len(), *id)))
                .min_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            match next {
                Some((at, len, id)) => {
                    self.encode_text(&rest[..at], &mut out);
                    out.push(id);
                    rest = &rest[at + len..];
                }
                None => {
                    self.encode_text(rest, &mut out);
                    rest = "";
                }
            }
        }
        out
    }

    /// Ordinary text: pre-tokenizer pieces, each merged by BPE.
    fn encode_text(&self, text: &str, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut pieces = Vec::new();
        if self.split_digits {
            // Every numeric character on its own, the text between through GPT-2's pattern.
            let mut start = 0;
            for (i, c) in text.char_indices() {
                if c.is_numeric() {
                    self.gpt2_split(&text[start..i], &mut pieces);
                    pieces.push(&text[i..i + c.len_utf8()]);
                    start = i + c.len_utf8();
                }
            }
            self.gpt2_split(&text[start..], &mut pieces);
        } else {
            self.gpt2_split(text, &mut pieces);
        }
        for piece in pieces {
            self.bpe(piece, out);
        }
    }

    fn gpt2_split<'t>(&self, text: &'t str, pieces: &mut Vec<&'t str>) {
        let mut at = 0;
        for m in self.pattern.find_iter(text) {
            // The pattern matches every character (its last branch is `\s+` and every
            // other character is a symbol), so an error here is a backtracking limit only:
            // keep the rest as one piece rather than lose text.
            let Ok(m) = m else {
                break;
            };
            if m.start() > at {
                pieces.push(&text[at..m.start()]);
            }
            pieces.push(m.as_str());
            at = m.end();
        }
        if at < text.len() {
            pieces.push(&text[at..]);
        }
    }

    /// Byte-level BPE of one piece: start from one symbol per byte, merge the adjacent pair
    /// of lowest rank (leftmost on ties) until none merges. The symbols are a linked list
    /// and the candidate pairs a heap, so a long piece costs O(n log n), not O(n^2).
    fn bpe(&self, piece: &str, out: &mut Vec<u32>) {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        // A vocabulary without a byte cannot encode it: skip it, as llama.cpp does for
        // unknown bytes without <unk>.
        let mut sym: Vec<Option<u32>> = piece
            .as_bytes()
            .iter()
            .filter_map(|&b| {
                self.ids
                    .get(&self.byte_char[b as usize].to_string())
                    .copied()
            })
            .map(Some)
            .collect();
        let n = sym.len();
        let mut next: Vec<usize> = (1..=n).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        // (rank, left position, left id, right id): stale entries are skipped when popped.
        let mut heap = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<_>, i: usize, l: u32, r: u32| {
            if let Some(&(rank, _)) = self.merges.get(&(l, r)) {
                heap.push(Reverse((rank, i, l, r)));
            }
        };
        for i in 0..n.saturating_sub(1) {
            if let (Some(l), Some(r)) = (sym[i], sym[i + 1]) {
                push(&mut heap, i, l, r);
            }
        }
        while let Some(Reverse((_, i, l, r))) = heap.pop() {
            let j = next[i];
            if j >= n || sym[i] != Some(l) || sym[j] != Some(r) {
                continue;
            }
            let Some(&(_, merged)) = self.merges.get(&(l, r)) else {
                continue;
            };
            sym[i] = Some(merged);
            sym[j] = None;
            next[i] = next[j];
            if next[i] < n {
                prev[next[i]] = i;
                if let Some(r2) = sym[next[i]] {
                    push(&mut heap, i, merged, r2);
                }
            }
            let p = prev[i];
            if p < n {
                if let Some(l2) = sym[p] {
                    push(&mut heap, p, l2, merged);
                }
            }
        }
        out.extend(sym.into_iter().flatten());
    }

    /// The text of `ids` (invalid UTF-8 replaced). Control tokens are left out unless
    /// `special`.
    pub fn decode(&self, ids: &[u32], special: bool) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids, special)).into_owned()
    }

    /// The bytes of `ids` (a token may hold part of a character). Control tokens are left
    /// out unless `special`.
    pub fn decode_bytes(&self, ids: &[u32], special: bool) -> Vec<u8> {
        let mut bytes = Vec::new();
        for &id in ids {
            let Some(tok) = self.tokens.get(id as usize) else {
                continue;
            };
            if self.control.get(id as usize).copied().unwrap_or(false) {
                if special {
                    bytes.extend_from_slice(tok.as_bytes());
                }
                continue;
            }
            if self.specials.iter().any(|(_, s, _)| *s == id) {
                bytes.extend_from_slice(tok.as_bytes());
                continue;
            }
            for c in tok.chars() {
                match self.char_byte.get(&c) {
                    Some(&b) => bytes.push(b),
                    None => {
                        let mut buf = [0u8; 4];
                        bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                }
            }
        }
        bytes
    }

    /// Renders the file's chat template (`tokenizer.chat_template`) for `messages`, with
    /// the assistant's turn opened when `add_generation_prompt`.
    pub fn apply_chat_template(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let Some(template) = &self.chat_template else {
            return Err(TokenizerError::Template(
                "the model file has no tokenizer.chat_template".into(),
            ));
        };
        let mut env = minijinja::Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        env.set_syntax(syntax);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        let msgs: minijinja::Value = messages
            .iter()
            .map(|m| {
                minijinja::Value::from_pairs([
                    ("role", m.role.as_str()),
                    ("content", m.content.as_str()),
                ])
            })
            .collect();
        let token = |id: Option<u32>| {
            id.and_then(|i| self.tokens.get(i as usize))
                .cloned()
                .unwrap_or_default()
        };
        env.render_str(
            template,
            minijinja::context! {
                messages => msgs,
                add_generation_prompt => add_generation_prompt,
                bos_token => token(self.bos),
                eos_token => token(self.eos),
            },
        )
        .map_err(|e| TokenizerError::Template(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_alphabet_is_a_bijection_to_printable_characters() {
        let t = byte_alphabet();
        let set: std::collections::HashSet<char> = t.iter().copied().collect();
        assert_eq!(set.len(), 256);
        assert_eq!(t[b'a' as usize], 'a');
        // Space is U+0120 ('Ġ') and newline U+010A ('Ċ'), as in GPT-2's vocabularies.
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert!(t.iter().all(|c| !c.is_whitespace() && !c.is_control()));
    }

    #[test]
    fn gpt2_pattern_splits_words_numbers_and_spaces() {
        let re = Regex::new(GPT2_PATTERN).expect("pattern");
        let split = |s: &str| -> Vec<String> {
            re.find_iter(s)
                .map(|m| m.expect("match").as_str().to_string())
                .collect()
        };
        assert_eq!(split("Hello world"), ["Hello", " world"]);
        assert_eq!(split("it's 42!"), ["it", "'s", " 42", "!"]);
        // Whitespace before a word gives its last space to the word.
        assert_eq!(split("a   b"), ["a", "  ", " b"]);
        assert_eq!(split("x\n\n"), ["x", "\n\n"]);
        assert_eq!(split("café naïve"), ["café", " naïve"]);
    }

    #[test]
    #[ignore = "needs the SmolLM2 GGUF (SIM_SMOLLM2_GGUF or ~/.cache/sim-models); .ci/run fetches it"]
    fn smollm2_matches_llama_cpp_on_the_oracle_prompts() {
        let p = crate::gguf::tests::smollm2_path().expect("SmolLM2 GGUF not found");
        let g = Gguf::open(&p).expect("gguf");
        let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
        assert_eq!(tok.vocab_size(), 49_152);
        assert_eq!((tok.bos, tok.eos, tok.add_bos), (Some(1), Some(2), false));
        // The oracle's prompts: llama.cpp's `tokenize(add_bos=False, special=True)`.
        for case in crate::oracle::smollm2() {
            let (prompt, prompt_ids, greedy_ids, greedy_text) = (
                case.prompt,
                case.prompt_ids,
                case.greedy_ids,
                case.greedy_text,
            );
            assert_eq!(tok.encode(&prompt, true), prompt_ids, "{prompt:?}");
            // Decoding is the inverse of encoding, special tokens kept.
            assert_eq!(tok.decode(&prompt_ids, true), prompt, "{prompt:?}");
            let end = greedy_ids
                .iter()
                .position(|&t| Some(t) == tok.eos)
                .unwrap_or(greedy_ids.len());
            assert_eq!(
                tok.decode(&greedy_ids[..end], false),
                greedy_text,
                "{prompt:?}"
            );
        }
        // One 20,000-symbol piece (BPE over a heap, not quadratic) round-trips.
        let long = "!".repeat(20_000);
        assert_eq!(tok.decode(&tok.encode(&long, true), true), long);
        // Without special parsing, <|im_start|> is text.
        let plain = tok.encode("<|im_start|>", false);
        assert!(plain.len() > 1 && !plain.contains(&1));
        let chat = tok
            .apply_chat_template(
                &[Message {
                    role: "user".into(),
                    content: "Hi".into(),
                }],
                true,
            )
            .expect("template");
        assert_eq!(
            chat,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }
}
