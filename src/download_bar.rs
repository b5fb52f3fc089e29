//! The progress bar a download of PostgreSQL server binaries draws on stderr, for
//! `pglease serve`, `pglease snapshot save` and `pglease postgres fetch`: the binaries
//! crate reports a download's progress ([`pglease_binaries::Progress`]) and draws nothing;
//! drawing is the binary's, like everything else that writes to the terminal.
//!
//! A bar only when stderr is a terminal: under systemd, in CI or piped into a file, the log
//! lines at the download's start and end say it all.

use std::io::IsTerminal;
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pglease_binaries::{Progress, Transfer};
use pglease_pool::{PoolConfig, ServerConfig};

/// Draws a bar on stderr for each download, when stderr is a terminal.
#[derive(Debug, Clone, Copy, Default)]
pub struct DownloadBar;

impl DownloadBar {
    /// The bar, as what a request reports to.
    pub fn shared() -> Arc<dyn Progress> {
        Arc::new(DownloadBar)
    }

    /// Shows the downloads of the server `config` starts (the embedded one's) on a bar.
    pub fn show_for(config: &mut PoolConfig) {
        if let ServerConfig::Embedded(embedded) = &mut config.server {
            embedded.download_progress = DownloadBar::shared();
        }
    }
}

impl Progress for DownloadBar {
    fn started(&self, total: Option<u64>) -> Box<dyn Transfer> {
        Box::new(Bar(progress_bar(total)))
    }
}

/// One download's bar.
struct Bar(ProgressBar);

impl Transfer for Bar {
    fn advanced(&mut self, bytes: u64) {
        self.0.inc(bytes);
    }

    fn finished(&mut self) {
        self.0.finish_and_clear();
    }
}

/// A progress bar on stderr (a spinner when the size is unknown), or a hidden one unless
/// stderr is a terminal.
fn progress_bar(total: Option<u64>) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = match total {
        Some(total) => ProgressBar::new(total),
        None => ProgressBar::new_spinner(),
    };
    // A template error would be ours; the default style is a fine fallback.
    if let Ok(style) = ProgressStyle::with_template(
        "downloading PostgreSQL {bar:30} {bytes}/{total_bytes} {bytes_per_sec} {eta}",
    ) {
        bar.set_style(style);
    }
    bar.set_draw_target(ProgressDrawTarget::stderr());
    bar
}
