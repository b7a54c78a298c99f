//! The progress bars of a run (one per variant, with indicatif), drawn only once a run has
//! lasted a second, so that short runs and tests print nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Progress display that stays hidden for the first second of a run.
pub(super) struct Progress {
    multi: MultiProgress,
    start: Instant,
    shown: Arc<AtomicBool>,
    enabled: bool,
}

impl Progress {
    pub(super) fn new(enabled: bool) -> Self {
        Progress {
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::hidden()),
            start: Instant::now(),
            shown: Arc::new(AtomicBool::new(false)),
            enabled,
        }
    }

    pub(super) fn bar(&self, name: &str, len: Option<u64>) -> ProgressBar {
        let bar = self.multi.add(match len {
            Some(n) => ProgressBar::new(n),
            None => ProgressBar::no_length(),
        });
        let style = ProgressStyle::with_template(
            "{prefix:>12} [{bar:40}] {pos}/{len} requests ({per_sec}, {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(name.to_string());
        bar
    }

    pub(super) fn tick(&self) {
        if self.enabled
            && !self.shown.load(Ordering::Relaxed)
            && self.start.elapsed() > Duration::from_secs(1)
            && !self.shown.swap(true, Ordering::Relaxed)
        {
            self.multi.set_draw_target(ProgressDrawTarget::stderr());
        }
    }
}
