//! `authority where --svg`: the groups as a grid of squares, the ones that
//! can open the key filled, the others hollow; with traffic, a disc in
//! each whose area is the load it would sign (its own and what it
//! receives), red where the load passes the warning ratio, and a line
//! from every group that forwards to the group it forwards to. Meant to be
//! read without the numbers: where the key lives, and where the world's
//! handshakes pile up. Each square's tooltip carries the numbers.

use std::fmt::Write as _;

use keyfence::wrap::WhereReport;

const CELL: f64 = 40.0;
const MARGIN: f64 = 20.0;
const HEADER: f64 = 96.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn rate(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// The picture of `r`, as SVG text.
pub fn draw(r: &WhereReport) -> String {
    // Near groups side by side: ordered by their `near` value, then value.
    let mut order: Vec<usize> = (0..r.groups.len()).collect();
    order.sort_by(|&a, &b| (&r.groups[a].near, &r.groups[a].value).cmp(&(&r.groups[b].near, &r.groups[b].value)));
    let n = order.len().max(1);
    let cols = ((n as f64 * 1.6).sqrt().ceil() as usize).clamp(1, n);
    let rows = n.div_ceil(cols);
    let width = MARGIN * 2.0 + cols as f64 * CELL;
    let width = width.max(640.0);
    let height = HEADER + MARGIN + rows as f64 * CELL + MARGIN;
    let mut pos = vec![(0.0, 0.0); r.groups.len()];
    for (k, &i) in order.iter().enumerate() {
        pos[i] = (MARGIN + (k % cols) as f64 * CELL + CELL / 2.0, HEADER + (k / cols) as f64 * CELL + CELL / 2.0);
    }
    let max_load = r.groups.iter().filter_map(|g| g.load_rps()).fold(0.0, f64::max);
    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif">"##
    );
    s.push_str(r##"<rect width="100%" height="100%" fill="#ffffff"/>"##);
    let _ = write!(s, r##"<text x="{MARGIN}" y="26" font-size="16" font-weight="bold">Where `{}` can be used</text>"##, esc(&r.policy));
    let mut line = format!(
        "{} of {} live machines satisfy it; {} of {} groups by {}",
        r.matching,
        r.total,
        r.groups.iter().filter(|g| g.satisfies()).count(),
        r.groups.len(),
        r.by.as_deref().unwrap_or("-")
    );
    if let (Some(share), Some(total)) = (r.remote_share, r.total_rps) {
        let _ = write!(line, "; {:.0}% of {} handshakes/s signed remotely", share * 100.0, rate(total));
    }
    let _ = write!(s, r##"<text x="{MARGIN}" y="48" font-size="12">{}</text>"##, esc(&line));
    // The legend.
    let legend_y = 70.0;
    let _ = write!(s, r##"<rect x="{MARGIN}" y="{}" width="14" height="14" fill="#2e7d32"/>"##, legend_y - 11.0);
    let _ = write!(s, r##"<text x="{}" y="{legend_y}" font-size="12">can open the key</text>"##, MARGIN + 20.0);
    let _ = write!(s, r##"<rect x="{}" y="{}" width="14" height="14" fill="#f2f2f2" stroke="#9e9e9e"/>"##, MARGIN + 140.0, legend_y - 11.0);
    let _ = write!(s, r##"<text x="{}" y="{legend_y}" font-size="12">cannot</text>"##, MARGIN + 160.0);
    if max_load > 0.0 {
        let _ = write!(s, r##"<circle cx="{}" cy="{}" r="6" fill="#1565c0"/>"##, MARGIN + 227.0, legend_y - 4.0);
        let _ = write!(s, r##"<text x="{}" y="{legend_y}" font-size="12">load signed (area)</text>"##, MARGIN + 238.0);
        let _ = write!(s, r##"<circle cx="{}" cy="{}" r="6" fill="#d32f2f"/>"##, MARGIN + 367.0, legend_y - 4.0);
        let _ = write!(s, r##"<text x="{}" y="{legend_y}" font-size="12">over the warning ratio</text>"##, MARGIN + 378.0);
    }
    // Forwarding first, under the squares.
    s.push_str(r##"<g stroke="#ef6c00" stroke-opacity="0.35" stroke-width="1">"##);
    for (i, g) in r.groups.iter().enumerate() {
        let Some(to) = &g.sends_to else { continue };
        if g.own_rps.unwrap_or(0.0) <= 0.0 {
            continue;
        }
        if let Some(j) = r.groups.iter().position(|x| &x.value == to) {
            let ((x1, y1), (x2, y2)) = (pos[i], pos[j]);
            let _ = write!(s, r##"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}"/>"##);
        }
    }
    s.push_str("</g>");
    for (i, g) in r.groups.iter().enumerate() {
        let (cx, cy) = pos[i];
        let (x, y) = (cx - CELL / 2.0 + 3.0, cy - CELL / 2.0 + 3.0);
        let side = CELL - 6.0;
        let warn = g.warning.is_some();
        let (fill, stroke) = if g.satisfies() { ("#2e7d32", "#1b5e20") } else { ("#f2f2f2", "#9e9e9e") };
        let mut tip = format!("{}: {}/{} machines satisfy it", g.value, g.matching, g.total);
        if let (Some(own), Some(rec)) = (g.own_rps, g.received_rps) {
            let _ = write!(tip, "; own {}/s, receives {}/s", rate(own), rate(rec));
        }
        if let Some(to) = &g.sends_to {
            let _ = write!(tip, "; sends to {to}");
        }
        if let Some(w) = &g.warning {
            let _ = write!(tip, "; warning: {w}");
        }
        let _ = write!(s, r##"<g><title>{}</title>"##, esc(&tip));
        let opacity = if g.satisfies() && g.total > 0 { 0.45 + 0.55 * g.matching as f64 / g.total as f64 } else { 1.0 };
        let _ = write!(
            s,
            r##"<rect x="{x:.1}" y="{y:.1}" width="{side:.1}" height="{side:.1}" fill="{fill}" fill-opacity="{opacity:.2}" stroke="{}" stroke-width="{}"/>"##,
            if warn { "#d32f2f" } else { stroke },
            if warn { 3 } else { 1 }
        );
        if let Some(load) = g.load_rps().filter(|l| *l > 0.0 && max_load > 0.0) {
            let radius = (side / 2.0) * (load / max_load).sqrt();
            let colour = if warn { "#d32f2f" } else { "#1565c0" };
            let _ = write!(s, r##"<circle cx="{cx:.1}" cy="{cy:.1}" r="{:.1}" fill="{colour}" fill-opacity="0.85"/>"##, radius.max(1.5));
        }
        let label = if g.value.chars().count() > 6 { g.value.chars().take(6).collect::<String>() } else { g.value.clone() };
        let _ = write!(
            s,
            r##"<text x="{cx:.1}" y="{:.1}" font-size="8" text-anchor="middle" fill="{}">{}</text>"##,
            cy + CELL / 2.0 - 5.0,
            if g.satisfies() { "#ffffff" } else { "#616161" },
            esc(&label)
        );
        s.push_str("</g>");
    }
    s.push_str("</svg>\n");
    s
}
