//! The configuration directory, loaded at start and looked at again every interval: a change
//! is loaded and put in force for the next request; a malformed change leaves the configuration
//! in force, and says so in the log, `ratelimit_service_config_load_error` and `/healthcheck`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::config::{Config, ConfigError, read_dir};
use crate::metrics::Metrics;
use crate::service::State;

/// What the files looked like: each one's path, length and modification time, and where the
/// root resolves to (a link swapped to a new directory changes it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    root: Option<PathBuf>,
    files: Vec<(PathBuf, u64, Option<SystemTime>)>,
}

pub fn signature(root: &Path, dir: &Path, watch_root: bool) -> Signature {
    let mut files = Vec::new();
    collect(dir, &mut files);
    files.sort();
    Signature {
        root: if watch_root {
            std::fs::canonicalize(root).ok()
        } else {
            None
        },
        files,
    }
}

fn collect(dir: &Path, out: &mut Vec<(PathBuf, u64, Option<SystemTime>)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            collect(&path, out);
        } else {
            out.push((path, meta.len(), meta.modified().ok()));
        }
    }
}

/// Loads the directory.
pub fn load(dir: &Path, ignore_dot_files: bool) -> Result<Config, ConfigError> {
    let files = read_dir(dir, ignore_dot_files)
        .map_err(|e| ConfigError(format!("{}: {e}", dir.display())))?;
    Config::load(&files)
}

pub struct Watcher {
    pub root: PathBuf,
    pub dir: PathBuf,
    pub ignore_dot_files: bool,
    pub watch_root: bool,
    pub interval: Duration,
}

impl Watcher {
    /// Looks at the files every interval, for ever, and loads them when they changed.
    pub async fn run(self, state: Arc<State>, metrics: Arc<Metrics>, mut seen: Signature) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = signature(&self.root, &self.dir, self.watch_root);
            if now == seen {
                continue;
            }
            seen = now;
            match load(&self.dir, self.ignore_dot_files) {
                Ok(config) => {
                    for w in &config.warnings {
                        eprintln!("warning: {w}");
                    }
                    eprintln!(
                        "configuration reloaded: {} domain(s) from {}",
                        config.domains(),
                        self.dir.display()
                    );
                    state.replace(config);
                    metrics.config_loaded(true);
                }
                Err(e) => {
                    eprintln!("error loading new configuration, keeping the one in force: {e}");
                    state.refuse(e.0);
                    metrics.config_loaded(false);
                }
            }
        }
    }
}
