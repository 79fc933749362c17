//! Palisade's fault drills: histories of what clients and the resource saw, and the
//! checker that counts what went wrong in them.
//!
//! A drill records every client action as an [`Event`] stamped by the harness's
//! monotonic clock; [`check`] then counts, per history:
//! - **overlaps**: two clients' believed-held intervals on one lock intersect (each
//!   interval runs from the acquire's answer to the first of: release invoked, lease
//!   reported lost, validity ended);
//! - **stale writes accepted / rejected**: a write the resource accepted although
//!   a later holder had been granted the lock before it (fenced: a token below one
//!   already accepted; unfenced: by a superseded holder), and writes it refused;
//! - **lost updates** of a read-modify-write counter: an accepted write whose read
//!   did not see the previous accepted write;
//! - **non-monotonic tokens**: a grant that completed before another began, yet
//!   carries a token that is not lower;
//! - **linearizable**: whether the grants fit a fenced mutex — acquire legal only
//!   when the lock is free, with a token above every earlier one (see
//!   [`check`] for the exact rules; `None` when the history has no tokens).
//!
//! The harness that runs the drills (real servers, fault proxies, paused client
//! processes) builds on `palisade-testkit` and `palisade-faultproxy`.

//!
//! [`violations`] names the events behind each count, [`Summary`] adds up the
//! trials of one configuration into a results row (JSON line, text or Markdown
//! table), and [`timeline_svg`] draws one history as a picture.

mod checker;
mod history;
mod summary;
mod timeline;

pub use checker::{Report, Violations, check, violations};
pub use history::{Event, EventKind, History, Holding};
pub use summary::Summary;
pub use timeline::timeline_svg;
