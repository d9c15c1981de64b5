//! The progress bar of commands that can take seconds (on stderr, drawn only on a terminal).

/// A byte-counting progress bar that shows itself only once its task has taken a second: a
/// quick task draws nothing.
pub struct Progress {
    bar: indicatif::ProgressBar,
    started: std::time::Instant,
}

impl Progress {
    /// A bar labelled `msg`, not drawn yet.
    pub fn new(msg: &'static str) -> Progress {
        let bar = indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({eta})")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.set_message(msg);
        Progress { bar, started: std::time::Instant::now() }
    }

    /// `done` of `total` bytes are through.
    pub fn update(&self, done: u64, total: u64) {
        if self.started.elapsed().as_millis() >= 1000 {
            self.bar.set_length(total);
            self.bar.set_position(done);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}
