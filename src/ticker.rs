//! [`Ticker`]: a background thread that does a piece of work at an interval until it is
//! dropped (the database's checkpointer, a hash store's compactor).
//!
//! Uses: nothing of the crate.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// A background thread running a tick at an interval; dropping it stops the thread
/// (waking it at once) and waits for it.
pub(crate) struct Ticker {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Ticker {
    /// Starts thread `name`, which calls `tick` every `interval` until the ticker is
    /// dropped or `tick` answers `false`. `tick` gets a check of whether the ticker is
    /// being dropped, for work that loops. `None` if the thread could not be spawned.
    pub(crate) fn start(
        name: &str,
        interval: Duration,
        mut tick: impl FnMut(&dyn Fn() -> bool) -> bool + Send + 'static,
    ) -> Option<Ticker> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let signal = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let (stopped, wake) = &*signal;
                let stopping = || *stopped.lock();
                loop {
                    {
                        let mut stopped = stopped.lock();
                        if !*stopped {
                            wake.wait_for(&mut stopped, interval);
                        }
                        if *stopped {
                            return;
                        }
                    }
                    if !tick(&stopping) {
                        return;
                    }
                }
            })
            .ok()?;
        Some(Ticker {
            stop,
            handle: Some(handle),
        })
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
