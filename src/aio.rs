//! Async reads on a tokio-uring runtime (feature `tokio-uring`): [`AsyncTree`] for a
//! [`Tree`](crate::Tree), [`AsyncHashStore`] for a [`HashStore`](crate::HashStore).
//!
//! For applications that already run a tokio-uring runtime (one thread, one ring, many
//! tasks): a read that finds what it needs in memory answers at once; a read that needs
//! the disk submits the read on the runtime's ring and awaits it, so the thread runs
//! other tasks meanwhile. Writes stay synchronous.

pub use crate::hash::aio::AsyncHashStore;
pub use crate::tree::aio::{AsyncRange, AsyncTree};
