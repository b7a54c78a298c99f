//! Stop strings: one choice's output decoded incrementally as its tokens arrive (vLLM's
//! detokenizer: each decode covers only the tokens since the last that ended a character,
//! with the step before as context) and searched for the first stop string that ends in
//! the new text.
//!
//! In: a step's tokens of the choice. Out: the text so far, and where a stop string
//! matched. Both sides of the server run it on the same tokens: the engine loop, to end
//! the choice in the step its stop string appeared (so that the request's record and the
//! server's counters say `stop`, with the tokens the client was sent, however fast the
//! engine steps on), and the HTTP handler, to cut the text it sends there.

use std::sync::Arc;

/// Decodes output tokens: `(ids, offset)`, `offset` the index of `ids[0]` in the output.
pub type Decode = Arc<dyn Fn(&[u32], usize) -> String + Send + Sync>;

/// A choice's output: its token ids and their text.
#[derive(Debug, Default)]
pub struct OutputText {
    /// Output token ids.
    pub ids: Vec<u32>,
    /// The text of `ids[..read]` (cut at a stop string once one matched).
    pub text: String,
    /// `ids[prefix..read]` decode to the tail of `text`: the context of the next decode.
    pub prefix: usize,
    /// Tokens decoded into `text`.
    pub read: usize,
    /// Bytes of `text` searched for stop strings: a match must end after them.
    searched: usize,
}

impl OutputText {
    /// Decodes the tokens up to `end` into the text; the decode waits while the new tokens
    /// end inside a character, unless `last`.
    pub fn advance(&mut self, decode: &dyn Fn(&[u32], usize) -> String, end: usize, last: bool) {
        let end = end.min(self.ids.len());
        if end <= self.read {
            return;
        }
        let prev = decode(&self.ids[self.prefix..self.read], self.prefix);
        let new = decode(&self.ids[self.prefix..end], self.prefix);
        if new.ends_with('\u{FFFD}') && !last {
            return;
        }
        match new.strip_prefix(prev.as_str()) {
            Some(tail) => self.text.push_str(tail),
            // A decode that rewrote its context (not seen with byte-level BPE): decode all.
            None => self.text = decode(&self.ids[..end], 0),
        }
        self.prefix = self.read;
        self.read = end;
    }

    /// The first of `stops` to match in the text decoded since the last search: its byte
    /// offset and its index in `stops`. Only a match that ends in the new text counts (each
    /// string searched from its own length before it, as vLLM does), and none while the
    /// choice has `min_tokens` tokens or fewer (that text is still marked searched).
    pub fn find_stop(&mut self, stops: &[String], min_tokens: u32) -> Option<(usize, usize)> {
        if !stops.is_empty() && self.ids.len() > min_tokens as usize {
            let (text, searched) = (&self.text, self.searched);
            let hit = stops
                .iter()
                .enumerate()
                .filter_map(|(k, s)| {
                    let from = searched.saturating_sub(s.len().saturating_sub(1));
                    // (A match starts on a character boundary: none is skipped.)
                    let from = (from..=text.len()).find(|&b| text.is_char_boundary(b))?;
                    let p = from + text.get(from..)?.find(s.as_str())?;
                    Some((p, k))
                })
                .min_by_key(|&(p, _)| p);
            if hit.is_some() {
                return hit;
            }
        }
        self.searched = self.text.len();
        None
    }
}

/// What the engine loop needs to end a request's choices at their stop strings.
pub struct StopStrings {
    /// The strings (at least one).
    pub strings: Vec<String>,
    /// The output's decoder (the served model's tokenizer, or the synthetic words).
    pub decode: Decode,
    /// A stop token id that ends a choice stays in its text.
    pub include_stop: bool,
}

impl std::fmt::Debug for StopStrings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StopStrings")
            .field("strings", &self.strings)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::text::Text;
    use proptest::prelude::*;

    fn decode(ids: &[u32], offset: usize) -> String {
        Text::Synthetic.decode(ids, offset)
    }

    fn fed(steps: &[&[u32]], stops: &[&str], min_tokens: u32) -> (OutputText, Option<usize>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut o = OutputText::default();
        for (k, step) in steps.iter().enumerate() {
            o.ids.extend_from_slice(step);
            o.advance(&decode, o.ids.len(), false);
            if let Some((p, i)) = o.find_stop(&stops, min_tokens) {
                assert!(o.text[p..].starts_with(stops[i].as_str()));
                return (o, Some(k));
            }
        }
        (o, None)
    }

    #[test]
    fn a_stop_string_is_found_in_the_step_that_completes_it() {
        // The synthetic words run " the of and to in ...": " and to" spans the third and
        // fourth tokens, so it matches at the fourth, at the byte where " and" starts.
        let steps: Vec<&[u32]> = vec![&[0]; 8];
        let (o, at) = fed(&steps, &[" and to"], 0);
        assert_eq!(at, Some(3), "{:?}", o.text);
        let mut o2 = OutputText {
            ids: vec![0; 4],
            ..Default::default()
        };
        o2.advance(&decode, 4, false);
        assert_eq!(o2.find_stop(&[" and to".into()], 0), Some((7, 0)));
        // Inside the first min_tokens tokens it is not looked for, nor found afterwards.
        let (_, late) = fed(&steps, &[" and to"], 6);
        assert_eq!(late, None);
        // Of two strings, the one that starts first.
        let (o3, at3) = fed(&steps, &["zzz", " to", " of and"], 0);
        assert_eq!(at3, Some(2), "{:?}", o3.text);
    }

    #[test]
    fn text_outside_every_stop_string_is_marked_searched() {
        let steps: Vec<&[u32]> = vec![&[0]; 5];
        let (o, at) = fed(&steps, &["zzz"], 0);
        assert_eq!(at, None);
        assert_eq!(o.searched, o.text.len());
        assert_eq!((o.prefix, o.read), (4, 5));
    }

    proptest! {
        /// Fed a step at a time, the search reports the first step whose text holds a stop
        /// string, at the earliest such match, as a search of the whole text decoded after
        /// each step does (the oracle); and never one before `min_tokens` tokens are out.
        #[test]
        fn incremental_search_equals_searching_the_whole_text(
            steps in proptest::collection::vec(1usize..4, 1..24),
            stops in proptest::collection::vec((0usize..40, 1usize..12), 1..4),
            min_tokens in 0u32..6,
        ) {
            let whole = decode(&vec![0; 96], 0);
            // Stop strings cut from the words the synthetic model writes (some never met).
            let stops: Vec<String> = stops
                .iter()
                .map(|&(at, len)| whole[at..at + len].to_string())
                .collect();
            let mut o = OutputText::default();
            let mut found = None;
            for (k, &n) in steps.iter().enumerate() {
                o.ids.extend(std::iter::repeat_n(0, n));
                o.advance(&decode, o.ids.len(), false);
                if let Some((p, i)) = o.find_stop(&stops, min_tokens) {
                    found = Some((k, p, i));
                    break;
                }
            }
            // The oracle: no match may end in the text of the steps that left the choice
            // with `min_tokens` tokens or fewer (vLLM checks a step's new text as a whole).
            let mut want = None;
            let (mut total, mut floor) = (0, 0);
            for (k, &n) in steps.iter().enumerate() {
                total += n;
                let text = decode(&vec![0; total], 0);
                if total <= min_tokens as usize {
                    floor = text.len();
                    continue;
                }
                let hit = stops
                    .iter()
                    .enumerate()
                    .filter_map(|(i, st)| {
                        (0..text.len())
                            .find(|&p| p + st.len() > floor && text[p..].starts_with(st.as_str()))
                            .map(|p| (p, i))
                    })
                    .min_by_key(|&(p, _)| p);
                if let Some((p, i)) = hit {
                    want = Some((k, p, i));
                    break;
                }
            }
            // (Two strings matching at one offset: either is the same cut.)
            prop_assert_eq!(found.map(|(k, p, _)| (k, p)), want.map(|(k, p, _)| (k, p)));
            if let (Some((_, p, i)), Some(_)) = (found, want) {
                prop_assert!(o.text[p..].starts_with(stops[i].as_str()));
            }
        }
    }
}
