//! One row of results per (scenario, variant, backend, fencing): what many trials
//! of the same drill add up to, as JSON lines and as tables.

use std::collections::HashMap;

use serde::Serialize;
use serde_json::json;

use crate::checker::check;
use crate::history::{EventKind, History};

/// What the trials of one drill configuration add up to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// The scenario's name.
    pub scenario: String,
    /// The scenario's variant, empty when it has none.
    pub variant: String,
    /// The backend under test.
    pub backend: String,
    /// Whether the resource checked tokens.
    pub fencing: bool,
    /// How many histories were summed.
    pub trials: usize,
    /// Overlapping grant pairs, summed over trials.
    pub overlaps: usize,
    /// Stale writes the resource accepted, summed over trials.
    pub stale_writes_accepted: usize,
    /// Writes the resource refused, summed over trials.
    pub stale_writes_rejected: usize,
    /// Lost counter updates, summed over trials.
    pub lost_updates: usize,
    /// Non-monotonic token pairs, summed over trials.
    pub non_monotonic_tokens: usize,
    /// `None` when no trial had tokens; otherwise whether no trial with tokens
    /// was found non-linearizable.
    pub linearizable: Option<bool>,
    /// `AcquireInvoke` events over all trials.
    pub acquire_attempts: usize,
    /// `AcquireOk` events over all trials.
    pub acquire_ok: usize,
    /// Median time from an acquire's invocation to its grant, over all trials
    /// (nearest rank); `None` without any grant that had an invocation.
    pub acquire_p50_us: Option<u64>,
    /// 99th percentile of the same (nearest rank).
    pub acquire_p99_us: Option<u64>,
    /// Trials with at least one overlap.
    pub trials_with_overlap: usize,
    /// Trials in which some write was made after another client was granted the
    /// lock, whether the resource accepted it or refused it.
    pub trials_with_stale_write: usize,
}

impl Summary {
    /// Sums `histories`, which are trials of one configuration (the first one's
    /// scenario, variant, backend and fencing name the row). Empty input gives
    /// an all-zero row with empty names.
    pub fn from_histories(histories: &[History]) -> Summary {
        let mut summary = match histories.first() {
            Some(h) => Summary {
                scenario: h.scenario.clone(),
                variant: h.variant.clone(),
                backend: h.backend.clone(),
                fencing: h.fencing,
                ..Summary::default()
            },
            None => Summary::default(),
        };
        let mut latencies = Vec::new();
        for h in histories {
            let report = check(h);
            summary.trials += 1;
            summary.overlaps += report.overlaps;
            summary.stale_writes_accepted += report.stale_writes_accepted;
            summary.stale_writes_rejected += report.stale_writes_rejected;
            summary.lost_updates += report.lost_updates;
            summary.non_monotonic_tokens += report.non_monotonic_tokens;
            if report.overlaps > 0 {
                summary.trials_with_overlap += 1;
            }
            if report.stale_writes_accepted + report.stale_writes_rejected > 0 {
                summary.trials_with_stale_write += 1;
            }
            // A trial without tokens (say, every acquire failed) says nothing
            // about the token model, so it neither confirms nor refutes it.
            if let Some(linearizable) = report.linearizable {
                summary.linearizable = Some(summary.linearizable.unwrap_or(true) && linearizable);
            }
            summary.acquire_attempts += count(h, |k| matches!(k, EventKind::AcquireInvoke { .. }));
            summary.acquire_ok += count(h, |k| matches!(k, EventKind::AcquireOk { .. }));
            latencies.extend(acquire_latencies_us(h));
        }
        latencies.sort_unstable();
        summary.acquire_p50_us = nearest_rank(&latencies, 50);
        summary.acquire_p99_us = nearest_rank(&latencies, 99);
        summary
    }

    /// Granted acquires over attempted ones; `None` without attempts.
    pub fn acquire_success_rate(&self) -> Option<f64> {
        (self.acquire_attempts > 0).then(|| self.acquire_ok as f64 / self.acquire_attempts as f64)
    }

    /// The row as one line of JSON, with `fencing` as `"on"`/`"off"` and absent
    /// values as `null`.
    pub fn json_line(&self) -> String {
        json!({
            "scenario": self.scenario,
            "variant": self.variant,
            "backend": self.backend,
            "fencing": on_off(self.fencing),
            "trials": self.trials,
            "overlaps": self.overlaps,
            "stale_writes_accepted": self.stale_writes_accepted,
            "stale_writes_rejected": self.stale_writes_rejected,
            "lost_updates": self.lost_updates,
            "non_monotonic_tokens": self.non_monotonic_tokens,
            "linearizable": self.linearizable,
            "acquire_attempts": self.acquire_attempts,
            "acquire_ok": self.acquire_ok,
            "acquire_success_rate": self.acquire_success_rate(),
            "acquire_p50_us": self.acquire_p50_us,
            "acquire_p99_us": self.acquire_p99_us,
            "trials_with_overlap": self.trials_with_overlap,
            "trials_with_stale_write": self.trials_with_stale_write,
        })
        .to_string()
    }

    /// A row back from [`Summary::json_line`]; `None` for a line that is not one.
    pub fn from_json_line(line: &str) -> Option<Summary> {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        let count = |key: &str| v[key].as_u64().map(|n| n as usize);
        Some(Summary {
            scenario: v["scenario"].as_str()?.to_owned(),
            variant: v["variant"].as_str().unwrap_or("").to_owned(),
            backend: v["backend"].as_str()?.to_owned(),
            fencing: v["fencing"].as_str()? == "on",
            trials: count("trials")?,
            overlaps: count("overlaps")?,
            stale_writes_accepted: count("stale_writes_accepted")?,
            stale_writes_rejected: count("stale_writes_rejected")?,
            lost_updates: count("lost_updates")?,
            non_monotonic_tokens: count("non_monotonic_tokens")?,
            linearizable: v["linearizable"].as_bool(),
            acquire_attempts: count("acquire_attempts")?,
            acquire_ok: count("acquire_ok")?,
            acquire_p50_us: v["acquire_p50_us"].as_u64(),
            acquire_p99_us: v["acquire_p99_us"].as_u64(),
            trials_with_overlap: count("trials_with_overlap")?,
            trials_with_stale_write: count("trials_with_stale_write")?,
        })
    }

    /// The table cells of this row, in [`HEADERS`] order.
    fn cells(&self) -> [String; COLUMNS] {
        let name = if self.variant.is_empty() {
            self.scenario.clone()
        } else {
            format!("{}/{}", self.scenario, self.variant)
        };
        let linearizable = match self.linearizable {
            Some(true) => "yes",
            Some(false) => "no",
            None => "-",
        };
        [
            name,
            self.backend.clone(),
            on_off(self.fencing).to_owned(),
            self.trials.to_string(),
            self.overlaps.to_string(),
            self.stale_writes_accepted.to_string(),
            self.stale_writes_rejected.to_string(),
            self.lost_updates.to_string(),
            self.non_monotonic_tokens.to_string(),
            linearizable.to_owned(),
            self.acquire_success_rate()
                .map_or_else(|| "-".to_owned(), |rate| format!("{:.1}", rate * 100.0)),
            ms(self.acquire_p50_us),
            ms(self.acquire_p99_us),
        ]
    }

    /// Rows as a plain-text table with aligned columns, for a terminal.
    pub fn text_table(rows: &[Summary]) -> String {
        let cells: Vec<[String; COLUMNS]> = rows.iter().map(Summary::cells).collect();
        let mut widths = HEADERS.map(|h| h.chars().count());
        for row in &cells {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let line = |row: &[String]| {
            let padded: Vec<String> = row
                .iter()
                .zip(widths)
                .zip(NUMERIC)
                .map(|((cell, width), numeric)| {
                    if numeric {
                        format!("{cell:>width$}")
                    } else {
                        format!("{cell:<width$}")
                    }
                })
                .collect();
            format!("{}\n", padded.join("  ").trim_end())
        };
        let mut out = line(&HEADERS.map(str::to_owned));
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        out.push_str(&format!("{}\n", rule.join("  ")));
        for row in &cells {
            out.push_str(&line(row));
        }
        out
    }

    /// Rows as a GitHub Markdown table, numbers right-aligned.
    pub fn markdown_table(rows: &[Summary]) -> String {
        let line = |row: &[String]| {
            let escaped: Vec<String> = row.iter().map(|c| c.replace('|', "\\|")).collect();
            format!("| {} |\n", escaped.join(" | "))
        };
        let mut out = line(&HEADERS.map(str::to_owned));
        let alignments: Vec<&str> = NUMERIC
            .iter()
            .map(|&numeric| if numeric { "---:" } else { "---" })
            .collect();
        out.push_str(&format!("| {} |\n", alignments.join(" | ")));
        for row in rows {
            out.push_str(&line(&row.cells()));
        }
        out
    }
}

const COLUMNS: usize = 13;

const HEADERS: [&str; COLUMNS] = [
    "scenario",
    "backend",
    "fencing",
    "trials",
    "overlaps",
    "stale acc",
    "stale rej",
    "lost upd",
    "non-mono",
    "lin.",
    "acq ok %",
    "p50 ms",
    "p99 ms",
];

/// Which columns hold numbers, to right-align them.
const NUMERIC: [bool; COLUMNS] = [
    false, false, false, true, true, true, true, true, true, false, true, true, true,
];

fn on_off(fencing: bool) -> &'static str {
    if fencing { "on" } else { "off" }
}

/// Microseconds as milliseconds to two places, rounded half up. Integer
/// arithmetic so sub-millisecond latencies neither vanish as `0.0` nor pick up
/// binary rounding.
fn ms(us: Option<u64>) -> String {
    us.map_or_else(
        || "-".to_owned(),
        |us| {
            let hundredths = us.saturating_add(5) / 10;
            format!("{}.{:02}", hundredths / 100, hundredths % 100)
        },
    )
}

fn count(h: &History, pred: impl Fn(&EventKind) -> bool) -> usize {
    h.events.iter().filter(|e| pred(&e.kind)).count()
}

/// Time from each `AcquireInvoke` to the same client's next `AcquireOk` on the
/// same lock. An attempt that failed or ended unknown has no latency, so it is
/// forgotten rather than paired with a later grant.
fn acquire_latencies_us(h: &History) -> Vec<u64> {
    let mut pending: HashMap<(u32, &str), u64> = HashMap::new();
    let mut out = Vec::new();
    for e in &h.events {
        match &e.kind {
            EventKind::AcquireInvoke { lock } => {
                pending.insert((e.client, lock), e.at_us);
            }
            EventKind::AcquireOk { lock, .. } => {
                if let Some(invoked) = pending.remove(&(e.client, lock.as_str())) {
                    out.push(e.at_us.saturating_sub(invoked));
                }
            }
            EventKind::AcquireFail { lock } | EventKind::AcquireUnknown { lock } => {
                pending.remove(&(e.client, lock.as_str()));
            }
            _ => {}
        }
    }
    out
}

/// The nearest-rank `percent`th percentile of `sorted`.
fn nearest_rank(sorted: &[u64], percent: usize) -> Option<u64> {
    let rank = (percent * sorted.len()).div_ceil(100).max(1);
    sorted.get(rank - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::fixtures::*;

    fn trial(mut h: History, seed: u64) -> History {
        h.scenario = "pause".into();
        h.variant = "gc".into();
        h.backend = "redis".into();
        h.fencing = true;
        h.seed = seed;
        h
    }

    #[test]
    fn from_histories_sums_trials() {
        let s = Summary::from_histories(&[
            trial(clean_fenced(), 1),
            trial(essays_pause_fenced(), 2),
            trial(fenced_store_accepting_33_after_34(), 3),
        ]);
        assert_eq!(
            (s.scenario.as_str(), s.variant.as_str(), s.backend.as_str()),
            ("pause", "gc", "redis")
        );
        assert!(s.fencing);
        assert_eq!(s.trials, 3);
        assert_eq!(s.overlaps, 2);
        assert_eq!(s.stale_writes_accepted, 1);
        assert_eq!(s.stale_writes_rejected, 1);
        assert_eq!(s.lost_updates, 1);
        assert_eq!(s.non_monotonic_tokens, 0);
        assert_eq!(s.linearizable, Some(true));
        assert_eq!(s.trials_with_overlap, 2);
        assert_eq!(s.trials_with_stale_write, 2);
        // Invokes: 2 + 2 + 0; grants: 2 + 2 + 2 (the last trial never invokes).
        assert_eq!(s.acquire_attempts, 4);
        assert_eq!(s.acquire_ok, 6);
        // Latencies 10, 9 (clean), 10, 980 (pause): nearest rank.
        assert_eq!(s.acquire_p50_us, Some(10));
        assert_eq!(s.acquire_p99_us, Some(980));
    }

    #[test]
    fn linearizable_is_none_without_tokens_and_false_if_any_trial_breaks_it() {
        let no_tokens = Summary::from_histories(&[trial(unfenced_superseded_writer(), 1)]);
        assert_eq!(no_tokens.linearizable, None);
        let mixed = Summary::from_histories(&[
            trial(unfenced_superseded_writer(), 1),
            trial(clean_fenced(), 2),
            trial(token_issued_twice(), 3),
        ]);
        assert_eq!(mixed.linearizable, Some(false));
        let fine = Summary::from_histories(&[
            trial(unfenced_superseded_writer(), 1),
            trial(clean_fenced(), 2),
        ]);
        assert_eq!(fine.linearizable, Some(true));
    }

    #[test]
    fn failed_attempts_count_but_have_no_latency() {
        let s = Summary::from_histories(&[history(vec![
            invoke(0, 1),
            fail(5, 1),
            invoke(10, 1),
            ok(30, 1, None),
        ])]);
        assert_eq!((s.acquire_attempts, s.acquire_ok), (2, 1));
        assert_eq!(s.acquire_success_rate(), Some(0.5));
        assert_eq!((s.acquire_p50_us, s.acquire_p99_us), (Some(20), Some(20)));
    }

    #[test]
    fn empty_input_is_an_empty_row() {
        let s = Summary::from_histories(&[]);
        assert_eq!(s, Summary::default());
        let v: serde_json::Value = serde_json::from_str(&s.json_line()).unwrap();
        assert_eq!(v["acquire_success_rate"], serde_json::Value::Null);
        assert_eq!(v["linearizable"], serde_json::Value::Null);
        assert_eq!(v["acquire_p50_us"], serde_json::Value::Null);
        assert_eq!(v["fencing"], "off");
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(nearest_rank(&v, 50), Some(50));
        assert_eq!(nearest_rank(&v, 99), Some(99));
        assert_eq!(nearest_rank(&[7], 99), Some(7));
        assert_eq!(nearest_rank(&[1, 2, 3, 4], 50), Some(2));
        assert_eq!(nearest_rank(&[], 50), None);
    }

    #[test]
    fn milliseconds_keep_two_places() {
        assert_eq!(ms(None), "-");
        assert_eq!(ms(Some(0)), "0.00");
        assert_eq!(ms(Some(4)), "0.00");
        assert_eq!(ms(Some(5)), "0.01");
        assert_eq!(ms(Some(12_345)), "12.35");
        assert_eq!(ms(Some(2_000_000)), "2000.00");
    }

    #[test]
    fn a_json_line_reads_back_as_the_same_row() {
        let s = Summary::from_histories(&[trial(essays_pause_fenced(), 2)]);
        assert_eq!(Summary::from_json_line(&s.json_line()), Some(s));
        assert_eq!(Summary::from_json_line("{\"scenario\": 1}"), None);
        assert_eq!(Summary::from_json_line("not json"), None);
    }

    #[test]
    fn json_line_has_every_key_on_one_line() {
        let s = Summary::from_histories(&[trial(essays_pause_fenced(), 2)]);
        let line = s.json_line();
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        for key in [
            "scenario",
            "variant",
            "backend",
            "fencing",
            "trials",
            "overlaps",
            "stale_writes_accepted",
            "stale_writes_rejected",
            "lost_updates",
            "non_monotonic_tokens",
            "linearizable",
            "acquire_success_rate",
            "acquire_p50_us",
            "acquire_p99_us",
            "trials_with_overlap",
            "trials_with_stale_write",
        ] {
            assert!(v.get(key).is_some(), "missing {key} in {line}");
        }
        assert_eq!(v["fencing"], "on");
        assert_eq!(v["linearizable"], true);
        assert_eq!(v["acquire_success_rate"], 1.0);
        assert_eq!(v["acquire_p50_us"], 10);
        assert_eq!(v["trials_with_overlap"], 1);
    }

    fn two_rows() -> Vec<Summary> {
        let fenced = Summary::from_histories(&[trial(essays_pause_fenced(), 1)]);
        let mut unfenced = Summary::from_histories(&[history(vec![
            invoke(0, 1),
            ok(12_345, 1, None),
            invoke(12_400, 2),
            fail(13_000, 2),
        ])]);
        unfenced.scenario = "pause".into();
        unfenced.backend = "redlock".into();
        vec![fenced, unfenced]
    }

    #[test]
    fn text_table_aligns_columns() {
        let table = Summary::text_table(&two_rows());
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "{table}");
        assert!(lines[0].starts_with("scenario"));
        assert!(lines[1].starts_with("--------"));
        assert!(lines[2].starts_with("pause/gc  redis"), "{table}");
        assert!(lines[3].starts_with("pause     redlock"), "{table}");
        // Right-aligned numeric columns end where their header ends.
        let p99_end = lines[0].len();
        assert!(
            lines[2].ends_with("0.98") && lines[2].len() == p99_end,
            "{table}"
        );
        assert!(
            lines[3].ends_with("12.35") && lines[3].len() == p99_end,
            "{table}"
        );
        assert!(lines[2].contains(" on ") && lines[2].contains(" yes "));
        assert!(lines[3].contains(" off ") && lines[3].contains(" - "));
        assert!(lines[3].contains(" 50.0 "), "{table}");
    }

    #[test]
    fn markdown_table_has_header_alignment_and_rows() {
        let table = Summary::markdown_table(&two_rows());
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "{table}");
        assert_eq!(
            lines[0],
            "| scenario | backend | fencing | trials | overlaps | stale acc | stale rej \
             | lost upd | non-mono | lin. | acq ok % | p50 ms | p99 ms |"
        );
        assert_eq!(
            lines[1],
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"
        );
        assert_eq!(
            lines[2],
            "| pause/gc | redis | on | 1 | 1 | 0 | 1 | 0 | 0 | yes | 100.0 | 0.01 | 0.98 |"
        );
        assert_eq!(
            lines[3],
            "| pause | redlock | off | 1 | 0 | 0 | 0 | 0 | 0 | - | 50.0 | 12.35 | 12.35 |"
        );
        assert!(table.ends_with('\n'));
    }

    #[test]
    fn markdown_cells_escape_pipes() {
        let row = Summary {
            scenario: "a|b".into(),
            ..Summary::default()
        };
        assert!(Summary::markdown_table(&[row]).contains("| a\\|b |"));
    }
}
