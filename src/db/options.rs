//! [`DbOptions`]: how to open a [`Db`](super::Db), and the options' validation.

use std::time::Duration;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::journal::Durability;

// Named by the docs' links only.
#[cfg(doc)]
use {
    super::{Db, DbStats, RecoveryStats},
    crate::config::MIN_MEMORY_BUDGET_BYTES,
    crate::hash::store::HashStoreOptions,
    crate::tree::Tree,
};

/// How to open a [`Db`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DbOptions {
    /// The configuration of every keyspace: key and value limits, backend, and the
    /// memory budget, `config.memory_budget_bytes`, which is the whole database's. Each
    /// hash store takes its [`HashStoreOptions::memory_bytes`] out of it; every tree
    /// keyspace keeps its mini-pages in one pool of what is left (at least
    /// [`MIN_MEMORY_BUDGET_BYTES`]), so memory goes to the keyspaces in use and the
    /// budget does not grow with the number of keyspaces. The pool is mapped at the
    /// whole budget and gives back what hash stores take as it turns over (see
    /// [`DbStats::tree_memory_bytes`]). (What lies outside the budget does grow: each
    /// open tree has its own mapping table and inner nodes, a few bytes per leaf page
    /// plus some hundreds of KiB; each hash store its threads.)
    pub config: Config,
    /// The durability of [`Tree::insert`] and [`Tree::delete`] on the database's
    /// keyspaces; [`Tree::insert_with`] and [`Db::write_with`] choose per write. Default
    /// [`Durability::Logged`].
    pub durability: Durability,
    /// How often the background flusher makes [`Durability::Logged`] writes durable. A
    /// crash loses at most about twice this of acknowledged logged writes: a record
    /// waits up to one interval for the flusher's next group, and then that group's
    /// write; a logged write that finds an older record waiting longer than twice the
    /// interval waits for the disk itself, so the bound holds when the flusher is
    /// starved of CPU. Default 5 ms.
    pub flush_interval: Duration,
    /// A checkpoint is taken in the background once the log has grown by this many
    /// bytes since the last one began; 0 turns the trigger off. A background
    /// checkpoint leaves pages written since the previous one began in memory, their
    /// writes in the log, so recovery replays at most about twice this much log (three
    /// times if it must fall back to the older checkpoint); after [`Db::checkpoint`]
    /// or a clean close, only what follows it. Default 64 MiB.
    pub checkpoint_log_bytes: u64,
    /// A checkpoint is taken in the background this long after the last one, if
    /// anything was written since (logged or not: so an unlogged write is captured,
    /// and survives a crash, within about this long); `None` turns the trigger off.
    /// Default 60 s.
    ///
    /// While either trigger is on, a hash store whose kept checkpoints hold more of one
    /// of its logs on disk (below what compaction freed) than that log's disk budget
    /// also brings a background checkpoint, so that unlogged writes, which grow no log,
    /// do not keep freed log segments on disk indefinitely.
    pub checkpoint_interval: Option<Duration>,
    /// Take a checkpoint when the `Db` is dropped, so that the next open replays no log.
    /// Default `true`.
    pub checkpoint_on_close: bool,
    /// Create the directory and an empty database if there is none. Default `true`.
    pub create: bool,
    /// Size of one log segment file. Default 16 MiB.
    pub log_segment_bytes: u64,
    /// Open a database whose log does not reach as far as its checkpoints say it must
    /// (log segments deleted or lost), as the older state the files still hold, instead
    /// of failing the open. Default `false`: such an open is an error naming the missing
    /// range of the log, and nothing is written. When it is `true`,
    /// [`RecoveryStats::rolled_back`] says what was missing.
    pub accept_rollback: bool,
}

impl Default for DbOptions {
    fn default() -> Self {
        DbOptions {
            config: Config::default(),
            durability: Durability::Logged,
            flush_interval: Duration::from_millis(5),
            checkpoint_log_bytes: 64 << 20,
            checkpoint_interval: Some(Duration::from_secs(60)),
            checkpoint_on_close: true,
            create: true,
            log_segment_bytes: 16 << 20,
            accept_rollback: false,
        }
    }
}

impl DbOptions {
    /// Sets [`DbOptions::config`].
    pub fn config(mut self, config: Config) -> DbOptions {
        self.config = config;
        self
    }

    /// Sets [`DbOptions::durability`].
    pub fn durability(mut self, durability: Durability) -> DbOptions {
        self.durability = durability;
        self
    }

    /// Sets [`DbOptions::flush_interval`].
    pub fn flush_interval(mut self, interval: Duration) -> DbOptions {
        self.flush_interval = interval;
        self
    }

    /// Sets [`DbOptions::checkpoint_log_bytes`].
    pub fn checkpoint_log_bytes(mut self, bytes: u64) -> DbOptions {
        self.checkpoint_log_bytes = bytes;
        self
    }

    /// Sets [`DbOptions::checkpoint_interval`].
    pub fn checkpoint_interval(mut self, interval: Option<Duration>) -> DbOptions {
        self.checkpoint_interval = interval;
        self
    }

    /// Sets [`DbOptions::checkpoint_on_close`].
    pub fn checkpoint_on_close(mut self, on: bool) -> DbOptions {
        self.checkpoint_on_close = on;
        self
    }

    /// Sets [`DbOptions::create`].
    pub fn create(mut self, create: bool) -> DbOptions {
        self.create = create;
        self
    }

    /// Sets [`DbOptions::log_segment_bytes`].
    pub fn log_segment_bytes(mut self, bytes: u64) -> DbOptions {
        self.log_segment_bytes = bytes;
        self
    }

    /// Sets [`DbOptions::accept_rollback`].
    pub fn accept_rollback(mut self, accept: bool) -> DbOptions {
        self.accept_rollback = accept;
        self
    }

    pub(super) fn validate(&self) -> Result<()> {
        self.config.validate()?;
        if self.flush_interval.is_zero() || self.flush_interval > Duration::from_secs(60) {
            return Err(Error::InvalidConfig(format!(
                "flush_interval {:?} must be above zero and at most 60 s",
                self.flush_interval
            )));
        }
        if self.log_segment_bytes < 64 << 10 || self.log_segment_bytes > 1 << 30 {
            return Err(Error::InvalidConfig(format!(
                "log_segment_bytes {} must be between 64 KiB and 1 GiB",
                self.log_segment_bytes
            )));
        }
        if self.checkpoint_interval.is_some_and(|i| i.is_zero()) {
            return Err(Error::InvalidConfig(
                "checkpoint_interval must be above zero (None turns it off)".into(),
            ));
        }
        Ok(())
    }
}
