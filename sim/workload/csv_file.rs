//! Reading CSV files with a header (traces, empirical length columns): opening, finding
//! columns by name, and parsing token counts, every error naming the file, line and column.

use std::fs::File;
use std::path::Path;

use super::WorkloadError;

pub(super) fn open_csv(path: &Path) -> Result<csv::Reader<File>, WorkloadError> {
    let file = File::open(path).map_err(|source| WorkloadError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(file))
}

/// Index of each of `columns` in the header of `reader`.
pub(super) fn column_indices<const N: usize>(
    reader: &mut csv::Reader<File>,
    path: &Path,
    columns: [&str; N],
) -> Result<[usize; N], WorkloadError> {
    let headers = reader.headers().map_err(|e| WorkloadError::csv(path, &e))?;
    let mut out = [0usize; N];
    for (slot, column) in out.iter_mut().zip(columns) {
        *slot = headers
            .iter()
            .position(|h| h.trim_start_matches('\u{feff}') == column)
            .ok_or_else(|| WorkloadError::MissingColumn {
                path: path.to_path_buf(),
                column: column.to_string(),
            })?;
    }
    Ok(out)
}

/// 1-based line of `record` (0 when unknown, which the csv reader never leaves it).
pub(super) fn record_line(record: &csv::StringRecord) -> u64 {
    record.position().map_or(0, |p| p.line())
}

/// The text of column `idx` of `record`, or an error naming the missing column.
pub(super) fn field<'r>(
    record: &'r csv::StringRecord,
    idx: usize,
    path: &Path,
    column: &str,
) -> Result<&'r str, WorkloadError> {
    match record.get(idx) {
        Some(text) if !text.is_empty() => Ok(text),
        other => Err(WorkloadError::BadValue {
            path: path.to_path_buf(),
            line: record_line(record),
            column: column.to_string(),
            text: super::error::quoted(other.unwrap_or_default()),
            message: "missing value".to_string(),
        }),
    }
}

/// Parses a token count: a non-negative number (rounded to an integer) that fits in u32.
pub(super) fn parse_count(
    text: &str,
    record: &csv::StringRecord,
    path: &Path,
    column: &str,
) -> Result<u32, WorkloadError> {
    let bad = |message: &str| WorkloadError::BadValue {
        path: path.to_path_buf(),
        line: record_line(record),
        column: column.to_string(),
        text: super::error::quoted(text),
        message: message.to_string(),
    };
    if let Ok(v) = text.parse::<u32>() {
        return Ok(v);
    }
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => {
            let r = v.round();
            if r <= f64::from(u32::MAX) {
                Ok(r as u32)
            } else {
                Err(bad("token count too large"))
            }
        }
        _ => Err(bad("expected a non-negative token count")),
    }
}

/// Loads the values of `columns` of every row of a CSV, as token counts.
pub(super) fn load_counts<const N: usize>(
    path: &Path,
    columns: [&str; N],
) -> Result<Vec<[u32; N]>, WorkloadError> {
    let mut reader = open_csv(path)?;
    let idx = column_indices(&mut reader, path, columns)?;
    let mut record = csv::StringRecord::new();
    let mut rows = Vec::new();
    while reader
        .read_record(&mut record)
        .map_err(|e| WorkloadError::csv(path, &e))?
    {
        let mut row = [0u32; N];
        for ((slot, &i), column) in row.iter_mut().zip(&idx).zip(columns) {
            let text = field(&record, i, path, column)?;
            *slot = parse_count(text, &record, path, column)?;
        }
        rows.push(row);
    }
    if rows.is_empty() {
        return Err(WorkloadError::EmptyColumn {
            path: path.to_path_buf(),
            column: columns.join(", "),
        });
    }
    Ok(rows)
}

/// Counts the data rows of a CSV (without parsing values).
pub(super) fn count_rows(path: &Path) -> Result<u64, WorkloadError> {
    let mut reader = open_csv(path)?;
    let mut record = csv::ByteRecord::new();
    let mut n = 0u64;
    while reader
        .read_byte_record(&mut record)
        .map_err(|e| WorkloadError::csv(path, &e))?
    {
        n += 1;
    }
    Ok(n)
}
