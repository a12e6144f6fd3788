//! Summaries of repeated measurements: the median with min and max over rounds (what the report
//! quotes), and percentiles over trials (for latencies). Ratios are always computed per round,
//! against a baseline measured in that same round, and then summarised like any other sample.

use std::fmt::Write as _;

/// The median, min and max of a set of samples (one per round, usually).
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    pub fn of(samples: &[f64]) -> Summary {
        assert!(!samples.is_empty(), "summary of no samples");
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        Summary {
            median: median_sorted(&v),
            min: v[0],
            max: v[v.len() - 1],
        }
    }

    /// `median (min–max)` with the given formatter.
    pub fn show(&self, f: impl Fn(f64) -> String) -> String {
        format!("{} ({}–{})", f(self.median), f(self.min), f(self.max))
    }
}

pub fn median(samples: &[f64]) -> f64 {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    median_sorted(&v)
}

fn median_sorted(v: &[f64]) -> f64 {
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Nearest-rank percentile (p in 0..=100): the smallest sample with at least p% of the samples at
/// or below it. With 200 trials, p99 is the second-largest sample.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    assert!(!samples.is_empty(), "percentile of no samples");
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

pub fn ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0} ms")
    } else if v >= 10.0 {
        format!("{v:.1} ms")
    } else {
        format!("{v:.2} ms")
    }
}

pub fn ratio(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}×")
    } else {
        format!("{v:.2}×")
    }
}

pub fn mb(kib: f64) -> String {
    format!("{:.2} MB", kib / 1024.0)
}

/// A markdown table, built row by row.
pub struct Table {
    head: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(head: &[&str]) -> Table {
        Table {
            head: head.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(cells.len(), self.head.len(), "table row width");
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let line = |cells: &[String]| format!("| {} |", cells.join(" | "));
        let _ = writeln!(out, "{}", line(&self.head));
        let sep: Vec<String> = self.head.iter().map(|_| "---".to_string()).collect();
        let _ = writeln!(out, "{}", line(&sep));
        for r in &self.rows {
            let _ = writeln!(out, "{}", line(r));
        }
        out
    }
}
