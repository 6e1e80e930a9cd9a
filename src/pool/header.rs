//! The 8-byte block header of the circular buffer.
//!
//! Every block in the region starts with one header word, read and written only through
//! atomics while the block exists. Bit layout (of the native `u64`, which never leaves
//! memory):
//!
//! ```text
//!  63                              32 31        24 23                          0
//! +----------------------------------+------------+-----------------------------+
//! |  lap = (logical address / capacity) as u32    |  state  |  payload size (bytes)  |
//! +----------------------------------+------------+-----------------------------+
//! ```
//!
//! A header word of zero means "not yet published": the tail was bumped past this
//! address but the allocating thread has not written the header yet. No valid header
//! is zero because no state has the value zero.

/// Size of a block header, in bytes. Payloads start right after it.
pub(crate) const HEADER_SIZE_BYTES: u64 = 8;

/// The largest payload size the 24-bit size field can hold.
pub(crate) const MAX_PAYLOAD_FIELD_BYTES: u32 = (1 << 24) - 1;

const SIZE_MASK: u64 = (1 << 24) - 1;
const STATE_SHIFT: u32 = 24;
const STATE_MASK: u64 = 0xff;
const LAP_SHIFT: u32 = 32;

/// The life-cycle state of a block. See `docs/design.md` (the pool section) for who performs each
/// transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum State {
    /// Handed to a client by `alloc`, not yet published. Never evicted.
    Reserved = 1,
    /// Published by its client; may be evicted through the callback.
    Live = 2,
    /// Freed and linked into its size class's free list.
    Free = 3,
    /// Freed but not listed; waits for the evictor to reclaim it.
    Dead = 4,
    /// Claimed by an evictor: the callback runs (or a reclaim is under way).
    Evicting = 5,
    /// Payload zeroed by the evictor; waits for the head to move past it.
    Reclaimed = 6,
    /// Filler from a block's end to the region's physical end, so no block wraps.
    Pad = 7,
}

impl State {
    fn from_bits(bits: u64) -> Option<State> {
        Some(match bits {
            1 => State::Reserved,
            2 => State::Live,
            3 => State::Free,
            4 => State::Dead,
            5 => State::Evicting,
            6 => State::Reclaimed,
            7 => State::Pad,
            _ => return None,
        })
    }
}

/// One header word, unpacked lazily.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header(pub(crate) u64);

impl Header {
    /// The "not yet published" word.
    #[cfg(test)]
    pub(crate) const UNPUBLISHED: Header = Header(0);

    /// Packs a header. `payload_size_bytes` must fit the 24-bit field.
    pub(crate) fn new(payload_size_bytes: u32, state: State, lap: u32) -> Header {
        assert!(payload_size_bytes <= MAX_PAYLOAD_FIELD_BYTES);
        Header(
            u64::from(payload_size_bytes)
                | (u64::from(state as u8) << STATE_SHIFT)
                | (u64::from(lap) << LAP_SHIFT),
        )
    }

    /// The payload size in bytes (excluding this header).
    pub(crate) fn payload_size_bytes(self) -> u32 {
        // The mask keeps 24 bits, which always fit a u32.
        (self.0 & SIZE_MASK) as u32
    }

    /// The block's total footprint in the region: header plus payload.
    pub(crate) fn block_size_bytes(self) -> u64 {
        HEADER_SIZE_BYTES + u64::from(self.payload_size_bytes())
    }

    /// The state, or `None` for the unpublished word or a corrupt state byte.
    pub(crate) fn state(self) -> Option<State> {
        State::from_bits((self.0 >> STATE_SHIFT) & STATE_MASK)
    }

    /// The lap the block was allocated in, truncated to 32 bits.
    pub(crate) fn lap(self) -> u32 {
        // The shift leaves exactly 32 bits.
        (self.0 >> LAP_SHIFT) as u32
    }

    /// The same block (size and lap) in another state.
    pub(crate) fn with_state(self, state: State) -> Header {
        Header((self.0 & !(STATE_MASK << STATE_SHIFT)) | (u64::from(state as u8) << STATE_SHIFT))
    }

    /// True for the zero word written before the allocating thread publishes a header.
    pub(crate) fn is_unpublished(self) -> bool {
        self.0 == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_round_trips_every_field() {
        let states = [
            State::Reserved,
            State::Live,
            State::Free,
            State::Dead,
            State::Evicting,
            State::Reclaimed,
            State::Pad,
        ];
        for &state in &states {
            for &size in &[0u32, 8, 64, 4096, MAX_PAYLOAD_FIELD_BYTES] {
                for &lap in &[0u32, 1, 0x8000_0000, u32::MAX] {
                    let h = Header::new(size, state, lap);
                    assert_eq!(h.payload_size_bytes(), size);
                    assert_eq!(h.state(), Some(state));
                    assert_eq!(h.lap(), lap);
                    assert!(!h.is_unpublished(), "a packed header must never be zero");
                    assert_eq!(h.block_size_bytes(), u64::from(size) + 8);
                }
            }
        }
    }

    #[test]
    fn with_state_keeps_size_and_lap() {
        let h = Header::new(4096, State::Live, 0xdead_beef);
        let e = h.with_state(State::Evicting);
        assert_eq!(e.state(), Some(State::Evicting));
        assert_eq!(e.payload_size_bytes(), 4096);
        assert_eq!(e.lap(), 0xdead_beef);
        assert_ne!(h, e);
        assert_eq!(e.with_state(State::Live), h);
    }

    #[test]
    fn zero_word_is_unpublished_and_has_no_state() {
        assert!(Header::UNPUBLISHED.is_unpublished());
        assert_eq!(Header::UNPUBLISHED.state(), None);
        assert_eq!(Header(0xff << STATE_SHIFT).state(), None);
    }

    #[test]
    #[should_panic]
    fn oversized_payload_is_a_bug() {
        let _ = Header::new(MAX_PAYLOAD_FIELD_BYTES + 1, State::Live, 0);
    }
}
