//! The crate's error type.
//!
//! Operating errors — IO failures, corrupt or foreign files, bad input — are values of
//! [`Error`]. Bugs are assertions. Internal restart signals of optimistic concurrency
//! never appear here.

use std::fmt;
use std::io;

use crate::pool::PoolError;
use crate::storage::{CorruptPage, IncompatibleFile, StorePoisoned};

/// Shorthand for `std::result::Result<T, bfdb::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a call to bfdb that is not a bug.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The operating system reported an IO error.
    Io(io::Error),
    /// A page read from storage failed its checksum or its layout validation.
    Corrupted {
        /// The page number at which the corruption was found.
        page: u64,
        /// What was wrong with it.
        reason: String,
    },
    /// The file is not a bfdb file, or was written by an incompatible format version.
    Incompatible {
        /// What was found instead of what this build understands.
        reason: String,
    },
    /// An empty key was given where a key is required.
    EmptyKey,
    /// A key is longer than the configured limit.
    KeyTooLarge {
        /// Length of the key that was given.
        len: usize,
        /// The largest accepted key length.
        max: usize,
    },
    /// A value is longer than the configured limit.
    ValueTooLarge {
        /// Length of the value that was given.
        len: usize,
        /// The largest accepted value length.
        max: usize,
    },
    /// A configuration value is out of range.
    InvalidConfig(String),
    /// The operation is not supported by this release (the message says what).
    Unsupported(String),
    /// A write, delete or flush was refused because an earlier write or sync of the same
    /// store failed: rather than guess what reached the disk, the store takes no more
    /// writes.
    ///
    /// What still works on a [`Tree`](crate::Tree): point reads (`get`, `get_many`), which
    /// return every write acknowledged before the failure, as its dirty mini-pages stay
    /// in memory; and scans. Nothing makes the tree writable again. In a
    /// [`Db`](crate::Db), drop the database (and every handle to its trees) and open it
    /// again: recovery brings back every write its durability level promised, from the
    /// last checkpoint and the log. A tree on its own cannot be reopened: build a new one
    /// from the data's source of truth.
    ///
    /// A keyspace of a [`Db`](crate::Db) shares its memory with the other keyspaces,
    /// which must not stall behind records that can never be written: its unwritten
    /// records move to the pool's tail while there is room, and once there is none they
    /// are dropped from memory. From then on its reads that would need a leaf page are
    /// refused with this error too, rather than answer from a page that misses them;
    /// reopening the database recovers them.
    ///
    /// A [`PageStore`](crate::storage::PageStore) used directly keeps serving reads too;
    /// a [`FileStore`](crate::storage::FileStore) opened again continues from what its
    /// last successful sync made durable.
    Poisoned {
        /// The failure that poisoned the store.
        cause: String,
    },
    /// A file of a database directory failed validation: a checksum, a magic number, a
    /// length or a field out of range. The file is left as it was.
    CorruptFile {
        /// The file.
        path: std::path::PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// Another [`Db`](crate::Db) — in this process or another — has the database
    /// directory open: its lock file is held.
    Locked {
        /// The lock file.
        path: std::path::PathBuf,
    },
    /// The keyspace was dropped from its [`Db`](crate::Db); handles to it take no more
    /// writes.
    KeyspaceDropped {
        /// The keyspace's name.
        name: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "io error: {e}"),
            Error::Corrupted { page, reason } => write!(f, "page {page} is corrupted: {reason}"),
            Error::Incompatible { reason } => write!(f, "incompatible file: {reason}"),
            Error::EmptyKey => write!(f, "empty keys are not allowed"),
            Error::KeyTooLarge { len, max } => {
                write!(f, "key of {len} bytes exceeds the limit of {max} bytes")
            }
            Error::ValueTooLarge { len, max } => {
                write!(f, "value of {len} bytes exceeds the limit of {max} bytes")
            }
            Error::InvalidConfig(what) => write!(f, "invalid configuration: {what}"),
            Error::Unsupported(what) => write!(f, "unsupported: {what}"),
            Error::Poisoned { cause } => write!(
                f,
                "writes are refused since an earlier write or sync failed ({cause}); reads \
                 still work unless a database keyspace's unwritten records had to leave \
                 memory; to write again, reopen the database (recovery restores what was \
                 durable)"
            ),
            Error::CorruptFile { path, reason } => {
                write!(f, "{} does not validate: {reason}", path.display())
            }
            Error::Locked { path } => write!(
                f,
                "the database is open elsewhere: {} is locked by another Db (this process \
                 or another)",
                path.display()
            ),
            Error::KeyspaceDropped { name } => {
                write!(
                    f,
                    "keyspace {name:?} was dropped; its handles take no writes"
                )
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    /// Lifts the storage layer's typed errors, which travel inside `io::Error`, back into
    /// their own variants so callers can match on them.
    fn from(e: io::Error) -> Self {
        if let Some(inner) = e.get_ref() {
            if let Some(c) = inner.downcast_ref::<CorruptPage>() {
                return Error::Corrupted {
                    page: c.page,
                    reason: c.reason.clone(),
                };
            }
            if let Some(c) = inner.downcast_ref::<IncompatibleFile>() {
                return Error::Incompatible {
                    reason: c.reason.clone(),
                };
            }
            if let Some(c) = inner.downcast_ref::<StorePoisoned>() {
                return Error::Poisoned {
                    cause: c.cause.clone(),
                };
            }
        }
        Error::Io(e)
    }
}

impl From<PoolError> for Error {
    /// A bad pool configuration is a bad configuration of the crate; a region the OS
    /// would not map is an IO error of the same kind, whose message says what was mapped.
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::InvalidConfig(what) => Error::InvalidConfig(what),
            PoolError::Map {
                capacity_bytes,
                source,
            } => {
                let kind = source.kind();
                Error::Io(io::Error::new(
                    kind,
                    PoolError::Map {
                        capacity_bytes,
                        source,
                    },
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{PageNo, corrupt_page, incompatible_file, store_poisoned};

    #[test]
    fn storage_errors_keep_their_meaning() {
        match Error::from(corrupt_page(PageNo(7), "checksum mismatch")) {
            Error::Corrupted { page, reason } => {
                assert_eq!(page, 7);
                assert!(reason.contains("checksum"));
            }
            other => panic!("expected Corrupted, got {other:?}"),
        }
        assert!(matches!(
            Error::from(incompatible_file("format version 9")),
            Error::Incompatible { reason } if reason.contains('9')
        ));
        assert!(matches!(
            Error::from(store_poisoned("EIO on write")),
            Error::Poisoned { cause } if cause.contains("EIO")
        ));
        let plain = io::Error::new(io::ErrorKind::NotFound, "gone");
        assert!(matches!(Error::from(plain), Error::Io(e) if e.kind() == io::ErrorKind::NotFound));
    }

    #[test]
    fn pool_errors_keep_their_meaning() {
        let bad = crate::pool::PoolConfig {
            copy_on_access_percent: 101,
            ..crate::pool::PoolConfig::default()
        };
        let err = Error::from(bad.validate().unwrap_err());
        assert!(
            matches!(&err, Error::InvalidConfig(what) if what.contains("copy_on_access_percent")),
            "{err:?}"
        );
        assert!(
            err.to_string().starts_with("invalid configuration: pool "),
            "{err}"
        );
        let map = PoolError::Map {
            capacity_bytes: 4096,
            source: io::Error::from_raw_os_error(libc::ENOMEM),
        };
        match Error::from(map) {
            Error::Io(e) => {
                assert_eq!(e.kind(), io::ErrorKind::OutOfMemory);
                assert!(e.to_string().contains("4096 bytes"), "{e}");
            }
            other => panic!("expected Io, got {other:?}"),
        }
    }
}
