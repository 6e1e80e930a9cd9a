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
    /// being dropped, for work that loops. A `tick` that panics stops the thread, and
    /// `on_panic` gets the panic's message: a background thread's death must reach its
    /// owner, not vanish into a join nobody reads. `None` if the thread could not be
    /// spawned.
    pub(crate) fn start(
        name: &str,
        interval: Duration,
        on_panic: impl FnOnce(String) + Send + 'static,
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
                    let ticked =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tick(&stopping)));
                    match ticked {
                        Ok(true) => {}
                        Ok(false) => return,
                        Err(panic) => {
                            on_panic(panic_message(&*panic));
                            return;
                        }
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

/// The message of a caught panic's payload.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
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
