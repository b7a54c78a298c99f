//! llama.cpp oracle files (`shared/oracle/*.json`, copied to `tests/data/oracle/`): prompts
//! with llama.cpp's token ids, greedy continuation and top logits, for the real runtimes
//! and the tokenizer to match.

use std::path::Path;

/// Top logits at one position: (position in the sequence, token ids, logits). The logits
/// at position `p` predict the token at `p + 1`.
pub type TopLogits = (u64, Vec<u32>, Vec<f32>);

/// One prompt of an oracle file.
#[derive(Debug, Clone, PartialEq)]
pub struct OracleCase {
    /// The prompt text.
    pub prompt: String,
    /// Its token ids (llama.cpp, `add_bos = false`, special tokens parsed).
    pub prompt_ids: Vec<u32>,
    /// llama.cpp's greedy continuation (ending at end-of-sequence when it came).
    pub greedy_ids: Vec<u32>,
    /// The continuation's text.
    pub greedy_text: String,
    /// Top logits at some positions.
    pub tops: Vec<TopLogits>,
}

impl OracleCase {
    /// The prompt shortened to 40 characters on one line, for tables.
    pub fn label(&self) -> String {
        self.prompt
            .chars()
            .take(40)
            .collect::<String>()
            .replace('\n', "\\n")
    }
}

/// The token ids of a JSON array (empty when `v` is not an array).
pub fn json_ids(v: Option<&serde_json::Value>) -> Vec<u32> {
    v.and_then(|a| a.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64())
                .map(|x| x as u32)
                .collect()
        })
        .unwrap_or_default()
}

fn json_floats(v: Option<&serde_json::Value>) -> Vec<f32> {
    v.and_then(|a| a.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_f64())
                .map(|x| x as f32)
                .collect()
        })
        .unwrap_or_default()
}

/// Parses an oracle file's text; `shown` names it in errors.
pub fn parse(text: &str, shown: &str) -> Result<Vec<OracleCase>, String> {
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("{shown}: {e}"))?;
    let cases = json
        .get("cases")
        .and_then(|c| c.as_array())
        .ok_or_else(|| format!("{shown}: no `cases` array"))?;
    Ok(cases
        .iter()
        .map(|c| {
            let text = |k: &str| c.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
            let tops = c
                .get("top_logits")
                .and_then(|t| t.as_array())
                .map(|a| {
                    a.iter()
                        .map(|t| {
                            (
                                t.get("position").and_then(|p| p.as_u64()).unwrap_or(0),
                                json_ids(t.get("top_ids")),
                                json_floats(t.get("top_logits")),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            OracleCase {
                prompt: text("prompt"),
                prompt_ids: json_ids(c.get("prompt_ids")),
                greedy_ids: json_ids(c.get("greedy_ids")),
                greedy_text: text("greedy_text"),
                tops,
            }
        })
        .collect())
}

/// Reads an oracle file.
pub fn read(path: &Path) -> Result<Vec<OracleCase>, String> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: {e}"))?;
    parse(&text, &shown)
}

/// The shipped SmolLM2 oracle (compiled in, for tests).
pub fn smollm2() -> Vec<OracleCase> {
    parse(
        include_str!("../../tests/data/oracle/smollm2_q4_1_llamacpp.json"),
        "tests/data/oracle/smollm2_q4_1_llamacpp.json",
    )
    .unwrap_or_default()
}
