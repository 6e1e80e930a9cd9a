//! placeholder
use std::fmt;
/// placeholder
#[derive(Debug, Clone)]
pub struct CorruptPage {
    /// p
    pub page: u64,
    /// r
    pub reason: String,
}
impl fmt::Display for CorruptPage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.reason)
    }
}
impl std::error::Error for CorruptPage {}
/// placeholder
#[derive(Debug, Clone)]
pub struct IncompatibleFile {
    /// r
    pub reason: String,
}
impl fmt::Display for IncompatibleFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.reason)
    }
}
impl std::error::Error for IncompatibleFile {}
