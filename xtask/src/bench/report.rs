//! Aggregation of the runs (median and spread per case, metric and mode), the text table and the
//! SVG plot.
use std::fmt::Write as _;

use serde::Serialize;

/// The three columns of the table.
pub const COLUMNS: [&str; 3] = ["tcp", "shortcut", "smcd"];
pub const COLUMN_TITLES: [&str; 3] = ["TCP", "shortcut", "SMC-D"];

/// What one mode of one metric came to over its repetitions.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Cell {
    /// Every repetition ran and took the path it was meant to.
    Ok {
        median: f64,
        min: f64,
        max: f64,
        spread_pct: f64,
        values: Vec<f64>,
    },
    /// A repetition failed (tool error, timeout, unparseable output).
    Failed { reason: String },
    /// A repetition did not take the accelerated path (its counters did not move).
    FellBack { reason: String },
    /// A fallback run took the accelerated path after all: not a fallback measurement.
    NotFallback { reason: String },
    /// The mode does not apply to this row.
    NotRun,
}

impl Cell {
    pub fn median(&self) -> Option<f64> {
        match self {
            Cell::Ok { median, .. } => Some(*median),
            _ => None,
        }
    }

    pub fn from_values(values: Vec<f64>) -> Cell {
        let mut v = values.clone();
        v.sort_by(f64::total_cmp);
        let median = if v.is_empty() {
            f64::NAN
        } else if v.len() % 2 == 1 {
            v[v.len() / 2]
        } else {
            (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
        };
        let (min, max) = (
            v.first().copied().unwrap_or(f64::NAN),
            v.last().copied().unwrap_or(f64::NAN),
        );
        let spread_pct = if median != 0.0 {
            (max - min) / median.abs() * 100.0
        } else {
            0.0
        };
        Cell::Ok {
            median,
            min,
            max,
            spread_pct,
            values,
        }
    }

    fn text(&self) -> String {
        match self {
            Cell::Ok {
                median, spread_pct, ..
            } => format!("{} ±{:.0}%", num(*median), spread_pct),
            Cell::Failed { .. } => "FAILED".into(),
            Cell::FellBack { .. } => "fell back".into(),
            Cell::NotFallback { .. } => "not fallback".into(),
            Cell::NotRun => "-".into(),
        }
    }
}

/// One row of the table: one metric of one case.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub case: String,
    pub title: String,
    pub metric: String,
    pub unit: String,
    pub higher_is_better: bool,
    pub cells: [Cell; 3],
}

impl Row {
    /// `mode / TCP` of the medians.
    pub fn ratio(&self, col: usize) -> Option<f64> {
        let base = self.cells[0].median()?;
        let v = self.cells[col].median()?;
        (base != 0.0).then_some(v / base)
    }

    /// The ratio turned so that above 1 is always better (TCP / mode for latencies).
    pub fn speedup(&self, col: usize) -> Option<f64> {
        let r = self.ratio(col)?;
        if self.higher_is_better {
            Some(r)
        } else {
            (r != 0.0).then_some(1.0 / r)
        }
    }
}

/// Three significant digits, without exponent.
pub fn num(x: f64) -> String {
    if !x.is_finite() {
        return "nan".into();
    }
    let a = x.abs();
    if a >= 1000.0 {
        format!("{x:.0}")
    } else if a >= 100.0 {
        format!("{x:.1}")
    } else if a >= 10.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// The table as fixed-width text.
pub fn table(rows: &[Row]) -> String {
    let header = [
        "case".to_string(),
        "metric".into(),
        "better".into(),
        COLUMN_TITLES[0].into(),
        COLUMN_TITLES[1].into(),
        COLUMN_TITLES[2].into(),
        "shortcut/TCP".into(),
        "SMC-D/TCP".into(),
    ];
    let mut lines: Vec<[String; 8]> = vec![header];
    for r in rows {
        let ratio = |c| {
            r.ratio(c)
                .map(|x| format!("{x:.2}x"))
                .unwrap_or_else(|| "-".into())
        };
        lines.push([
            r.title.clone(),
            format!("{} ({})", r.metric, r.unit),
            if r.higher_is_better {
                "higher".into()
            } else {
                "LOWER".into()
            },
            r.cells[0].text(),
            r.cells[1].text(),
            r.cells[2].text(),
            ratio(1),
            ratio(2),
        ]);
    }
    let mut w = [0usize; 8];
    for l in &lines {
        for (i, c) in l.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for (n, l) in lines.iter().enumerate() {
        let mut s = String::new();
        for (i, c) in l.iter().enumerate() {
            let pad = w[i] - c.chars().count();
            if i >= 3 {
                // Numbers right-aligned.
                let _ = write!(s, "{}{}  ", " ".repeat(pad), c);
            } else {
                let _ = write!(s, "{}{}  ", c, " ".repeat(pad));
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
        if n == 0 {
            out.push_str(&"-".repeat(w.iter().sum::<usize>() + 2 * 7));
            out.push('\n');
        }
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A horizontal bar chart of the speed-ups against plain TCP (shortcut and SMC-D per row).
pub fn svg(rows: &[Row], subtitle: &str) -> String {
    let label_w = 430.0;
    let plot_w = 420.0;
    let right = 90.0;
    let top = 70.0;
    let row_h = 34.0;
    let width = label_w + plot_w + right;
    let height = top + row_h * rows.len() as f64 + 50.0;
    let max = rows
        .iter()
        .flat_map(|r| [r.speedup(1), r.speedup(2)])
        .flatten()
        .fold(2.0f64, f64::max)
        .min(20.0)
        * 1.05;
    let x = |v: f64| label_w + plot_w * (v.min(max) / max);
    let colors = ["#4e79a7", "#f28e2b"];
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"##
    );
    let _ = writeln!(s, r##"<rect width="100%" height="100%" fill="white"/>"##);
    let _ = writeln!(
        s,
        r##"<text x="10" y="22" font-size="16" font-weight="bold">Speed-up against plain TCP loopback (median; &gt;1 is better; latencies as TCP/mode)</text>"##
    );
    let _ = writeln!(
        s,
        r##"<text x="10" y="42" fill="#555">{}</text>"##,
        esc(subtitle)
    );
    for (i, (name, c)) in ["shortcut", "SMC-D"].iter().zip(colors).enumerate() {
        let lx = label_w + 160.0 * i as f64;
        let _ = writeln!(
            s,
            r##"<rect x="{lx}" y="50" width="12" height="12" fill="{c}"/>"##
        );
        let _ = writeln!(s, r##"<text x="{}" y="60">{name}</text>"##, lx + 16.0);
    }
    // Grid: 0, 1 (parity, emphasised) and whole numbers up to max.
    let bottom = top + row_h * rows.len() as f64;
    let step = if max > 8.0 {
        2.0
    } else if max > 3.0 {
        1.0
    } else {
        0.5
    };
    let mut g = 0.0;
    while g <= max {
        let gx = x(g);
        let (stroke, w) = if g == 1.0 {
            ("#000", 1.5)
        } else {
            ("#ddd", 1.0)
        };
        let _ = writeln!(
            s,
            r##"<line x1="{gx}" y1="{top}" x2="{gx}" y2="{bottom}" stroke="{stroke}" stroke-width="{w}"/>"##
        );
        let _ = writeln!(
            s,
            r##"<text x="{gx}" y="{}" text-anchor="middle">{g}×</text>"##,
            bottom + 16.0
        );
        g += step;
    }
    for (i, r) in rows.iter().enumerate() {
        let y0 = top + row_h * i as f64;
        let label = format!("{} — {}", r.title, r.metric);
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end">{}</text>"##,
            label_w - 8.0,
            y0 + row_h / 2.0 + 4.0,
            esc(&label)
        );
        for (k, col) in [1usize, 2].into_iter().enumerate() {
            let by = y0 + 4.0 + 13.0 * k as f64;
            match r.speedup(col) {
                Some(v) => {
                    let _ = writeln!(
                        s,
                        r##"<rect x="{label_w}" y="{by}" width="{:.1}" height="12" fill="{}"/>"##,
                        (x(v) - label_w).max(1.0),
                        colors[k]
                    );
                    let _ = writeln!(
                        s,
                        r##"<text x="{:.1}" y="{}">{v:.2}×</text>"##,
                        x(v) + 4.0,
                        by + 10.0
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        r##"<text x="{}" y="{}" fill="{}" font-style="italic">{}</text>"##,
                        label_w + 4.0,
                        by + 10.0,
                        colors[k],
                        r.cells[col].text()
                    );
                }
            }
        }
    }
    s.push_str("</svg>\n");
    s
}
