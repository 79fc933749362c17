//! A history drawn as an SVG timeline, in the style of the figures in Martin
//! Kleppmann's "How to do distributed locking": one lane per client with its
//! grants as bars, a storage lane with the writes it decided on, faults as
//! dashed lines, and whatever the checker flags in red.

use std::collections::{BTreeSet, HashSet};

use crate::checker::{Grant, Violations, grants, violations};
use crate::history::{EventKind, History};

const WIDTH: f64 = 960.0;
/// Room for the lane labels.
const LEFT: f64 = 90.0;
const RIGHT: f64 = 30.0;
const LANE_HEIGHT: f64 = 48.0;
const BAR_HEIGHT: f64 = 16.0;
/// The storage lane holds the mark row plus three staggered label rows.
const STORAGE_HEIGHT: f64 = 66.0;
const FAULT_LABEL_ROW: f64 = 14.0;
/// Fault labels alternate between this many rows so neighbours do not collide.
const FAULT_LABEL_ROWS: usize = 2;
const WRITE_LABEL_ROWS: usize = 3;
/// Roughly how many ticks the time axis gets.
const TICKS: u64 = 8;

const RED: &str = "#d62728";
const ORANGE: &str = "#e67e00";
const INK: &str = "#222";
const GRAY: &str = "#888";
const BAR_FILL: &str = "#cfe0f7";
const BAR_STROKE: &str = "#3b6fb6";

/// Draws `h` as a standalone SVG document (no trailing newline). The output
/// depends only on `h`, so the same history always gives the same bytes.
pub fn timeline_svg(h: &History) -> String {
    let found = violations(h);
    let scale = Scale::new(h);
    let layout = Layout::new(h);
    let mut svg = header(&title(h), layout.height);
    svg.push_str(&lanes(&layout));
    // Faults go under everything else so they never hide a grant or a write.
    svg.push_str(&faults(h, &scale, &layout));
    svg.push_str(&grant_bars(&grants(h), &found, &scale, &layout));
    svg.push_str(&failed_attempts(h, &scale, &layout));
    svg.push_str(&writes(h, &found, &scale, &layout));
    svg.push_str(&axis(&scale, layout.axis_y));
    svg.push_str(&legend(layout.axis_y + 46.0));
    svg.push_str("</svg>");
    svg
}

/// Where things go from top to bottom: the fault labels, one lane per client,
/// the storage lane, the time axis and the legend.
struct Layout {
    /// The clients with a lane, in order.
    clients: Vec<u32>,
    lanes_top: f64,
    /// The storage lane's line, where the writes' verdicts sit.
    storage_mark_y: f64,
    /// Where the fault lines end.
    storage_bottom: f64,
    axis_y: f64,
    height: f64,
}

impl Layout {
    fn new(h: &History) -> Layout {
        let clients: Vec<u32> = h
            .events
            .iter()
            .filter(|e| match e.kind {
                EventKind::Fault { .. } => false,
                // Client 0 writes are the resource's own: storage lane only.
                EventKind::Write { .. } => e.client != 0,
                _ => true,
            })
            .map(|e| e.client)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let faults = h
            .events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Fault { .. }))
            .count();
        let lanes_top = 40.0 + FAULT_LABEL_ROW * faults.min(FAULT_LABEL_ROWS) as f64 + 8.0;
        let storage_top = lanes_top + LANE_HEIGHT * clients.len() as f64;
        let storage_bottom = storage_top + STORAGE_HEIGHT;
        let axis_y = storage_bottom + 8.0;
        Layout {
            clients,
            lanes_top,
            storage_mark_y: storage_top + 14.0,
            storage_bottom,
            axis_y,
            height: axis_y + 58.0,
        }
    }

    /// The y of `client`'s lane, if it has one.
    fn lane_center(&self, client: u32) -> Option<f64> {
        let i = self.clients.iter().position(|&c| c == client)?;
        Some(self.lanes_top + LANE_HEIGHT * i as f64 + LANE_HEIGHT / 2.0)
    }
}

/// The document's opening: size, title and the arrowheads the writes use.
fn header(title: &str, height: f64) -> String {
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" font-family=\"sans-serif\" font-size=\"11\" \
         style=\"background:#fff\">\n<title>{}</title>\n",
        escape(title)
    );
    svg.push_str("<defs>\n");
    for (id, colour) in [("ok", INK), ("violation", RED), ("rejected", ORANGE)] {
        svg.push_str(&format!(
            "<marker id=\"arrow-{id}\" viewBox=\"0 0 8 8\" refX=\"7\" refY=\"4\" \
             markerWidth=\"6\" markerHeight=\"6\" orient=\"auto\">\
             <path d=\"M0,0 L8,4 L0,8 z\" fill=\"{colour}\"/></marker>\n"
        ));
    }
    svg.push_str("</defs>\n");
    svg.push_str(&format!(
        "<text x=\"10\" y=\"22\" font-size=\"14\" font-weight=\"bold\">{}</text>\n",
        escape(title)
    ));
    svg
}

fn lanes(layout: &Layout) -> String {
    let mut svg = String::from("<g class=\"lanes\">\n");
    let lane_end = WIDTH - RIGHT;
    for &client in &layout.clients {
        let y = layout.lane_center(client).unwrap_or(layout.lanes_top);
        svg.push_str(&lane(&format!("client {client}"), y, lane_end));
    }
    svg.push_str(&lane("storage", layout.storage_mark_y, lane_end));
    svg.push_str("</g>\n");
    svg
}

/// A dashed line per fault down to the storage lane, labelled at the top.
fn faults(h: &History, scale: &Scale, layout: &Layout) -> String {
    let storage_bottom = layout.storage_bottom;
    let mut svg = String::from("<g class=\"faults\">\n");
    let mut fault_ordinal = 0;
    for e in &h.events {
        let EventKind::Fault { what } = &e.kind else {
            continue;
        };
        let x = scale.x(e.at_us);
        let label_y = 40.0 + FAULT_LABEL_ROW * (fault_ordinal % FAULT_LABEL_ROWS) as f64 + 4.0;
        fault_ordinal += 1;
        // Late faults are labelled leftwards so the text stays in the picture.
        let (anchor, label_x) = if x > LEFT + 0.7 * scale.width {
            ("end", x - 3.0)
        } else {
            ("start", x + 3.0)
        };
        svg.push_str(&format!(
            "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{storage_bottom:.1}\" \
             stroke=\"#666\" stroke-dasharray=\"4 3\"><title>{} at {} ms</title></line>\n\
             <text x=\"{label_x:.1}\" y=\"{label_y:.1}\" text-anchor=\"{anchor}\" \
             fill=\"#444\">{}</text>\n",
            label_y + 2.0,
            escape(what),
            format_ms(e.at_us),
            escape(what),
        ));
    }
    svg.push_str("</g>\n");
    svg
}

/// A bar per grant on its client's lane, red where the checker flags it.
fn grant_bars(grants: &[Grant], found: &Violations, scale: &Scale, layout: &Layout) -> String {
    let overlapping: HashSet<usize> = found
        .overlapping_grants
        .iter()
        .flat_map(|&(a, b)| [a, b])
        .collect();
    let out_of_order: HashSet<usize> = found
        .non_monotonic
        .iter()
        .flat_map(|&(a, b)| [a, b])
        .collect();
    let several_locks = grants
        .iter()
        .map(|g| g.lock.as_str())
        .collect::<HashSet<_>>()
        .len()
        > 1;
    let mut svg = String::from("<g class=\"grants\">\n");
    for g in grants {
        let Some(center) = layout.lane_center(g.client) else {
            continue;
        };
        svg.push_str(&grant_bar(
            g,
            center,
            scale,
            overlapping.contains(&g.event),
            out_of_order.contains(&g.event),
            several_locks,
        ));
    }
    svg.push_str("</g>\n");
    svg
}

/// A cross per acquire that did not get the lock (failed or outcome unknown).
fn failed_attempts(h: &History, scale: &Scale, layout: &Layout) -> String {
    let mut svg = String::from("<g class=\"attempts\">\n");
    for e in &h.events {
        let (what, lock) = match &e.kind {
            EventKind::AcquireFail { lock } => ("failed", lock),
            EventKind::AcquireUnknown { lock } => ("outcome unknown", lock),
            _ => continue,
        };
        let Some(y) = layout.lane_center(e.client) else {
            continue;
        };
        let x = scale.x(e.at_us);
        svg.push_str(&format!(
            "<path class=\"failed-acquire\" d=\"M{:.1},{:.1} L{:.1},{:.1} M{:.1},{:.1} L{:.1},{:.1}\" \
             stroke=\"{GRAY}\" stroke-width=\"1.5\"><title>client {} acquire of {} {what} at {} ms\
             </title></path>\n",
            x - 4.0,
            y - 4.0,
            x + 4.0,
            y + 4.0,
            x - 4.0,
            y + 4.0,
            x + 4.0,
            y - 4.0,
            e.client,
            escape(lock),
            format_ms(e.at_us),
        ));
    }
    svg.push_str("</g>\n");
    svg
}

/// Writes: an arrow from the writer down to the storage lane, and the
/// resource's verdict on the storage lane.
fn writes(h: &History, found: &Violations, scale: &Scale, layout: &Layout) -> String {
    let storage_mark_y = layout.storage_mark_y;
    let stale: HashSet<usize> = found.stale_accepted.iter().copied().collect();
    let lost: HashSet<usize> = found.lost_updates.iter().copied().collect();
    let mut svg = String::from("<g class=\"writes\">\n");
    let mut write_ordinal = 0;
    for (index, e) in h.events.iter().enumerate() {
        let EventKind::Write {
            resource,
            token,
            accepted,
            read,
            wrote,
            ..
        } = &e.kind
        else {
            continue;
        };
        let x = scale.x(e.at_us);
        let mut label = match token {
            Some(t) => format!("token {t}"),
            None => "no token".to_owned(),
        };
        label.push_str(if *accepted { " ok" } else { " rejected" });
        let problems: Vec<&str> = [
            (stale.contains(&index), "stale"),
            (lost.contains(&index), "lost update"),
        ]
        .into_iter()
        .filter_map(|(flagged, name)| flagged.then_some(name))
        .collect();
        if !problems.is_empty() {
            label.push_str(&format!(" ({})", problems.join(", ")));
        }
        let (class, colour) = if !problems.is_empty() {
            ("violation", RED)
        } else if !accepted {
            ("rejected", ORANGE)
        } else {
            ("ok", INK)
        };
        let tooltip = format!(
            "client {} wrote {wrote} (read {read}) to {} at {} ms: {label}",
            e.client,
            escape(resource),
            format_ms(e.at_us),
            label = escape(&label),
        );
        if let Some(from) = layout.lane_center(e.client).filter(|_| e.client != 0) {
            svg.push_str(&format!(
                "<line class=\"write-arrow {class}\" x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" \
                 y2=\"{:.1}\" stroke=\"{colour}\" stroke-width=\"1.2\" \
                 marker-end=\"url(#arrow-{class})\"/>\n",
                from + BAR_HEIGHT / 2.0,
                storage_mark_y - 5.0,
            ));
        }
        let label_y = storage_mark_y + 17.0 + 12.0 * (write_ordinal % WRITE_LABEL_ROWS) as f64;
        write_ordinal += 1;
        svg.push_str(&format!(
            "<circle class=\"write {class}\" cx=\"{x:.1}\" cy=\"{storage_mark_y:.1}\" r=\"4\" \
             fill=\"{colour}\"><title>{tooltip}</title></circle>\n\
             <text x=\"{x:.1}\" y=\"{label_y:.1}\" text-anchor=\"middle\" font-size=\"10\" \
             fill=\"{colour}\">{}</text>\n",
            escape(&label),
        ));
    }
    svg.push_str("</g>\n");
    svg
}

/// Maps the harness's clock onto the picture's x axis.
struct Scale {
    /// Width of the plotting area, in pixels.
    width: f64,
    /// Where the axis ends, µs: a whole number of ticks past the last event.
    end_us: u64,
    /// Distance between ticks, µs.
    step_us: u64,
    /// The last event, µs: the end of the run.
    last_us: u64,
}

impl Scale {
    fn new(h: &History) -> Scale {
        let last = h.events.iter().map(|e| e.at_us).max().unwrap_or(0);
        // A little room after the last event, so its marks are not on the edge.
        let padded = last.saturating_add(last / 20).saturating_add(1);
        let step_us = nice_step(padded / TICKS);
        Scale {
            width: WIDTH - LEFT - RIGHT,
            end_us: padded.div_ceil(step_us).saturating_mul(step_us),
            step_us,
            last_us: last,
        }
    }

    fn x(&self, at_us: u64) -> f64 {
        LEFT + self.width * at_us.min(self.end_us) as f64 / self.end_us as f64
    }

    /// The end of the run: nothing is known after it, so grants believed held
    /// beyond it are drawn up to it.
    fn run_end(&self) -> u64 {
        self.last_us
    }
}

/// The smallest 1, 2 or 5 × 10ⁿ µs at least `raw_us`, so ticks land on
/// round numbers of milliseconds.
fn nice_step(raw_us: u64) -> u64 {
    let mut magnitude: u64 = 1;
    while magnitude.saturating_mul(10) <= raw_us && magnitude < u64::MAX / 10 {
        magnitude *= 10;
    }
    [1, 2, 5, 10]
        .into_iter()
        .map(|m| magnitude.saturating_mul(m))
        .find(|&step| step >= raw_us)
        .unwrap_or(magnitude.saturating_mul(10))
        .max(1)
}

fn title(h: &History) -> String {
    let name = if h.variant.is_empty() {
        h.scenario.clone()
    } else {
        format!("{}/{}", h.scenario, h.variant)
    };
    format!(
        "{name} — {}, fencing {}, seed {}",
        h.backend,
        if h.fencing { "on" } else { "off" },
        h.seed
    )
}

fn lane(label: &str, y: f64, end: f64) -> String {
    format!(
        "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{end}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
        LEFT - 10.0,
        y + 4.0,
        escape(label)
    )
}

fn grant_bar(
    g: &Grant,
    center: f64,
    scale: &Scale,
    overlapping: bool,
    out_of_order: bool,
    several_locks: bool,
) -> String {
    let held_to_end = g.believed_until >= scale.run_end();
    let until = g.believed_until.min(scale.run_end());
    let x0 = scale.x(g.ok_at);
    // A grant whose validity had already ended still gets a sliver, so it shows.
    let width = (scale.x(until) - x0).max(1.0);
    let top = center - BAR_HEIGHT / 2.0;
    let (stroke, stroke_width) = if overlapping || out_of_order {
        (RED, 2.0)
    } else {
        (BAR_STROKE, 1.0)
    };
    let mut label_parts = Vec::new();
    if several_locks {
        label_parts.push(g.lock.clone());
    }
    if let Some(t) = g.token {
        label_parts.push(format!("token {t}"));
    }
    let label = label_parts.join(" · ");
    let mut notes = Vec::new();
    if overlapping {
        notes.push("overlaps another holder");
    }
    if out_of_order {
        notes.push("token out of order");
    }
    let tooltip = format!(
        "client {} holds {} from {} ms to {}{}{}",
        g.client,
        escape(&g.lock),
        format_ms(g.ok_at),
        if held_to_end {
            "the end of the run".to_owned()
        } else {
            format!("{} ms", format_ms(until))
        },
        g.token.map(|t| format!(", token {t}")).unwrap_or_default(),
        if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join(", "))
        },
    );
    let mut out = format!(
        "<rect class=\"grant{}\" x=\"{x0:.1}\" y=\"{top:.1}\" width=\"{width:.1}\" \
         height=\"{BAR_HEIGHT}\" fill=\"{BAR_FILL}\" stroke=\"{stroke}\" \
         stroke-width=\"{stroke_width}\"><title>{tooltip}</title></rect>\n",
        if overlapping || out_of_order {
            " violation"
        } else {
            ""
        },
    );
    if !label.is_empty() {
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{}\">{}</text>\n",
            x0 + 2.0,
            top - 3.0,
            if out_of_order { RED } else { INK },
            escape(&label)
        ));
    }
    out
}

fn axis(scale: &Scale, y: f64) -> String {
    let mut out = format!(
        "<g class=\"axis\">\n<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" \
         stroke=\"{INK}\"/>\n",
        LEFT + scale.width
    );
    let mut t = 0;
    while t <= scale.end_us {
        let x = scale.x(t);
        out.push_str(&format!(
            "<line x1=\"{x:.1}\" y1=\"{y:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"{INK}\"/>\n\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
            y + 4.0,
            y + 16.0,
            format_ms(t)
        ));
        t = t.saturating_add(scale.step_us);
        if t == u64::MAX {
            break;
        }
    }
    out.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#444\">time (ms)</text>\n</g>\n",
        LEFT + scale.width,
        y + 30.0
    ));
    out
}

fn legend(y: f64) -> String {
    format!(
        "<text class=\"legend\" x=\"{LEFT}\" y=\"{y:.1}\" font-size=\"10\">\
         <tspan fill=\"{BAR_STROKE}\">bar: lock believed held</tspan>\
         <tspan dx=\"14\" fill=\"{RED}\">red: overlapping holders, stale or lost write, \
         token out of order</tspan>\
         <tspan dx=\"14\" fill=\"{ORANGE}\">orange: write refused by the resource</tspan>\
         <tspan dx=\"14\" fill=\"{GRAY}\">×: acquire failed</tspan></text>\n"
    )
}

/// Microseconds as milliseconds, with only the decimals needed.
fn format_ms(us: u64) -> String {
    let whole = us / 1000;
    let fraction = us % 1000;
    if fraction == 0 {
        whole.to_string()
    } else {
        format!("{whole}.{fraction:03}")
            .trim_end_matches('0')
            .to_owned()
    }
}

/// Escapes text for XML content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::fixtures::*;

    fn named(mut h: History) -> History {
        h.scenario = "gc-pause".into();
        h.variant = "long".into();
        h.backend = "redis".into();
        h.fencing = true;
        h.seed = 42;
        h
    }

    fn count(svg: &str, needle: &str) -> usize {
        svg.matches(needle).count()
    }

    fn assert_well_formed(svg: &str) {
        assert!(svg.starts_with("<svg "), "{svg}");
        assert!(svg.ends_with("</svg>"), "{svg}");
        assert_eq!(count(svg, "<svg"), count(svg, "</svg>"));
        assert_eq!(count(svg, "<g ") + count(svg, "<g>"), count(svg, "</g>"));
        assert_eq!(count(svg, "<text"), count(svg, "</text>"));
        assert_eq!(count(svg, "<tspan"), count(svg, "</tspan>"));
        assert_eq!(count(svg, "<rect"), count(svg, "</rect>"));
        assert_eq!(count(svg, "<circle"), count(svg, "</circle>"));
    }

    /// The essay's story with a fault line, a failed attempt, an accepted write,
    /// a refused stale write and, on an unfenced resource, an accepted one.
    fn story() -> History {
        named(history(vec![
            invoke(0, 1),
            ok(1_000, 1, Some(33)),
            fault(2_000, "pause client 1 <GC>"),
            invoke(3_000, 2),
            fail(3_500, 3),
            ok(10_000, 2, Some(34)),
            write(11_000, 2, Some(34), true, 0),
            write(20_000, 1, Some(33), false, 0),
            lost(20_100, 1),
            write(21_000, 1, None, true, 0),
            release(25_000, 2),
        ]))
    }

    #[test]
    fn the_story_has_lanes_bars_faults_and_coloured_writes() {
        let svg = timeline_svg(&story());
        assert_well_formed(&svg);
        assert!(svg.contains("gc-pause/long — redis, fencing on, seed 42"));
        for lane in ["client 1", "client 2", "client 3", "storage"] {
            assert!(svg.contains(&format!(">{lane}</text>")), "{lane}");
        }
        assert_eq!(count(&svg, "<rect"), 2, "one bar per grant");
        assert_eq!(
            count(&svg, "<rect class=\"grant violation\""),
            2,
            "they overlap"
        );
        assert!(svg.contains(">token 33</text>") && svg.contains(">token 34</text>"));
        assert!(
            svg.contains("pause client 1 &lt;GC&gt;"),
            "fault text escaped"
        );
        assert!(svg.contains("stroke-dasharray"));
        assert_eq!(count(&svg, "class=\"failed-acquire\""), 1);
        assert!(svg.contains(">token 34 ok</text>"));
        assert!(svg.contains(&format!("fill=\"{ORANGE}\">token 33 rejected</text>")));
        // The unfenced write by the superseded holder went through: red.
        assert!(svg.contains(&format!(
            "fill=\"{RED}\">no token ok (stale, lost update)</text>"
        )));
        assert_eq!(count(&svg, "<circle class=\"write violation\""), 1);
        assert_eq!(count(&svg, "<line class=\"write-arrow"), 3);
        assert!(svg.contains(">time (ms)</text>"));
    }

    #[test]
    fn a_clean_history_has_nothing_red_but_the_legend() {
        let svg = timeline_svg(&named(clean_fenced()));
        assert_well_formed(&svg);
        assert_eq!(count(&svg, "<rect"), 2);
        assert_eq!(
            count(&svg, RED),
            2,
            "the violation arrowhead and the legend"
        );
        assert!(!svg.contains("rejected</text>"));
    }

    #[test]
    fn a_stale_write_accepted_by_a_fenced_store_is_red() {
        let svg = timeline_svg(&named(fenced_store_accepting_33_after_34()));
        assert_well_formed(&svg);
        assert!(svg.contains(&format!(
            "<circle class=\"write violation\" cx=\"{:.1}\"",
            Scale::new(&fenced_store_accepting_33_after_34()).x(40)
        )));
        assert!(svg.contains("token 33 ok (stale, lost update)"));
    }

    #[test]
    fn the_picture_is_deterministic_and_survives_an_empty_history() {
        assert_eq!(timeline_svg(&story()), timeline_svg(&story()));
        let svg = timeline_svg(&History::default());
        assert_well_formed(&svg);
        assert_eq!(count(&svg, "<rect"), 0);
        assert!(svg.contains(">storage</text>"));
    }

    #[test]
    fn the_axis_ends_on_a_round_tick_past_the_last_event() {
        let scale = Scale::new(&story());
        assert_eq!(scale.step_us, 5_000);
        assert_eq!(scale.end_us, 30_000);
        assert_eq!(nice_step(0), 1);
        assert_eq!(nice_step(3), 5);
        assert_eq!(nice_step(1_100), 2_000);
        assert_eq!(nice_step(u64::MAX), u64::MAX, "saturates, no overflow");
        let huge = history(vec![ok(0, 1, None), ok(u64::MAX, 2, None)]);
        assert_well_formed(&timeline_svg(&huge));
    }

    #[test]
    fn milliseconds_and_escaping() {
        assert_eq!(format_ms(0), "0");
        assert_eq!(format_ms(2_000), "2");
        assert_eq!(format_ms(2_500), "2.5");
        assert_eq!(format_ms(2_001), "2.001");
        assert_eq!(escape(r#"a<b>&"c'"#), "a&lt;b&gt;&amp;&quot;c&apos;");
    }
}
