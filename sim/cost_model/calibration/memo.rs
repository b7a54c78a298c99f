//! The `engines` stage's simulated rows kept on disk (`sim calibrate --observed --passes
//! DIR`): every row's TTFT and TPOT errors under every engine cost it was simulated with,
//! so a second run over the same rows and terms simulates nothing it already has, and a
//! run with new candidates or a new choice rule simulates only the new candidates.
//!
//! In: an engine's rows, and for each pass the cost of each GPU (an [`EngineCost`]). Out:
//! the pass's errors, read from the memo where the row and its GPU's cost were seen, else
//! simulated (in parallel, like any pass) and added. A row's errors depend only on the row
//! and its cost (every other term is compiled in or the prior's, which the cost carries),
//! so the memo gives exactly what a simulation gives. The simulator's own code is not part
//! of the key: delete the file after changing it.
//!
//! The file (`DIR/engines-<engine>.passes.tsv`) is appended to as passes finish, so a run
//! stopped part way keeps what it simulated. Its first line names the engine. `H <line>
//! <hash>` lines name each row by a hash of every field of it, as read, and what follows
//! holds for that row as hashed (a later `H` for the same line replaces it), so a row whose
//! settings changed, or that was left out, is not served errors it had under other ones while
//! every other row keeps its own. `K <index> <cost>` lines name each cost once and
//! `R <line> <index> <ttft error> <tpot error>` lines give a row's errors under it, tab
//! separated. A file whose first line still names its rows by one hash of them all (kept
//! before stop 69) is rewritten in this form when that hash is of exactly the rows it is
//! opened for, and started anew otherwise. A last line cut short (a run
//! stopped while writing) is dropped; any other bad line is refused with its file and line
//! number.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::cost_model::validation::silicon::{silicon_checks_with, EngineCost};
use crate::observed::silicon::AggregateRow;

/// TTFT and TPOT errors of rows, in the order of the pass they came from.
type Errors = Vec<(f64, f64)>;

/// The memo of one engine's rows.
pub struct Memo {
    /// Each cost's index in the file, by its text.
    keys: HashMap<String, usize>,
    /// Errors by (row line, cost index).
    errors: HashMap<(u64, usize), (f64, f64)>,
    /// Where new entries are appended (`None`: kept in memory only).
    file: Option<(PathBuf, std::fs::File)>,
    /// Rows simulated since the memo was opened (what a rerun saves).
    pub simulated: u64,
    /// Rows read from the memo instead.
    pub reused: u64,
}

/// An error of `file` at `line` (0: the file as a whole).
fn err(file: &Path, line: usize, msg: impl std::fmt::Display) -> crate::SimError {
    crate::SimError::Scenario(crate::scenario::ScenarioError {
        file: file.display().to_string(),
        msg: if line == 0 {
            msg.to_string()
        } else {
            format!("line {line}: {msg}")
        },
    })
}

/// The hash of one row: of every field (its `Debug` text, which names each field and prints
/// floats exactly), so that a row whose settings changed (its version, weight format,
/// parallelism, client) is not served the errors it had under the old ones.
fn row_hash(r: &AggregateRow) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    format!("{r:?}").hash(&mut h);
    h.finish()
}

/// The first line of a memo of `engine`.
fn header(engine: &str) -> String {
    format!("# sim calibrate --observed engines passes of {engine}: rows by hash")
}

/// The first line that memos kept before rows were hashed one by one gave `rows`: their
/// count and one hash of them all.
fn old_header(engine: &str, rows: &[AggregateRow]) -> String {
    let mut h = rustc_hash::FxHasher::default();
    for r in rows {
        format!("{r:?}").hash(&mut h);
    }
    format!(
        "# sim calibrate --observed engines passes of {engine}: {} rows, hash {:016x}",
        rows.len(),
        h.finish()
    )
}

impl Memo {
    /// A memo held in memory only.
    pub fn in_memory() -> Memo {
        Memo {
            keys: HashMap::new(),
            errors: HashMap::new(),
            file: None,
            simulated: 0,
            reused: 0,
        }
    }

    /// The memo kept in `dir` for `engine`'s `rows`: what it holds for each row as it is
    /// now read back (a file of another engine or format, or one that cannot be read, is
    /// started anew), and every row named by its hash for what is added.
    pub fn open(dir: &Path, engine: &str, rows: &[AggregateRow]) -> Result<Memo, crate::SimError> {
        std::fs::create_dir_all(dir).map_err(|e| err(dir, 0, e))?;
        let path = dir.join(format!("engines-{engine}.passes.tsv"));
        let now: HashMap<u64, u64> = rows.iter().map(|r| (r.line, row_hash(r))).collect();
        let mut memo = Memo::in_memory();
        let (head, old) = (header(engine), old_header(engine, rows));
        // Missing or unreadable (not UTF-8): started anew below, where creating it names
        // the file if that fails too.
        let mut text = std::fs::read_to_string(&path).unwrap_or_default();
        // A first line whole (a file cut inside it is started anew).
        if text.starts_with(&format!("{old}\n")) {
            // Kept before rows were hashed one by one, for these rows as they are now:
            // rewritten with each row named.
            let rest = text.split_once('\n').map_or("", |(_, rest)| rest);
            let mut named: Vec<(u64, u64)> = now.iter().map(|(&l, &h)| (l, h)).collect();
            named.sort_unstable();
            let mut t = format!("{head}\n");
            for (l, h) in named {
                t.push_str(&format!("H\t{l}\t{h:016x}\n"));
            }
            t.push_str(rest);
            std::fs::write(&path, &t).map_err(|e| err(&path, 0, e))?;
            text = t;
        }
        let kept = if text.starts_with(&format!("{head}\n")) {
            let named = memo.read(&path, &text, &now)?;
            if !text.ends_with('\n') {
                // Drop the line cut short, so that appending starts on a line of its own.
                let whole = text.rfind('\n').map_or(0, |i| i + 1);
                std::fs::write(&path, &text[..whole]).map_err(|e| err(&path, 0, e))?;
            }
            Some(named)
        } else {
            None
        };
        let mut file = match kept {
            Some(_) => std::fs::OpenOptions::new().append(true).open(&path),
            None => std::fs::File::create(&path).and_then(|mut f| {
                writeln!(f, "{head}")?;
                Ok(f)
            }),
        }
        .map_err(|e| err(&path, 0, e))?;
        // Name every row whose hash the file does not give it yet.
        let named = kept.unwrap_or_default();
        let mut lines: Vec<(u64, u64)> = now
            .iter()
            .filter(|(l, h)| named.get(l) != Some(h))
            .map(|(&l, &h)| (l, h))
            .collect();
        lines.sort_unstable();
        for (l, h) in lines {
            writeln!(file, "H\t{l}\t{h:016x}").map_err(|e| err(&path, 0, e))?;
        }
        file.flush().map_err(|e| err(&path, 0, e))?;
        memo.file = Some((path, file));
        Ok(memo)
    }

    /// Reads a memo's lines after its first, keeping the errors of rows as `now` hashes
    /// them; returns each row's hash as the file last names it.
    fn read(
        &mut self,
        path: &Path,
        text: &str,
        now: &HashMap<u64, u64>,
    ) -> Result<HashMap<u64, u64>, crate::SimError> {
        let mut named = HashMap::new();
        let lines: Vec<&str> = text.lines().collect();
        // A file that does not end in a newline was cut short: its last line is dropped.
        let whole = if text.ends_with('\n') {
            lines.len()
        } else {
            lines.len().saturating_sub(1)
        };
        for (i, line) in lines.iter().enumerate().take(whole).skip(1) {
            let n = i + 1;
            let mut f = line.split('\t');
            let count = |s: &str, what: &str| {
                s.parse::<u64>()
                    .map_err(|_| err(path, n, format!("{what} `{s}` is not a count")))
            };
            match (f.next(), f.next(), f.next(), f.next(), f.next(), f.next()) {
                (Some("H"), Some(l), Some(h), None, None, None) => {
                    let l = count(l, "row line")?;
                    let h = u64::from_str_radix(h, 16)
                        .map_err(|_| err(path, n, format!("row hash `{h}` is not hexadecimal")))?;
                    named.insert(l, h);
                }
                (Some("K"), Some(k), Some(cost), None, None, None) => {
                    let k: usize = k
                        .parse()
                        .map_err(|_| err(path, n, format!("cost index `{k}` is not a count")))?;
                    if k != self.keys.len() || self.keys.contains_key(cost) {
                        return Err(err(path, n, format!("cost {k} out of order or repeated")));
                    }
                    self.keys.insert(cost.to_string(), k);
                }
                (Some("R"), Some(l), Some(k), Some(t), Some(p), None) => {
                    let num = |s: &str, what: &str| {
                        s.parse::<f64>()
                            .map_err(|_| err(path, n, format!("{what} `{s}` is not a number")))
                    };
                    let l = count(l, "row line")?;
                    let k: usize = k
                        .parse()
                        .ok()
                        .filter(|&k| k < self.keys.len())
                        .ok_or_else(|| err(path, n, format!("cost `{k}` not named above")))?;
                    let e = (num(t, "TTFT error")?, num(p, "TPOT error")?);
                    // Kept only for the row as it is now.
                    if named.get(&l).is_some_and(|h| now.get(&l) == Some(h)) {
                        self.errors.insert((l, k), e);
                    }
                }
                _ => return Err(err(
                    path,
                    n,
                    "expected `H<tab>line<tab>hash`, `K<tab>index<tab>cost` or `R<tab>line<tab>cost<tab>ttft<tab>tpot`",
                )),
            }
        }
        Ok(named)
    }

    /// The index of `cost`, named in the file when new.
    fn key(&mut self, cost: &EngineCost) -> Result<usize, crate::SimError> {
        let text = format!("{cost:?}");
        if let Some(&k) = self.keys.get(&text) {
            return Ok(k);
        }
        let k = self.keys.len();
        if let Some((path, f)) = &mut self.file {
            writeln!(f, "K\t{k}\t{text}").map_err(|e| err(path, 0, e))?;
        }
        self.keys.insert(text, k);
        Ok(k)
    }

    /// Errors of each of `rows` that runs (`gpu_of`: its catalog GPU by line, from the
    /// stage's first pass) under its GPU's `cost`, by line: read where known, the rest
    /// simulated together and added.
    pub fn errors(
        &mut self,
        rows: &[AggregateRow],
        gpu_of: &HashMap<u64, &'static str>,
        cost: &(dyn Fn(&str) -> EngineCost + Sync),
    ) -> Result<HashMap<u64, (f64, f64)>, crate::SimError> {
        let mut out = HashMap::new();
        let mut missing: Vec<AggregateRow> = Vec::new();
        let mut key_of: HashMap<u64, usize> = HashMap::new();
        // A pass's cost is one per GPU: named once per GPU, not once per row.
        let mut key_of_gpu: HashMap<&str, usize> = HashMap::new();
        for r in rows {
            let Some(&gpu) = gpu_of.get(&r.line) else {
                continue;
            };
            let k = match key_of_gpu.get(gpu) {
                Some(&k) => k,
                None => {
                    let k = self.key(&cost(gpu))?;
                    key_of_gpu.insert(gpu, k);
                    k
                }
            };
            key_of.insert(r.line, k);
            match self.errors.get(&(r.line, k)) {
                Some(&e) => {
                    out.insert(r.line, e);
                    self.reused += 1;
                }
                None => missing.push(r.clone()),
            }
        }
        if missing.is_empty() {
            return Ok(out);
        }
        let (done, _) = silicon_checks_with(&missing, None, &|_, gpu| cost(gpu))?;
        self.simulated += done.len() as u64;
        for k in &done {
            let e = (k.ttft_error(), k.tpot_error());
            let key = *key_of.get(&k.row.line).ok_or_else(|| {
                err(
                    Path::new("silicon.csv"),
                    0,
                    format!("row `{}` ran but was not asked for", k.row.id),
                )
            })?;
            if let Some((path, f)) = &mut self.file {
                writeln!(f, "R\t{}\t{key}\t{}\t{}", k.row.line, e.0, e.1)
                    .map_err(|e| err(path, 0, e))?;
            }
            self.errors.insert((k.row.line, key), e);
            out.insert(k.row.line, e);
        }
        if let Some((path, f)) = &mut self.file {
            f.flush().map_err(|e| err(path, 0, e))?;
        }
        Ok(out)
    }
}

/// A pass over `rows` through `memo`, in the order of the stage's first pass (`index`: each
/// running row's position by its line): errors for every position, or the line of a row
/// that ran in the first pass and not in this one.
pub(super) fn memo_pass(
    memo: &std::cell::RefCell<Memo>,
    rows: &[AggregateRow],
    gpu_of: &HashMap<u64, &'static str>,
    (index, base): (&HashMap<u64, usize>, &Errors),
    cost: &(dyn Fn(&str) -> EngineCost + Sync),
) -> Result<Errors, crate::SimError> {
    let found = memo.borrow_mut().errors(rows, gpu_of, cost)?;
    let mut errors = base.clone();
    for r in rows {
        if let Some(&i) = index.get(&r.line) {
            let e = found.get(&r.line).ok_or_else(|| {
                crate::SimError::Scenario(crate::scenario::ScenarioError {
                    file: format!("line {}", r.line),
                    msg: format!(
                        "row `{}` ran under one candidate of the fit but not under another",
                        r.id
                    ),
                })
            })?;
            errors[i] = *e;
        }
    }
    Ok(errors)
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::HashMap;

    use super::{memo_pass, Memo};
    use crate::cost_model::calibration::observed::pass_with_lines;
    use crate::cost_model::validation::silicon::EngineCost;

    fn rows() -> Vec<crate::observed::silicon::AggregateRow> {
        crate::observed::silicon::read(std::path::Path::new(
            "tests/data/observed/silicon-small.csv",
        ))
        .expect("rows")
    }

    /// Passes through a memo give a full simulation's errors; a kept file is read back
    /// (nothing simulated again), a last line cut short is dropped and simulated again,
    /// and a bad line elsewhere is refused with its file and line.
    #[test]
    fn a_memo_gives_the_simulations_errors_and_keeps_them() {
        let rows = rows();
        let slow = EngineCost {
            step_overhead_us: Some(2500.0),
            ..EngineCost::default()
        };
        let (_, gpus, first, index) =
            pass_with_lines(&rows, &|_| EngineCost::default()).expect("pass");
        let (_, _, full, _) = pass_with_lines(&rows, &|_| slow).expect("pass");
        assert_ne!(full, first);
        let gpu_of: HashMap<u64, &'static str> =
            index.iter().map(|(&l, &i)| (l, gpus[i])).collect();
        let n = first.len() as u64;
        let memo = RefCell::new(Memo::in_memory());
        let got = memo_pass(&memo, &rows, &gpu_of, (&index, &first), &|_| slow).expect("memo");
        assert_eq!(got, full);
        let again = memo_pass(&memo, &rows, &gpu_of, (&index, &first), &|_| slow).expect("memo");
        assert_eq!(again, full);
        assert_eq!((memo.borrow().simulated, memo.borrow().reused), (n, n));

        let dir = tempfile::tempdir().expect("tempdir");
        let kept = |memo: Memo| -> (Vec<(f64, f64)>, u64) {
            let memo = RefCell::new(memo);
            let e = memo_pass(&memo, &rows, &gpu_of, (&index, &first), &|_| slow).expect("memo");
            let simulated = memo.borrow().simulated;
            (e, simulated)
        };
        let open = || Memo::open(dir.path(), "vllm", &rows).expect("memo");
        assert_eq!(kept(open()), (full.clone(), n));
        assert_eq!(
            kept(open()),
            (full.clone(), 0),
            "read back, nothing simulated"
        );
        let path = dir.path().join("engines-vllm.passes.tsv");
        let text = std::fs::read_to_string(&path).expect("file");
        assert_eq!(
            text.lines().count() as u64,
            2 + 2 * n,
            "a header, a line naming each row, one cost, a line a row"
        );
        // Cut inside the last line: it is dropped, and only its row simulated again.
        std::fs::write(&path, &text[..text.len() - 3]).expect("cut");
        assert_eq!(kept(open()), (full.clone(), 1));
        assert_eq!(
            kept(open()),
            (full.clone(), 0),
            "the cut row kept on a line of its own"
        );
        // Opened for some of the rows: every row keeps its errors.
        drop(Memo::open(dir.path(), "vllm", &rows[1..]).expect("memo"));
        assert_eq!(kept(open()), (full.clone(), 0));
        // A row with a setting changed that no length or measurement shows (the engine's
        // version): only it is simulated again, and the row as it was keeps its errors.
        let mut changed = rows.clone();
        changed[0].backend_version.push_str(".post1");
        let memo = RefCell::new(Memo::open(dir.path(), "vllm", &changed).expect("memo"));
        memo_pass(&memo, &changed, &gpu_of, (&index, &first), &|_| slow).expect("memo");
        assert_eq!(memo.borrow().simulated, 1);
        drop(memo);
        assert_eq!(kept(open()), (full.clone(), 0));
        // A memo kept before rows were named one by one (one hash of them all), for these
        // rows: read back, nothing simulated, and rewritten with each row named.
        let old_dir = tempfile::tempdir().expect("tempdir");
        let mut old = format!("{}\nK\t0\t{slow:?}\n", super::old_header("vllm", &rows));
        for r in &rows {
            if let Some(&i) = index.get(&r.line) {
                old.push_str(&format!("R\t{}\t0\t{}\t{}\n", r.line, full[i].0, full[i].1));
            }
        }
        let old_path = old_dir.path().join("engines-vllm.passes.tsv");
        std::fs::write(&old_path, old).expect("old");
        let memo = Memo::open(old_dir.path(), "vllm", &rows).expect("memo");
        assert_eq!(kept(memo), (full.clone(), 0));
        let text = std::fs::read_to_string(&old_path).expect("file");
        assert!(
            text.starts_with(&format!("{}\nH\t", super::header("vllm"))),
            "{text}"
        );
        // Kept for other rows in that format: started anew.
        let old = format!(
            "{}\nK\t0\t{slow:?}\n",
            super::old_header("vllm", &rows[1..])
        );
        std::fs::write(&old_path, old).expect("old");
        let memo = Memo::open(old_dir.path(), "vllm", &rows).expect("memo");
        assert_eq!(kept(memo), (full.clone(), n));
        // A bad line inside the file.
        let text = std::fs::read_to_string(&path).expect("file");
        let mut lines: Vec<&str> = text.lines().collect();
        lines[2] = "R\t12\tx\t0.1\t0.2";
        std::fs::write(&path, lines.join("\n") + "\n").expect("bad");
        let e = Memo::open(dir.path(), "vllm", &rows)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains("engines-vllm.passes.tsv") && e.contains("line 3"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }
}
