//! The one median and percentile of every benchmark, and the table printer of their text
//! output.

/// The `p`-th percentile (0 to 100, nearest rank) of `v`; NaN for no values.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((p.clamp(0.0, 100.0) / 100.0) * (s.len() - 1) as f64).round() as usize;
    s[i.min(s.len() - 1)]
}

/// One line of a right-aligned table: each cell padded to its column's width.
pub fn table_line(cells: &[String], columns: &[(&str, usize)]) -> String {
    cells
        .iter()
        .zip(columns)
        .map(|(c, (_, w))| format!("{c:>w$}", w = *w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The header line of a table with `columns`.
pub fn table_header(columns: &[(&str, usize)]) -> String {
    let names: Vec<String> = columns.iter().map(|c| c.0.to_string()).collect();
    table_line(&names, columns)
}

/// The median of `v` (the upper middle value for an even count); NaN for no values.
pub fn median(v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v;
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_percentiles() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
        assert!(median(Vec::new()).is_nan());
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&v, 90.0), 90.0);
    }
}
