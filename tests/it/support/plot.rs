//! A plot as SVG, drawn by hand (no crate, no script): one small panel per series against a
//! shared x axis, each panel scaled from 0 to its own peak, so a series that grows shows as a
//! line that climbs and a flat one as a line that does not.

use std::fmt::Write as _;

const W: f64 = 260.0;
const H: f64 = 110.0;
const COLS: usize = 4;
const PAD: f64 = 34.0;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The series (name, points (x, y)) as a grid of panels.
pub fn small_multiples(title: &str, x_label: &str, series: &[(String, Vec<(f64, f64)>)]) -> String {
    let rows = series.len().div_ceil(COLS);
    let (width, height) = (COLS as f64 * W, rows as f64 * H + 30.0);
    let x_max = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="10">"#
    );
    let _ = write!(
        svg,
        r#"<rect width="100%" height="100%" fill="white"/><text x="8" y="18" font-size="13">{} (x: {}, 0 to {x_max}; each panel 0 to its peak)</text>"#,
        escape(title),
        escape(x_label)
    );
    for (i, (name, points)) in series.iter().enumerate() {
        let (ox, oy) = ((i % COLS) as f64 * W, 30.0 + (i / COLS) as f64 * H);
        let y_max = points.iter().map(|p| p.1).fold(0.0, f64::max);
        let scale_y = if y_max > 0.0 { y_max } else { 1.0 };
        let (pw, ph) = (W - PAD - 8.0, H - 36.0);
        let _ = write!(
            svg,
            r##"<g transform="translate({ox},{oy})"><text x="{PAD}" y="10">{} (peak {y_max:.1})</text><rect x="{PAD}" y="16" width="{pw}" height="{ph}" fill="none" stroke="#bbb"/>"##,
            escape(name)
        );
        let path: Vec<String> = points
            .iter()
            .map(|(x, y)| {
                format!(
                    "{:.1},{:.1}",
                    PAD + x / x_max * pw,
                    16.0 + ph - y / scale_y * ph
                )
            })
            .collect();
        let _ = write!(
            svg,
            r##"<polyline fill="none" stroke="#2b6cb0" stroke-width="1.5" points="{}"/></g>"##,
            path.join(" ")
        );
    }
    svg.push_str("</svg>\n");
    svg
}
