//! Error text as a user reads it: one line, short. serde's "unknown field `x`, expected one
//! of ..." lists every key of the table (some have thirty); a list longer than a line
//! becomes the nearest key ("did you mean `max_num_seqs`?"). Short lists (an enum's
//! variants) stay whole.

/// `msg` on one line, an unknown-key message shortened to the key and the closest one.
pub fn concise(msg: &str) -> String {
    let msg = msg.trim().replace('\n', " ");
    let Some((head, list)) = msg.split_once(", expected one of ") else {
        return msg;
    };
    if list.len() <= 160 {
        return msg;
    }
    let unknown = head
        .split('`')
        .nth(1)
        .unwrap_or_default()
        .to_ascii_lowercase();
    let keys = list
        .split(", ")
        .map(|k| k.trim().trim_matches('`'))
        .filter(|k| !k.is_empty());
    match nearest(&unknown, keys, 0.7) {
        Some(k) => format!("{head} (did you mean `{k}`?)"),
        None => format!("{head} (see the README for the keys of this table)"),
    }
}

/// The known name closest to `name` (Jaro-Winkler, case-insensitive), if above `threshold`.
fn nearest<'a>(
    name: &str,
    known: impl Iterator<Item = &'a str>,
    threshold: f64,
) -> Option<&'a str> {
    let lower = name.to_ascii_lowercase();
    known
        .map(|k| (strsim::jaro_winkler(&lower, &k.to_ascii_lowercase()), k))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .filter(|(score, _)| *score > threshold)
        .map(|(_, k)| k)
}

/// An unknown catalog name's message: the nearest known name when one is close, and
/// where the whole list is (`listed_by`, e.g. `sim models`), so the line stays short as the
/// catalog grows.
pub fn unknown_name(what: &str, name: &str, known: &[&str], listed_by: &str) -> String {
    match nearest(name, known.iter().copied(), 0.8) {
        Some(k) => {
            format!("unknown {what} `{name}` (did you mean `{k}`? `{listed_by}` lists them)")
        }
        _ => format!(
            "unknown {what} `{name}` (`{listed_by}` lists the {} known)",
            known.len()
        ),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn unknown_keys_name_the_nearest_one() {
        let keys = "`scheduler`, `block_size`, `max_num_seqs`, `max_num_batched_tokens`, \
                    `max_model_len`, `gpu_memory_utilization`, `runtime_overhead_gib`, \
                    `num_gpu_blocks_override`, `enable_prefix_caching`";
        let m = super::concise(&format!(
            "unknown field `max_num_seq`, expected one of {keys}"
        ));
        assert_eq!(
            m,
            "unknown field `max_num_seq` (did you mean `max_num_seqs`?)"
        );
        // An enum's few variants stay listed.
        let short = "unknown variant `int3`, expected one of `int4`, `int8`";
        assert_eq!(super::concise(short), short);
        assert_eq!(
            super::concise("missing field `name`\n"),
            "missing field `name`"
        );
    }
}
