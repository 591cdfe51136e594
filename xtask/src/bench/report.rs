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

/// A horizontal bar chart of the speed-ups against plain TCP (shortcut and SMC-D per row), on a
/// log scale around 1× (bars to the right: better than TCP; to the left: worse).
pub fn svg(rows: &[Row], subtitle: &str) -> String {
    let labels: Vec<String> = rows
        .iter()
        .map(|r| format!("{} — {}", r.title, r.metric))
        .collect();
    let label_w = 20.0 + 6.6 * labels.iter().map(|l| l.chars().count()).max().unwrap_or(10) as f64;
    let plot_w = 480.0;
    let right = 70.0;
    // Room left of the plot for the value labels of bars that go left.
    let gap = 50.0;
    let top = 78.0;
    let row_h = 34.0;
    let width = (label_w + gap + plot_w + right).max(900.0);
    let height = top + row_h * rows.len() as f64 + 40.0;
    let values: Vec<f64> = rows
        .iter()
        .flat_map(|r| [r.speedup(1), r.speedup(2)])
        .flatten()
        .collect();
    let lo = values.iter().copied().fold(0.5f64, f64::min).max(1e-3) / 1.3;
    let hi = values.iter().copied().fold(2.0f64, f64::max).min(1e4) * 1.3;
    let x =
        |v: f64| label_w + gap + plot_w * (v.clamp(lo, hi).ln() - lo.ln()) / (hi.ln() - lo.ln());
    let colors = ["#4e79a7", "#f28e2b"];
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="12">"##
    );
    let _ = writeln!(s, r##"<rect width="100%" height="100%" fill="white"/>"##);
    let _ = writeln!(
        s,
        r##"<text x="10" y="22" font-size="16" font-weight="bold">Speed-up against plain TCP loopback (median, log scale, right of 1× is better)</text>"##
    );
    let _ = writeln!(
        s,
        r##"<text x="10" y="42" fill="#555">{}</text>"##,
        esc(subtitle)
    );
    for (i, (name, c)) in ["shortcut", "SMC-D"].iter().zip(colors).enumerate() {
        let lx = label_w + 120.0 * i as f64;
        let _ = writeln!(
            s,
            r##"<rect x="{lx:.1}" y="52" width="12" height="12" fill="{c}"/>"##
        );
        let _ = writeln!(s, r##"<text x="{:.1}" y="62">{name}</text>"##, lx + 16.0);
    }
    let bottom = top + row_h * rows.len() as f64;
    let mut decade = lo.log10().floor() as i32;
    while 10f64.powi(decade) <= hi {
        for m in [1.0, 2.0, 5.0] {
            let g = m * 10f64.powi(decade);
            if g < lo || g > hi {
                continue;
            }
            let gx = x(g);
            let (stroke, w) = if g == 1.0 {
                ("#000", 1.5)
            } else {
                ("#ddd", 1.0)
            };
            let _ = writeln!(
                s,
                r##"<line x1="{gx:.1}" y1="{top}" x2="{gx:.1}" y2="{bottom}" stroke="{stroke}" stroke-width="{w}"/>"##
            );
            let _ = writeln!(
                s,
                r##"<text x="{gx:.1}" y="{}" text-anchor="middle">{}×</text>"##,
                bottom + 16.0,
                num_short(g)
            );
        }
        decade += 1;
    }
    let one = x(1.0);
    for (i, (r, label)) in rows.iter().zip(&labels).enumerate() {
        let y0 = top + row_h * i as f64;
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{}" text-anchor="end">{}</text>"##,
            label_w - 8.0,
            y0 + row_h / 2.0 + 4.0,
            esc(label)
        );
        for (k, col) in [1usize, 2].into_iter().enumerate() {
            let by = y0 + 4.0 + 13.0 * k as f64;
            match r.speedup(col) {
                Some(v) => {
                    let (x0, x1) = if v >= 1.0 { (one, x(v)) } else { (x(v), one) };
                    let _ = writeln!(
                        s,
                        r##"<rect x="{x0:.1}" y="{by}" width="{:.1}" height="12" fill="{}"/>"##,
                        (x1 - x0).max(1.0),
                        colors[k]
                    );
                    let (tx, anchor) = if v >= 1.0 {
                        (x1 + 4.0, "start")
                    } else {
                        (x0 - 4.0, "end")
                    };
                    let _ = writeln!(
                        s,
                        r##"<text x="{tx:.1}" y="{}" text-anchor="{anchor}">{}×</text>"##,
                        by + 10.0,
                        num_short(v)
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        r##"<text x="{:.1}" y="{}" fill="{}" font-style="italic">{}</text>"##,
                        one + 4.0,
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

/// 0.05, 0.5, 2, 37, 2183: two decimals below 10, none above.
fn num_short(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else if v >= 0.1 {
        format!("{:.2}", v)
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(title: &str, higher: bool, cells: [Cell; 3]) -> Row {
        Row {
            case: title.into(),
            title: title.into(),
            metric: "m".into(),
            unit: "u".into(),
            higher_is_better: higher,
            cells,
        }
    }

    #[test]
    fn ratios_table_and_plot() {
        let ok = |v: f64| Cell::from_values(vec![v, v, v]);
        let rows = vec![
            row("latency", false, [ok(20.0), ok(10.0), ok(0.5)]),
            row(
                "rate",
                true,
                [ok(100.0), ok(80.0), Cell::FellBack { reason: "x".into() }],
            ),
        ];
        assert_eq!(rows[0].ratio(2), Some(0.025));
        assert_eq!(rows[0].speedup(2), Some(40.0));
        assert_eq!(rows[1].speedup(1), Some(0.8));
        assert_eq!(rows[1].ratio(2), None);
        let t = table(&rows);
        assert!(
            t.contains("0.03x") && t.contains("fell back") && t.contains("LOWER"),
            "{t}"
        );
        let svg = svg(&rows, "test");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("40×") && svg.contains("0.8×") && svg.contains("fell back"));
        if let Some(p) = std::env::var_os("SMC_BENCH_SVG_OUT") {
            std::fs::write(p, svg).unwrap();
        }
    }
}
